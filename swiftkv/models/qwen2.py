"""Qwen2 with SwiftKV: a diff on transformers' Qwen2 classes (config keys and weight names of the reference)."""

from __future__ import annotations

from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention, Qwen2DecoderLayer, Qwen2ForCausalLM, Qwen2Model

from swiftkv.configuration import Qwen2SwiftKVConfig
from swiftkv.models.common import (
    SwiftKVAttentionMixin,
    SwiftKVForCausalLMMixin,
    SwiftKVModelMixin,
)


class Qwen2SwiftKVAttention(SwiftKVAttentionMixin, Qwen2Attention):
    def __init__(self, config: Qwen2SwiftKVConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self._init_swiftkv(config, layer_idx)


class Qwen2SwiftKVDecoderLayer(Qwen2DecoderLayer):
    def __init__(self, config: Qwen2SwiftKVConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = Qwen2SwiftKVAttention(config, layer_idx)  # SwiftKV


class Qwen2SwiftKVModel(SwiftKVModelMixin, Qwen2Model):
    config_class = Qwen2SwiftKVConfig

    def __init__(self, config: Qwen2SwiftKVConfig):
        super().__init__(config)
        self._init_swiftkv(config, Qwen2SwiftKVDecoderLayer)
        self.post_init()


class Qwen2SwiftKVForCausalLM(SwiftKVForCausalLMMixin, Qwen2ForCausalLM):
    config_class = Qwen2SwiftKVConfig

    def __init__(self, config: Qwen2SwiftKVConfig):
        super().__init__(config)
        self.model = Qwen2SwiftKVModel(config)  # SwiftKV
        self.post_init()
