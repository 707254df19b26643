"""DeepSeek-V2 with SwiftKV: multi-head latent attention (MLA) rewired, MoE layers untouched.

MLA caches, per layer and token, one compressed latent (``kv_a_proj_with_mqa`` -> ``kv_a_layernorm``, kv_lora_rank
wide) and one shared RoPE key (qk_rope_head_dim wide); ``kv_b_proj`` expands the latent into every head's key (no
position part) and value. In the student every layer >= l takes that latent and RoPE key from x = norm_swiftkv(h_l)
through its AcrossKV group leader's ``kv_a_proj_with_mqa_swiftkv`` / ``kv_a_layernorm_swiftkv`` and expands them with
the leader's ``kv_b_proj_swiftkv``; its queries come from its own stream through ``q_proj_swiftkv`` (or, with a query
LoRA, ``q_a_proj_swiftkv`` -> ``q_a_layernorm_swiftkv`` -> ``q_b_proj_swiftkv``). These are the names of Snowflake's
``deepseek_v2_swiftkv`` model. The cache keeps the latent form (transformers' own MLA cache), one entry per group.

Checkpoints hold the routed experts one by one (``mlp.experts.N.{gate,up,down}_proj.weight``), as transformers itself
writes ``deepseek_v2`` and as Snowflake's model reads them: transformers' checkpoint conversion for ``deepseek_v2``
(experts stacked in memory, per expert on disk) applies to ``deepseek_v2_swiftkv`` too (``use_expert_layout``).
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.deepseek_v2.modeling_deepseek_v2 import (
    DeepseekV2Attention,
    DeepseekV2DecoderLayer,
    DeepseekV2ForCausalLM,
    DeepseekV2Model,
    DeepseekV2RMSNorm,
    apply_rotary_emb,
    eager_attention_forward,
)

from swiftkv.configuration import DeepseekV2SwiftKVConfig
from swiftkv.models.common import SwiftKVAttentionMixin, SwiftKVForCausalLMMixin, SwiftKVModelMixin

MLA_QUERY = ("q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj")  # the teacher's query path (with or without LoRA)
MLA_KV = ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj")  # the teacher's latent K/V path


@functools.cache
def use_expert_layout() -> None:
    """Give ``deepseek_v2_swiftkv`` the checkpoint conversion transformers has for ``deepseek_v2`` (once). Called when
    a model is built, not at import: transformers builds its table of conversions (~0.4 s) on first use."""
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping,
        register_checkpoint_conversion_mapping,
    )

    register_checkpoint_conversion_mapping(DeepseekV2SwiftKVConfig.model_type,
                                           get_checkpoint_conversion_mapping("deepseek_v2"), overwrite=True)


def _rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """DeepSeek's complex RoPE on one tensor (B, heads, S, D) with freqs (B, S, D/2)."""
    return apply_rotary_emb(x, x, freqs_cis)[0]


class DeepseekV2SwiftKVAttention(SwiftKVAttentionMixin, DeepseekV2Attention):
    def __init__(self, config: DeepseekV2SwiftKVConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self._init_swiftkv(config, layer_idx)

    def _init_swiftkv(self, config, layer_idx: int) -> None:
        l, g = config.num_key_value_layers, config.key_value_group_size
        if layer_idx < l:
            return
        heads_qk = self.num_heads * self.qk_head_dim
        if self.q_lora_rank is None:
            self.q_proj_swiftkv = nn.Linear(self.hidden_size, heads_qk, bias=False)
        else:
            self.q_a_proj_swiftkv = nn.Linear(self.hidden_size, self.q_lora_rank, bias=config.attention_bias)
            self.q_a_layernorm_swiftkv = DeepseekV2RMSNorm(self.q_lora_rank)
            self.q_b_proj_swiftkv = nn.Linear(self.q_lora_rank, heads_qk, bias=False)
        if (layer_idx - l) % g == 0:  # AcrossKV group leader: the group's latent K/V path
            self.kv_a_proj_with_mqa_swiftkv = nn.Linear(
                self.hidden_size, self.kv_lora_rank + self.qk_rope_head_dim, bias=config.attention_bias)
            self.kv_a_layernorm_swiftkv = DeepseekV2RMSNorm(self.kv_lora_rank)
            self.kv_b_proj_swiftkv = nn.Linear(
                self.kv_lora_rank, self.num_heads * (self.qk_nope_head_dim + self.v_head_dim), bias=False)

    # -- the group leader's latent K/V from x = norm_swiftkv(h_l) ---------------------------------------------------

    def swiftkv_latents(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(latent, RoPE key), each (B, 1, S, width): what MLA caches, from x = norm_swiftkv(h_l)."""
        batch, seq = x.shape[:2]
        kv_nope, k_pe = torch.split(self.kv_a_proj_with_mqa_swiftkv(x), [self.kv_lora_rank, self.qk_rope_head_dim],
                                    dim=-1)
        latent = self.kv_a_layernorm_swiftkv(kv_nope).view(batch, 1, seq, self.kv_lora_rank)
        k_pe = _rope(k_pe.view(batch, 1, seq, self.qk_rope_head_dim), freqs_cis)
        return latent, k_pe

    def swiftkv_expand(self, latent: torch.Tensor, k_pe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every head's key and value (B, heads, S, D) from the cached latent and RoPE key, through kv_b_proj_swiftkv."""
        batch, _, seq, _ = latent.shape
        kv = self.kv_b_proj_swiftkv(latent).view(batch, seq, -1, self.qk_nope_head_dim + self.v_head_dim).transpose(1, 2)
        k_nope, value = torch.split(kv, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        key = torch.cat([k_nope, k_pe.expand(-1, k_nope.shape[1], -1, -1)], dim=-1)
        return key, value

    def forward(self, hidden_states, attention_mask=None, cache=None, position_embeddings=None,
                swiftkv_key_value=None, **kwargs):
        if swiftkv_key_value is None:  # teacher path, and every layer < l
            return DeepseekV2Attention.forward(self, hidden_states, attention_mask=attention_mask, cache=cache,
                                               position_embeddings=position_embeddings, **kwargs)
        # SwiftKV: the query from this layer's own stream; K/V expanded from the leader's latent (made at the boundary)
        batch, seq = hidden_states.shape[:-1]
        if self.q_lora_rank is None:
            q = self.q_proj_swiftkv(hidden_states)
        else:
            q = self.q_b_proj_swiftkv(self.q_a_layernorm_swiftkv(self.q_a_proj_swiftkv(hidden_states)))
        q = q.view(batch, seq, -1, self.qk_head_dim).transpose(1, 2)
        q_nope, q_pe = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        query = torch.cat([q_nope, _rope(q_pe, position_embeddings)], dim=-1)
        key, value = swiftkv_key_value
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        kwargs.pop("position_ids", None)  # the decoder layer's, meant for the teacher path's cache update
        kwargs.pop("use_cache", None)
        out, weights = interface(self, query, key, value, attention_mask,
                                 dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling,
                                 **kwargs)
        return self.o_proj(out.reshape(batch, seq, -1).contiguous()), weights


class DeepseekV2SwiftKVDecoderLayer(DeepseekV2DecoderLayer):
    def __init__(self, config: DeepseekV2SwiftKVConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = DeepseekV2SwiftKVAttention(config, layer_idx)  # SwiftKV


class DeepseekV2SwiftKVModel(SwiftKVModelMixin, DeepseekV2Model):
    config_class = DeepseekV2SwiftKVConfig

    def __init__(self, config: DeepseekV2SwiftKVConfig):
        use_expert_layout()  # SwiftKV: checkpoints keep transformers' per-expert layout of deepseek_v2
        super().__init__(config)
        self._init_swiftkv(config, DeepseekV2SwiftKVDecoderLayer)
        self.post_init()

    def swiftkv_key_values(self, boundary_hidden, state):
        """Per AcrossKV group leader: the latent and RoPE key from norm_swiftkv(h_l), cached in MLA's latent form, and
        every head's K/V expanded from the full cached history."""
        cfg = self.config
        l, g, L = cfg.num_key_value_layers, cfg.key_value_group_size, cfg.num_hidden_layers
        x = self.norm_swiftkv(boundary_hidden)
        key_values = {}
        for leader in range(l, L, g):
            attn = self.layers[leader].self_attn
            latent, k_pe = attn.swiftkv_latents(x, state.position_embeddings)
            if state.cache is not None:
                latent, k_pe = state.cache.update(latent, k_pe, leader)
            key_values[leader] = attn.swiftkv_expand(latent, k_pe)
        return key_values


class DeepseekV2SwiftKVForCausalLM(SwiftKVForCausalLMMixin, DeepseekV2ForCausalLM):
    config_class = DeepseekV2SwiftKVConfig

    def __init__(self, config: DeepseekV2SwiftKVConfig):
        super().__init__(config)
        self.model = DeepseekV2SwiftKVModel(config)  # SwiftKV
        self.post_init()
