"""SwiftKV models for vLLM's V1 engine (Llama, Qwen2 and Qwen3 families, Snowflake's checkpoint format).

Layout of the stack, with l = ``num_key_value_layers`` and g = ``key_value_group_size``:

- layers ``< l`` are the family's own vLLM decoder layers, run on every scheduled token;
- at the boundary ``x = norm_swiftkv(h_l)`` goes through the K/V projections of every AcrossKV group (one fused
  GEMM), RoPE is applied, and each group's K/V are written into the paged cache of that group's *cache owner*
  (an ``Attention`` layer that never attends; the write is the engine's ``unified_kv_cache_update``);
- layers ``>= l`` project only their queries (``q_proj_swiftkv``) and attend through an ``Attention`` declared
  with ``kv_sharing_target_layer_name`` = their group's owner, so the engine allocates no cache for them
  (AcrossKV's saving: the cache holds l + (L - l) / g layers) and they read what the boundary wrote.

Because the layers ``>= l`` are the trailing KV-sharing layers of the model, the engine's fast-prefill path for
KV-sharing models (``--kv-sharing-fast-prefill``, turned on by the plugin for SwiftKV checkpoints) gives them
attention metadata restricted to the tokens whose logits are sampled, and hands those token indices to the model:
only those tokens continue past layer l (the prefill skip). Without the flag every token runs every layer, which
gives the same sampled tokens and also correct prompt logprobs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group, get_tensor_model_parallel_world_size
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.attention.attention import unified_kv_cache_update
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear, MergedColumnParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper, extract_layer_index, make_layers
from vllm.utils.torch_utils import _encode_layer_name
from vllm.v1.attention.backends.utils import KVSharingFastPrefillMetadata

from swiftkv.errors import SwiftKVError
from swiftkv.vllm_plugin.families import LLAMA, QWEN2, QWEN3, Family, check_supported, swiftkv_layout
from swiftkv.vllm_plugin.rows import merge_sampled_rows


STATS_ENV = "SWIFTKV_VLLM_STATS"  # "1": count tokens per step (tests read them through LLM.apply_model)


# -- layers >= l ------------------------------------------------------------------------------------------------


class SwiftKVAttention(nn.Module):
    """Attention of a layer >= l: its own query (``q_proj_swiftkv``), the K/V its group's owner holds."""

    def __init__(self, config, family: Family, *, cache_config, quant_config, prefix: str, kv_owner: str):
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        self.head_dim = family.head_dim(config)
        total_heads, total_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.num_heads = total_heads // tp_size
        self.num_kv_heads = max(1, total_kv_heads // tp_size)
        # SwiftKV: the student's query projection; the teacher's q/k/v of this layer are not loaded.
        self.q_proj_swiftkv = ColumnParallelLinear(config.hidden_size, total_heads * self.head_dim,
                                                   bias=family.qkv_bias(config), quant_config=quant_config,
                                                   prefix=f"{prefix}.q_proj_swiftkv")
        # Qwen3: the student's per-head query norm (the teacher's q_norm of this layer is not loaded)
        self.q_norm_swiftkv = RMSNorm(self.head_dim, eps=config.rms_norm_eps) if family.qk_norm else None
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, config.hidden_size, bias=family.o_bias(config),
                                        quant_config=quant_config, prefix=f"{prefix}.o_proj")
        self.rotary_emb = get_rope(self.head_dim, max_position=config.max_position_embeddings,
                                   rope_parameters=getattr(config, "rope_parameters", None),
                                   **family.rope_kwargs(config))
        # SwiftKV: no cache of its own; reads the cache its AcrossKV group's owner was given at the boundary.
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, num_kv_heads=self.num_kv_heads,
                              cache_config=cache_config, quant_config=quant_config, prefix=f"{prefix}.attn",
                              kv_sharing_target_layer_name=kv_owner)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        q, _ = self.q_proj_swiftkv(hidden_states)  # n, Hq*D
        if self.q_norm_swiftkv is not None:
            q = self.q_norm_swiftkv(q.view(-1, self.num_heads, self.head_dim)).view(q.shape)
        q, _ = self.rotary_emb(positions, q, None)
        out = self.attn(q, None, None)  # n, Hq*D
        out, _ = self.o_proj(out)
        return out


class SwiftKVDecoderLayer(nn.Module):
    """A decoder layer >= l: the family's norms and MLP around a :class:`SwiftKVAttention`."""

    def __init__(self, config, family: Family, *, cache_config, quant_config, prefix: str, kv_owner: str):
        super().__init__()
        self.self_attn = SwiftKVAttention(config, family, cache_config=cache_config, quant_config=quant_config,
                                          prefix=f"{prefix}.self_attn", kv_owner=kv_owner)
        self.mlp = family.mlp(config, quant_config, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions, hidden_states, residual):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


# -- the stack --------------------------------------------------------------------------------------------------


class SwiftKVModel(nn.Module):
    """Embedding, layers < l, the SwiftKV boundary, layers >= l (only on the tokens that are sampled), final norm."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", family: Family):
        super().__init__()
        config = vllm_config.model_config.hf_config
        cache_config, quant_config = vllm_config.cache_config, vllm_config.quant_config
        family.prepare(config)
        check_supported(config, family, vllm_config)
        self.config = config
        L = config.num_hidden_layers
        self.l, self.g = swiftkv_layout(config)
        l, g = self.l, self.g
        self.leaders = list(range(l, L, g))
        tp_size = get_tensor_model_parallel_world_size()
        head_dim = family.head_dim(config)
        self.num_kv_heads = max(1, config.num_key_value_heads // tp_size)
        self.kv_size = self.num_kv_heads * head_dim

        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, quant_config=quant_config,
                                                   prefix=f"{prefix}.embed_tokens")
        # SwiftKV: one KV-cache owner per AcrossKV group. Registered before every decoder layer so that the layers
        # >= l are the model's trailing KV-sharing layers: those are the ones the engine's fast prefill restricts.
        self.kv_owners = nn.ModuleDict({
            str(leader): Attention(config.num_attention_heads // tp_size, head_dim, head_dim**-0.5,
                                   num_kv_heads=self.num_kv_heads, cache_config=cache_config,
                                   quant_config=quant_config, prefix=f"{prefix}.kv_owners.{leader}")
            for leader in self.leaders
        })
        for owner in self.kv_owners.values():
            if owner.attn_backend.forward_includes_kv_cache_update:
                raise SwiftKVError(f"attention backend {owner.attn_backend.get_name()} writes the KV cache only inside "
                                   "its forward; the SwiftKV plugin needs one with a separate KV-cache update "
                                   "(CPU_ATTN, FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION)")

        def make_layer(prefix: str) -> nn.Module:
            i = extract_layer_index(prefix)
            if i < l:
                return family.teacher_layer(vllm_config, config, prefix)
            owner = self.kv_owners[str(l + (i - l) // g * g)].layer_name
            return SwiftKVDecoderLayer(config, family, cache_config=cache_config, quant_config=quant_config,
                                       prefix=prefix, kv_owner=owner)

        self.start_layer, self.end_layer, self.layers = make_layers(L, make_layer, prefix=f"{prefix}.layers")
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if l < L:
            self.norm_swiftkv = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            # SwiftKV: K of every group, then V of every group, from x = norm_swiftkv(h_l) in one GEMM.
            self.kv_proj_swiftkv = MergedColumnParallelLinear(
                config.hidden_size, [config.num_key_value_heads * head_dim] * (2 * len(self.leaders)),
                bias=family.qkv_bias(config), quant_config=quant_config, prefix=f"{prefix}.kv_proj_swiftkv")
            self.rotary_emb = get_rope(head_dim, max_position=config.max_position_embeddings,
                                       rope_parameters=getattr(config, "rope_parameters", None),
                                       **family.rope_kwargs(config))
            # Qwen3: each group's per-head key norm (k_norm_swiftkv of its leader), row k for group k
            self.k_norm_swiftkv = GroupHeadNorm(len(self.leaders), head_dim, config.rms_norm_eps) \
                if family.qk_norm else None
        self.hf_to_vllm_mapper = self._weights_mapper()
        self.stats = {"steps": 0, "tokens": 0, "tokens_past_boundary": 0, "prefill_steps": 0, "mixed_steps": 0}
        self._count = os.environ.get(STATS_ENV) == "1"

    def _weights_mapper(self) -> WeightsMapper:
        L, l, n = self.config.num_hidden_layers, self.l, len(self.leaders)
        drop: dict[str, None] = {}
        stacked: dict[str, tuple[str, int | str]] = {}
        for i in range(l, L):  # the teacher's projections of the later layers: the student does not use them
            for name in ("q_proj", "k_proj", "v_proj"):
                drop[f"layers.{i}.self_attn.{name}."] = None
        if l == L:  # served as the teacher: the student's weights are not used
            regex = {re.compile(r"(^|\.)norm_swiftkv\.|_proj_swiftkv\."): None}
        else:
            regex = {}
            for k, leader in enumerate(self.leaders):
                stacked[f"layers.{leader}.self_attn.k_proj_swiftkv."] = ("kv_proj_swiftkv.", k)
                stacked[f"layers.{leader}.self_attn.v_proj_swiftkv."] = ("kv_proj_swiftkv.", n + k)
                stacked[f"layers.{leader}.self_attn.k_norm_swiftkv."] = ("k_norm_swiftkv.", k)
            for i in range(l, L):  # Qwen3: the teacher's q/k norms of the later layers are not used either
                for name in ("q_norm", "k_norm"):
                    drop[f"layers.{i}.self_attn.{name}."] = None
        # The family's own fusions, matched with the trailing dot so that "*_proj_swiftkv" names are left alone.
        stacked.update({".q_proj.": (".qkv_proj.", "q"), ".k_proj.": (".qkv_proj.", "k"),
                        ".v_proj.": (".qkv_proj.", "v"), ".gate_proj.": (".gate_up_proj.", 0),
                        ".up_proj.": (".gate_up_proj.", 1)})
        return WeightsMapper(orig_to_new_regex=regex, orig_to_new_substr=drop, orig_to_new_stacked=stacked)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def _sampled_token_indices(self) -> tuple[torch.Tensor, int] | None:
        """The engine's fast-prefill token selection for the layers >= l, or None (every token continues)."""
        metadata = get_forward_context().attn_metadata
        if not isinstance(metadata, dict):  # None in dummy/profile runs
            return None
        first = metadata.get(self.layers[self.l].self_attn.attn.layer_name)
        last = metadata.get(self.layers[-1].self_attn.attn.layer_name)
        fast = [isinstance(m, KVSharingFastPrefillMetadata) and m.logits_indices_padded is not None
                for m in (first, last)]
        if fast[0] != fast[1]:
            raise RuntimeError("the engine restricted only some of the SwiftKV layers >= l to the sampled tokens")
        if not fast[1]:
            return None
        return last.logits_indices_padded, last.num_logits_indices

    def _write_boundary_kv(self, positions: torch.Tensor, x: torch.Tensor) -> None:
        """K/V of every layer >= l from x = norm_swiftkv(h_l), into each AcrossKV group's paged cache."""
        kv, _ = self.kv_proj_swiftkv(x)  # N, 2*G*kv
        n = len(self.leaders) * self.kv_size
        keys, values = kv[:, :n], kv[:, n:]  # N, G*kv each
        if self.k_norm_swiftkv is not None:  # Qwen3: per-head key norm of each group, before RoPE
            heads = keys.reshape(keys.shape[0], len(self.leaders), self.num_kv_heads, -1)  # N, G, kv heads, D
            keys = self.k_norm_swiftkv(heads).reshape(keys.shape)
        keys, _ = self.rotary_emb(positions, keys, None)  # every group's K heads at once
        for k, owner in enumerate(self.kv_owners.values()):
            key = keys[:, k * self.kv_size:(k + 1) * self.kv_size].view(-1, self.num_kv_heads, owner.head_size)
            value = values[:, k * self.kv_size:(k + 1) * self.kv_size].view(-1, self.num_kv_heads, owner.head_size)
            if owner.use_direct_call:  # what Attention.forward does for its own K/V
                unified_kv_cache_update(key, value, owner.layer_name)
            else:
                torch.ops.vllm.unified_kv_cache_update(key, value, _encode_layer_name(owner.layer_name))

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None) -> torch.Tensor:
        hidden = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)  # N, H
        residual = None
        for layer in self.layers[:self.l]:
            hidden, residual = layer(positions, hidden, residual)
        if self.l == self.config.num_hidden_layers:
            return self.norm(hidden, residual)[0]

        # SwiftKV: the boundary. x = norm_swiftkv(h_l); stream = h_l, the residual stream entering layer l.
        x, stream = self.norm_swiftkv(hidden, residual) if residual is not None else (self.norm_swiftkv(hidden), hidden)
        self._write_boundary_kv(positions, x)

        selected = self._sampled_token_indices()
        if selected is None:
            index, hidden, pos = None, stream, positions
        else:  # SwiftKV: only the tokens whose logits are sampled continue past layer l
            index, count = selected
            hidden, pos = stream.index_select(0, index), positions.index_select(0, index)  # n, H ; n
        if self._count:
            self._update_stats(stream.shape[0], hidden.shape[0] if index is None else count)
        residual = None
        for layer in self.layers[self.l:]:
            hidden, residual = layer(pos, hidden, residual)
        hidden, _ = self.norm(hidden, residual)  # n, H
        if index is None:
            return hidden
        return merge_sampled_rows(stream, index, hidden)

    def _update_stats(self, tokens: int, continued: int) -> None:
        self.stats["steps"] += 1
        self.stats["tokens"] += tokens
        self.stats["tokens_past_boundary"] += continued
        metadata = get_forward_context().attn_metadata
        first = metadata.get(self.layers[0].self_attn.attn.layer_name) if isinstance(metadata, dict) else None
        start = getattr(first, "query_start_loc", None)
        if start is not None:
            lens = [n for n in start.diff().tolist() if n > 0]  # per request (padding rows have none)
            if any(n > 1 for n in lens):
                self.stats["prefill_steps"] += 1
                if any(n == 1 for n in lens):
                    self.stats["mixed_steps"] += 1

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loader = AutoWeightsLoader(self)
        return loader.load_weights(weights, mapper=self.hf_to_vllm_mapper)


class GroupHeadNorm(nn.Module):
    """RMSNorm over the head dimension with one weight per AcrossKV group: x (N, G, heads, D), weight (G, D). Loads
    each leader's ``k_norm_swiftkv.weight`` into its row (the shard id the weights mapper gives it)."""

    def __init__(self, groups: int, head_dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(groups, head_dim))
        self.weight.weight_loader = self._load

    @staticmethod
    def _load(param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data[loaded.shard_id].copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float()[None, :, None, :] * x).to(dtype)


class SwiftKVForCausalLM(nn.Module):
    """Causal LM head over :class:`SwiftKVModel`; subclasses name the family."""

    family: Family

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.model = SwiftKVModel(vllm_config=vllm_config, prefix=f"{prefix}.model" if prefix else "model",
                                  family=self.family)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, quant_config=vllm_config.quant_config,
                                      prefix=f"{prefix}.lm_head" if prefix else "lm_head")
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size, scale=getattr(config, "logit_scale", 1.0))
        if not get_pp_group().is_first_rank or not get_pp_group().is_last_rank:
            raise SwiftKVError("the SwiftKV vLLM plugin does not support pipeline parallelism")

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        skip = ["lm_head."] if self.config.tie_word_embeddings else None
        return AutoWeightsLoader(self, ignore_unexpected_prefixes=skip).load_weights(weights)


class LlamaSwiftKVForCausalLM(SwiftKVForCausalLM):
    family = LLAMA


class Qwen2SwiftKVForCausalLM(SwiftKVForCausalLM):
    family = QWEN2


class Qwen3SwiftKVForCausalLM(SwiftKVForCausalLM):
    family = QWEN3


class UnservedSwiftKVForCausalLM(nn.Module):
    """Registered for the SwiftKV architectures this plugin does not serve (``UNSERVED_ARCHITECTURES``): their config
    hook stops the engine first; should a model still be built, it stops with the same line."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        from swiftkv.vllm_plugin import unserved_message

        config = vllm_config.model_config.hf_config
        raise SwiftKVError(unserved_message(config.to_dict()) or "this SwiftKV family is not served by the plugin")

    # vLLM's interface, so that its registry inspects this class as a text-generation model and the engine's
    # configuration reaches the config hook's line; never called (the constructor stops first)
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, **kwargs) -> torch.Tensor:
        raise NotImplementedError

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
