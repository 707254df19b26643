"""swiftkv: SwiftKV (SingleInputKV + AcrossKV + distillation) for transformers models.

``import swiftkv`` registers the SwiftKV model types (``llama_swiftkv``, ``mistral_swiftkv``, ``qwen2_swiftkv``,
``qwen3_swiftkv``, ``deepseek_v2_swiftkv``)
with transformers' Auto classes, so ``AutoModelForCausalLM.from_pretrained`` loads SwiftKV checkpoints. The
registration happens when transformers' Auto classes are first imported (at once if they already are), so that
``import swiftkv`` itself stays cheap (``swiftkv._autoregister``); ``swiftkv.register()`` forces it.

The configs need nothing but transformers' config classes; the model classes are diffs on one transformers
version (see pyproject.toml). Where they cannot be imported (another transformers, e.g. the vLLM venv's), only the
configs are registered: enough for the vLLM plugin (``swiftkv.vllm_plugin``), which has its own model classes.
"""

from swiftkv import _autoregister
from swiftkv.errors import SwiftKVError

__version__ = "0.1.0"

_autoregister.install()


def register_configs() -> None:
    """Register the SwiftKV configs with ``AutoConfig`` now (idempotent)."""
    from swiftkv.configuration import register_configs as _register_configs

    _register_configs()


def register() -> None:
    """Register the SwiftKV configs and model classes with transformers' Auto classes now (idempotent)."""
    try:
        from swiftkv.models import register as _register_models
    except ImportError as err:  # a transformers whose internals the model classes were not written for
        raise SwiftKVError(f"the SwiftKV transformers model classes cannot be imported here ({err}); "
                           "use the transformers version pinned in pyproject.toml") from None
    _register_models()


def __getattr__(name: str):
    # conversion imports the model classes: loaded on first use, so configs-only environments can import swiftkv
    if name in ("convert_to_swiftkv", "set_trainable"):
        from swiftkv.models import convert

        return getattr(convert, name)
    raise AttributeError(f"module 'swiftkv' has no attribute {name!r}")


__all__ = ["convert_to_swiftkv", "register", "register_configs", "set_trainable", "SwiftKVError", "__version__"]
