"""Mistral with SwiftKV: a diff on transformers' Mistral classes (config keys and weight names of the reference)."""

from __future__ import annotations

from transformers.models.mistral.modeling_mistral import MistralAttention, MistralDecoderLayer, MistralForCausalLM, MistralModel

from swiftkv.configuration import MistralSwiftKVConfig
from swiftkv.models.common import (
    SwiftKVAttentionMixin,
    SwiftKVForCausalLMMixin,
    SwiftKVModelMixin,
)


class MistralSwiftKVAttention(SwiftKVAttentionMixin, MistralAttention):
    def __init__(self, config: MistralSwiftKVConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self._init_swiftkv(config, layer_idx)


class MistralSwiftKVDecoderLayer(MistralDecoderLayer):
    def __init__(self, config: MistralSwiftKVConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = MistralSwiftKVAttention(config, layer_idx)  # SwiftKV


class MistralSwiftKVModel(SwiftKVModelMixin, MistralModel):
    config_class = MistralSwiftKVConfig

    def __init__(self, config: MistralSwiftKVConfig):
        super().__init__(config)
        self._init_swiftkv(config, MistralSwiftKVDecoderLayer)
        self.post_init()


class MistralSwiftKVForCausalLM(SwiftKVForCausalLMMixin, MistralForCausalLM):
    config_class = MistralSwiftKVConfig

    def __init__(self, config: MistralSwiftKVConfig):
        super().__init__(config)
        self.model = MistralSwiftKVModel(config)  # SwiftKV
        self.post_init()
