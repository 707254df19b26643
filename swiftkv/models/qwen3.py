"""Qwen3 with SwiftKV: a diff on transformers' Qwen3 classes. Qwen3 normalises each query and key head (``q_norm``,
``k_norm``) before RoPE; the SwiftKV path has its own, named as in Snowflake's Qwen3 code: ``q_norm_swiftkv`` in every
layer >= l, ``k_norm_swiftkv`` beside ``k_proj_swiftkv`` in each AcrossKV group leader (swiftkv.models.common)."""

from __future__ import annotations

from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3DecoderLayer, Qwen3ForCausalLM, Qwen3Model

from swiftkv.configuration import Qwen3SwiftKVConfig
from swiftkv.models.common import (
    SwiftKVAttentionMixin,
    SwiftKVForCausalLMMixin,
    SwiftKVModelMixin,
)


class Qwen3SwiftKVAttention(SwiftKVAttentionMixin, Qwen3Attention):
    def __init__(self, config: Qwen3SwiftKVConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self._init_swiftkv(config, layer_idx)


class Qwen3SwiftKVDecoderLayer(Qwen3DecoderLayer):
    def __init__(self, config: Qwen3SwiftKVConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = Qwen3SwiftKVAttention(config, layer_idx)  # SwiftKV


class Qwen3SwiftKVModel(SwiftKVModelMixin, Qwen3Model):
    config_class = Qwen3SwiftKVConfig

    def __init__(self, config: Qwen3SwiftKVConfig):
        super().__init__(config)
        self._init_swiftkv(config, Qwen3SwiftKVDecoderLayer)
        self.post_init()


class Qwen3SwiftKVForCausalLM(SwiftKVForCausalLMMixin, Qwen3ForCausalLM):
    config_class = Qwen3SwiftKVConfig

    def __init__(self, config: Qwen3SwiftKVConfig):
        super().__init__(config)
        self.model = Qwen3SwiftKVModel(config)  # SwiftKV
        self.post_init()
