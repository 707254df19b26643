"""Llama with SwiftKV: a diff on transformers' Llama classes (config keys and weight names of the reference)."""

from __future__ import annotations

from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel

from swiftkv.configuration import LlamaSwiftKVConfig
from swiftkv.models.common import (
    SwiftKVAttentionMixin,
    SwiftKVForCausalLMMixin,
    SwiftKVModelMixin,
)


class LlamaSwiftKVAttention(SwiftKVAttentionMixin, LlamaAttention):
    def __init__(self, config: LlamaSwiftKVConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self._init_swiftkv(config, layer_idx)


class LlamaSwiftKVDecoderLayer(LlamaDecoderLayer):
    def __init__(self, config: LlamaSwiftKVConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = LlamaSwiftKVAttention(config, layer_idx)  # SwiftKV


class LlamaSwiftKVModel(SwiftKVModelMixin, LlamaModel):
    config_class = LlamaSwiftKVConfig

    def __init__(self, config: LlamaSwiftKVConfig):
        super().__init__(config)
        self._init_swiftkv(config, LlamaSwiftKVDecoderLayer)
        self.post_init()


class LlamaSwiftKVForCausalLM(SwiftKVForCausalLMMixin, LlamaForCausalLM):
    config_class = LlamaSwiftKVConfig

    def __init__(self, config: LlamaSwiftKVConfig):
        super().__init__(config)
        self.model = LlamaSwiftKVModel(config)  # SwiftKV
        self.post_init()
