"""The model families the SwiftKV vLLM plugin serves (Llama, Qwen2, Qwen3): what differs between them (their own
decoder layer for layers < l, the parts of a later layer), the (l, g) a checkpoint is served with, and the one-line
refusals of what the plugin does not implement. The model itself is ``swiftkv.vllm_plugin.model``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaMLP
from vllm.model_executor.models.qwen2 import Qwen2DecoderLayer, Qwen2MLP
from vllm.model_executor.models.qwen3 import Qwen3DecoderLayer
from vllm.transformers_utils.config import set_default_rope_theta

from swiftkv.errors import SwiftKVError
from swiftkv.vllm_plugin import tensor_parallel_message


@dataclass(frozen=True)
class Family:
    """What differs between the families: their own decoder layer (layers < l) and the parts of a later layer."""

    name: str
    teacher_layer: Callable[[VllmConfig, object, str], nn.Module]  # (vllm_config, hf_config, prefix)
    mlp: Callable[[object, object, str], nn.Module]  # (hf_config, quant_config, prefix)
    qkv_bias: Callable[[object], bool]
    o_bias: Callable[[object], bool]
    head_dim: Callable[[object], int]
    prepare: Callable[[object], None] = lambda config: None
    rope_kwargs: Callable[[object], dict] = lambda config: {}
    qk_norm: bool = False  # Qwen3: per-head RMSNorm of queries and keys before RoPE (q/k_norm_swiftkv in layers >= l)


def _llama_attention_bias(config) -> bool:
    bias = getattr(config, "attention_bias", False) or getattr(config, "bias", False)
    return getattr(config, "qkv_bias", bias)


LLAMA = Family(
    name="llama",
    teacher_layer=lambda vllm_config, config, prefix: LlamaDecoderLayer(vllm_config=vllm_config, prefix=prefix,
                                                                        config=config),
    mlp=lambda config, quant_config, prefix: LlamaMLP(
        hidden_size=config.hidden_size, intermediate_size=config.intermediate_size, hidden_act=config.hidden_act,
        quant_config=quant_config, bias=getattr(config, "mlp_bias", False), prefix=prefix),
    qkv_bias=_llama_attention_bias,
    o_bias=lambda config: bool(getattr(config, "attention_bias", False) or getattr(config, "bias", False)),
    head_dim=lambda config: getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
    rope_kwargs=lambda config: {"is_neox_style": True},
)

QWEN2 = Family(
    name="qwen2",
    teacher_layer=lambda vllm_config, config, prefix: Qwen2DecoderLayer(
        config=config, cache_config=vllm_config.cache_config, quant_config=vllm_config.quant_config, prefix=prefix),
    mlp=lambda config, quant_config, prefix: Qwen2MLP(
        hidden_size=config.hidden_size, intermediate_size=config.intermediate_size, hidden_act=config.hidden_act,
        quant_config=quant_config, prefix=prefix),
    qkv_bias=lambda config: True,
    o_bias=lambda config: False,
    head_dim=lambda config: config.hidden_size // config.num_attention_heads,
    prepare=lambda config: set_default_rope_theta(config, default_theta=1000000),
)


QWEN3 = Family(
    name="qwen3",
    teacher_layer=lambda vllm_config, config, prefix: Qwen3DecoderLayer(
        config=config, cache_config=vllm_config.cache_config, quant_config=vllm_config.quant_config, prefix=prefix),
    mlp=QWEN2.mlp,  # vLLM's Qwen3 uses Qwen2's MLP
    qkv_bias=lambda config: bool(getattr(config, "attention_bias", False)),
    o_bias=lambda config: bool(getattr(config, "attention_bias", False)),
    head_dim=lambda config: getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
    prepare=lambda config: set_default_rope_theta(config, default_theta=1000000),
    qk_norm=True,
)


def swiftkv_layout(config) -> tuple[int, int]:
    """(l, g) the engine serves: a checkpoint with ``swiftkv: false`` is served as its teacher (l = L)."""
    L = config.num_hidden_layers
    if not getattr(config, "swiftkv", False):
        return L, 1
    return config.num_key_value_layers, config.key_value_group_size


def check_supported(config, family: Family, vllm_config: VllmConfig) -> None:
    """Reject what the plugin does not implement, with one line each."""
    l, _ = swiftkv_layout(config)
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        raise SwiftKVError("the SwiftKV vLLM plugin does not support pipeline parallelism; use "
                           "--pipeline-parallel-size 1")
    if getattr(config, "swiftkv_key_value_heads", None):
        raise SwiftKVError("swiftkv_key_value_heads (an MQA student) is not supported by the SwiftKV vLLM plugin; "
                           "serve it with transformers")
    tp_message = tensor_parallel_message(config.num_key_value_heads,
                                         vllm_config.parallel_config.tensor_parallel_size)
    if l < config.num_hidden_layers and tp_message:  # the config hook stops the engine first; this is a backstop
        raise SwiftKVError(tp_message)
    if getattr(config, "qk_norm", False):
        raise SwiftKVError(f"{family.name} checkpoints with qk_norm are not supported by the SwiftKV vLLM plugin")
    types = getattr(config, "layer_types", None) or []
    later = types[l:]
    windowed = getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in later)
    if l < config.num_hidden_layers and windowed:
        raise SwiftKVError("sliding-window attention in the layers >= num_key_value_layers is not supported by the "
                           "SwiftKV vLLM plugin")
