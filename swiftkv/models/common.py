"""SwiftKV on top of a transformers decoder family: the parts every family shares.

Each family module (``llama.py``, ``mistral.py``, ``qwen2.py``, ``qwen3.py``) subclasses the family's transformers
classes and mixes in the classes below; everything that is not SwiftKV stays the family's own code.

Student forward (``config.swiftkv = True``), with l = ``num_key_value_layers`` and g = ``key_value_group_size``:

1. layers ``< l`` run unchanged on every position;
2. at the boundary ``x = norm_swiftkv(h_l)``; the K/V of every later layer come from ``k/v_proj_swiftkv``
   of its AcrossKV group leader applied to ``x`` and go into the cache (one cache entry per group);
3. only the positions whose logits are requested (``logits_to_keep``) continue through layers ``>= l``, with
   queries from ``q_proj_swiftkv`` of their own stream attending to the K/V of step 2.

Positions that stop at layer l feed nothing but their own (unrequested) logits, so the logits that are
returned equal those of a full student forward over every position.

The kept positions' rows are cut from a 4D mask (sdpa, eager). Kernels that take a 2D key-padding mask or none
(flash attention) apply causality themselves, aligning the queries with the last keys: they keep the skip for the
last N positions (``generate``'s ``logits_to_keep=1``) and run every position past l for any other choice (one
warning per process; the logits are the same).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward, rotate_half
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from swiftkv.configuration import (  # noqa: F401  (re-exported: the model code's historical home)
    SWIFTKV_CONFIG_KEYS,
    init_swiftkv_config_fields,
    validate_swiftkv_config,
)
from swiftkv.errors import SwiftKVError

logger = logging.getLogger(__name__)
_warned: set[str] = set()  # keys of the one-time warnings already logged in this process


def group_leader(layer_idx: int, config) -> int:
    """Index of the AcrossKV group leader whose K/V layer ``layer_idx`` (>= l) uses."""
    l, g = config.num_key_value_layers, config.key_value_group_size
    return l + ((layer_idx - l) // g) * g


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding for one tensor (B, heads, S, D) with cos/sin (B, S, D)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class SwiftKVAttentionMixin:
    """Adds ``q_proj_swiftkv`` (layers >= l) and ``k/v_proj_swiftkv`` (AcrossKV group leaders) to a family's
    attention, and a path that attends with K/V computed at the boundary."""

    def _init_swiftkv(self, config, layer_idx: int) -> None:
        l, g = config.num_key_value_layers, config.key_value_group_size
        if layer_idx < l:
            return
        bias = self.q_proj.bias is not None
        # SwiftKV: the student's query projection of a later layer (initialised from q_proj by convert).
        self.q_proj_swiftkv = nn.Linear(config.hidden_size, self.q_proj.out_features, bias=bias)
        if (layer_idx - l) % g == 0:
            # SwiftKV: K/V of the whole AcrossKV group, computed from norm_swiftkv(h_l).
            n_kv = config.swiftkv_key_value_heads or config.num_key_value_heads
            self.k_proj_swiftkv = nn.Linear(config.hidden_size, n_kv * self.head_dim, bias=bias)
            self.v_proj_swiftkv = nn.Linear(config.hidden_size, n_kv * self.head_dim, bias=bias)
            if hasattr(self, "k_norm"):  # Qwen3: the group's keys are normalised per head, as the teacher's are
                self.k_norm_swiftkv = type(self.k_norm)(self.head_dim, eps=config.rms_norm_eps)
        if hasattr(self, "q_norm"):  # Qwen3: the student's queries are normalised per head (initialised from q_norm)
            self.q_norm_swiftkv = type(self.q_norm)(self.head_dim, eps=config.rms_norm_eps)
        n_kv = config.swiftkv_key_value_heads
        if n_kv:  # MQA-style student (fewer KV heads in the later layers): the attention kernels read this
            self.swiftkv_num_key_value_groups = config.num_attention_heads // n_kv

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        swiftkv_key_value: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ):
        if swiftkv_key_value is None:  # teacher path, and every layer < l
            return super().forward(
                hidden_states,
                position_embeddings=position_embeddings,
                attention_mask=attention_mask,
                cache=cache,
                **kwargs,
            )
        # SwiftKV: the query comes from this layer's own stream; K/V were made at the boundary (and cached there).
        input_shape = hidden_states.shape[:-1]  # B, N
        query = self.q_proj_swiftkv(hidden_states).view(*input_shape, -1, self.head_dim)  # B,N,Hq,D
        if hasattr(self, "q_norm_swiftkv"):
            query = self.q_norm_swiftkv(query)
        query = apply_rope(query.transpose(1, 2), *position_embeddings)  # B,Hq,N,D
        key, value = swiftkv_key_value  # B,Hkv,S,D each
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        if hasattr(self, "sliding_window"):  # Qwen2: the window of this layer's type
            kwargs["sliding_window"] = self.sliding_window
        elif getattr(self.config, "sliding_window", None) is not None:
            # SwiftKV: Mistral passes the config's window to the kernel (flash attention applies it; sdpa/eager read
            # the mask), as MistralAttention.forward does.
            kwargs["sliding_window"] = self.config.sliding_window
        groups = getattr(self, "swiftkv_num_key_value_groups", None)
        if groups is not None:
            saved, self.num_key_value_groups = self.num_key_value_groups, groups
        try:
            attn_output, attn_weights = attention_interface(
                self,
                query,
                key,
                value,
                attention_mask,
                dropout=0.0 if not self.training else self.attention_dropout,
                scaling=self.scaling,
                **kwargs,
            )
        finally:
            if groups is not None:
                self.num_key_value_groups = saved
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()  # B,N,Hq*D
        return self.o_proj(attn_output), attn_weights


@dataclass
class PrefixState:
    """What every layer of a forward shares, prepared once (masks before the cache is updated)."""

    hidden_states: torch.Tensor  # B,S,H: the residual stream (entering the next layer to run)
    masks: dict[str, Any]  # layer type -> mask (None, a tensor, or a BlockMask)
    position_embeddings: tuple[torch.Tensor, torch.Tensor]  # cos, sin: (B or 1),S,D
    position_ids: torch.Tensor
    cache: Cache | None
    use_cache: bool
    dense_masks: dict[str, Any] | None = None  # the same masks never shortened to None (rows can be selected)


class SwiftKVModelMixin:
    """The decoder stack with the SwiftKV boundary. ``forward`` dispatches: teacher -> the family's own forward."""

    def _init_swiftkv(self, config, decoder_layer_cls) -> None:
        # SwiftKV: rebuild the layers with the SwiftKV attention and add the boundary norm.
        self.layers = nn.ModuleList([decoder_layer_cls(config, i) for i in range(config.num_hidden_layers)])
        self.norm_swiftkv = type(self.norm)(config.hidden_size, eps=config.rms_norm_eps)
        # Runtime switch (not saved): False runs every position through layers >= l (a full student forward),
        # which gives the same requested logits more slowly; benchmarks and tests use it as the reference.
        self.prefill_skip = True
        # Runtime input (not saved), set around one forward by swiftkv.measure.lm: the stream entering layer l of every
        # position, recorded by the base model (whose layers < l the student shares), in place of running them.
        self.given_boundary = None

    # -- pieces shared by the student forward and the distillation trainer ---------------------------------

    def layer_type(self, layer_idx: int) -> str:
        types = getattr(self.config, "layer_types", None)
        if types is not None:
            return types[layer_idx]
        return "sliding_attention" if getattr(self.config, "sliding_window", None) else "full_attention"

    def build_masks(self, mask_kwargs: dict[str, Any], allow_is_causal_skip: bool = True) -> dict[str, Any]:
        types = {self.layer_type(i) for i in range(self.config.num_hidden_layers)}
        masks = {}
        if "full_attention" in types:
            masks["full_attention"] = create_causal_mask(**mask_kwargs, allow_is_causal_skip=allow_is_causal_skip)
        if "sliding_attention" in types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(
                **mask_kwargs, allow_is_causal_skip=allow_is_causal_skip
            )
        return masks

    def prepare_prefix(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        use_cache=None,
        dense_masks: bool = False,
    ) -> PrefixState:
        if (input_ids is None) ^ (inputs_embeds is not None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past).unsqueeze(0)
        mask_kwargs = dict(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            cache=cache,
            position_ids=position_ids,
        )
        # Masks are sized from the cache state, so they are all built here, before any layer updates the cache.
        masks = attention_mask if isinstance(attention_mask, dict) else self.build_masks(mask_kwargs)
        dense = None
        if dense_masks and any(m is None for m in masks.values()):
            # SDPA's is_causal shortcut (mask None) aligns K/V to the query length, which is wrong once only some
            # query rows continue: materialise the mask so that rows can be selected.
            dense = self.build_masks(mask_kwargs, allow_is_causal_skip=False)
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids=position_ids)
        return PrefixState(
            inputs_embeds, masks, position_embeddings, position_ids, cache, bool(use_cache), dense or masks
        )

    def run_layers(self, state: PrefixState, start: int, end: int, **kwargs) -> torch.Tensor:
        """Run decoder layers [start, end) the family's way (own K/V) on every position of ``state``."""
        hidden_states = state.hidden_states
        for i in range(start, end):
            hidden_states = self.layers[i](
                hidden_states,
                attention_mask=state.masks[self.layer_type(i)],
                position_embeddings=state.position_embeddings,
                position_ids=state.position_ids,
                cache=state.cache,
                use_cache=state.use_cache,
                **kwargs,
            )
        return hidden_states

    def swiftkv_key_values(
        self, boundary_hidden: torch.Tensor, state: PrefixState
    ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """K/V of every AcrossKV group leader from ``norm_swiftkv(h_l)``, RoPE applied, cached; leader -> full history."""
        cfg = self.config
        l, g, L = cfg.num_key_value_layers, cfg.key_value_group_size, cfg.num_hidden_layers
        x = self.norm_swiftkv(boundary_hidden)  # B,S,H
        shape = (*x.shape[:-1], -1, self.layers[l].self_attn.head_dim) if l < L else None
        cos, sin = state.position_embeddings
        key_values = {}
        for leader in range(l, L, g):
            attn = self.layers[leader].self_attn
            key = attn.k_proj_swiftkv(x).view(shape)  # B,S,Hkv,D
            if hasattr(attn, "k_norm_swiftkv"):
                key = attn.k_norm_swiftkv(key)
            key = apply_rope(key.transpose(1, 2), cos, sin)  # B,Hkv,S,D
            value = attn.v_proj_swiftkv(x).view(shape).transpose(1, 2)  # B,Hkv,S,D
            if state.cache is not None:
                key, value = state.cache.update(key, value, leader)
            key_values[leader] = (key, value)
        return key_values

    def run_swiftkv_layers(
        self,
        hidden_states: torch.Tensor,
        key_values: dict[int, tuple[torch.Tensor, torch.Tensor]],
        masks: dict[str, Any],
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        position_ids: torch.Tensor,
        **kwargs,
    ) -> torch.Tensor:
        """Student layers >= l on the given positions, attending to the boundary K/V."""
        cfg = self.config
        for j in range(cfg.num_key_value_layers, cfg.num_hidden_layers):
            hidden_states = self.layers[j](
                hidden_states,
                attention_mask=masks[self.layer_type(j)],
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                cache=None,  # SwiftKV: the boundary already cached this layer's K/V
                swiftkv_key_value=key_values[group_leader(j, cfg)],
                **kwargs,
            )
        return hidden_states

    # -- forward --------------------------------------------------------------------------------------------

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        use_cache=None,
        swiftkv_keep=None,
        **kwargs,
    ):
        given = input_ids if input_ids is not None else inputs_embeds
        if given is not None and given.dim() >= 2 and given.shape[1] == 0:
            raise SwiftKVError(f"{'input_ids' if input_ids is not None else 'inputs_embeds'} holds no positions "
                               f"(shape {tuple(given.shape)}); give at least one token per row")
        if not self.config.swiftkv:
            out = super().forward(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                inputs_embeds=inputs_embeds,
                use_cache=use_cache,
                **kwargs,
            )
            if swiftkv_keep is not None:
                out.last_hidden_state = select_positions(out.last_hidden_state, swiftkv_keep)
            return out
        return self._swiftkv_forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            swiftkv_keep=swiftkv_keep,
            **kwargs,
        )

    @merge_with_config_defaults
    @capture_outputs
    def _swiftkv_forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        use_cache=None,
        swiftkv_keep=None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """Student forward. ``swiftkv_keep`` (a ``logits_to_keep`` value) selects the positions that continue past
        layer l; ``last_hidden_state`` then holds only those positions."""
        seq_len = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        device = (input_ids if input_ids is not None else inputs_embeds).device
        index = keep_index(swiftkv_keep, seq_len, device)
        want_hidden = kwargs.get("output_hidden_states") or getattr(self.config, "output_hidden_states", False)
        can_skip = self.prefill_skip and index is not None and not isinstance(index, str) and not want_hidden
        last_only = can_skip and index.dim() == 1 and index.numel() == 1 and int(index) == seq_len - 1
        state = self.prepare_prefix(
            input_ids, attention_mask, position_ids, cache, inputs_embeds, use_cache, dense_masks=can_skip and not last_only
        )
        if can_skip and not all(m is None or isinstance(m, torch.Tensor) for m in state.masks.values()):
            can_skip = False  # e.g. flex-attention BlockMask: run every position, select at the end
        if (
            can_skip
            and any(is_key_padding_mask(m) for m in state.dense_masks.values())
            and not (last_only or is_last_positions(swiftkv_keep, index, seq_len))
        ):
            # SwiftKV: a kernel that takes a 2D key-padding mask (or none) applies causality itself, aligning the
            # queries with the last keys; it cannot express arbitrary kept positions: run them all, select at the end.
            warn_once(
                "kernel-cannot-skip",
                "SwiftKV: attn_implementation=%r takes a 2D key-padding mask and aligns queries with the last keys, "
                "so only the last N positions (an int logits_to_keep) can skip layers >= l; running every position "
                "through them for this logits_to_keep (results are exact, the prefill saving is lost)",
                self.config._attn_implementation,
            )
            can_skip = False
        l = self.config.num_key_value_layers
        given = getattr(self, "given_boundary", None)  # swiftkv.measure.boundary: h_l recorded by the base model
        if given is not None:
            if tuple(given.shape) != tuple(state.hidden_states.shape):
                raise SwiftKVError(f"given boundary states of shape {tuple(given.shape)} for inputs of shape "
                                   f"{tuple(state.hidden_states.shape)}")
            boundary = given.to(device=state.hidden_states.device, dtype=state.hidden_states.dtype)
        else:
            boundary = self.run_layers(state, 0, l, **kwargs)  # B,S,H: h_l, the stream entering layer l
        key_values = self.swiftkv_key_values(boundary, state)

        if can_skip:
            masks = {t: select_query_rows(m, index) for t, m in state.dense_masks.items()}
            batch = boundary.shape[0]
            embeddings = state.position_embeddings  # (cos, sin), or DeepSeek's complex frequencies
            if isinstance(embeddings, tuple):
                embeddings = tuple(select_positions(e.expand(batch, -1, -1), index) for e in embeddings)
            else:
                embeddings = select_positions(embeddings.expand(batch, -1, -1), index)
            hidden = self.run_swiftkv_layers(
                select_positions(boundary, index),
                key_values,
                masks,
                embeddings,
                select_positions(state.position_ids.expand(batch, -1), index),
                **kwargs,
            )
        else:
            hidden = self.run_swiftkv_layers(
                boundary, key_values, state.masks, state.position_embeddings, state.position_ids, **kwargs
            )
        hidden = self.norm(hidden)
        if index is not None and not can_skip:
            hidden = select_positions(hidden, swiftkv_keep if isinstance(index, str) else index)
        return BaseModelOutputWithPast(last_hidden_state=hidden, cache=state.cache if state.use_cache else None)


def keep_index(logits_to_keep, seq_len: int, device) -> torch.Tensor | str | None:
    """Normalise a ``logits_to_keep`` value: None = every position; a 1D (N,) or 2D (B, N) LongTensor of positions;
    the string "mask" for a boolean mask (variable count per row: computed in full, then selected)."""
    if logits_to_keep is None:
        return None
    if isinstance(logits_to_keep, int):
        if logits_to_keep <= 0 or logits_to_keep >= seq_len:
            return None
        return torch.arange(seq_len - logits_to_keep, seq_len, device=device)
    index = torch.as_tensor(logits_to_keep, device=device)
    if index.dtype == torch.bool:
        return "mask"
    return index.long()


def is_key_padding_mask(mask) -> bool:
    """True for a mask that flash-attention-style kernels take: None or a 2D (B, K) key-padding mask. Such a kernel
    applies causality itself, bottom-right aligned (query i of Q sits at key K - Q + i)."""
    return mask is None or (isinstance(mask, torch.Tensor) and mask.dim() == 2)


def is_last_positions(logits_to_keep, index: torch.Tensor, seq_len: int) -> bool:
    """Whether ``index`` (a ``keep_index`` tensor) is the last N positions of every row, in order."""
    if isinstance(logits_to_keep, int):
        return True  # keep_index made arange(S - N, S)
    n = index.shape[-1] if index.dim() else 0
    tail = torch.arange(seq_len - n, seq_len, device=index.device)
    return 0 < n <= seq_len and bool((index == tail).all())


def select_query_rows(mask, index: torch.Tensor):
    """The attention mask for the kept query positions ``index``."""
    if is_key_padding_mask(mask):
        # SwiftKV: None or a 2D key-padding mask masks keys, not queries: unchanged. Right only when ``index`` is the
        # last N positions: the kernel aligns queries bottom-right, and transformers' flash-attention path unpads the
        # queries with the mask's last N columns.
        return mask
    return select_positions(mask, index, dim=-2)  # B,1,N,K from B,1,S,K


def warn_once(key: str, message: str, *args) -> None:
    """``logger.warning`` the first time ``key`` is seen in this process."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


def select_positions(x: torch.Tensor, keep, dim: int = 1) -> torch.Tensor:
    """Pick positions along ``dim`` of x (B, ..., S, ...) with a ``keep_index`` result or a raw logits_to_keep."""
    if isinstance(keep, int):
        if keep <= 0:
            return x
        keep = torch.arange(x.shape[dim] - min(keep, x.shape[dim]), x.shape[dim], device=x.device)
    keep = torch.as_tensor(keep, device=x.device)
    if keep.dtype == torch.bool:  # (B, S) mask -> flattened (num_true, ...), as transformers' slice_logits_to_keep
        return x.movedim(dim, 1)[keep]
    if keep.dim() == 1:
        return x.index_select(dim, keep)
    # (B, N): per-row positions
    dim = dim % x.dim()
    x = x.expand(keep.shape[0], *x.shape[1:])
    shape = [keep.shape[0]] + [1] * (x.dim() - 1)
    shape[dim] = keep.shape[1]
    idx = keep.view(shape).expand(*[s if d != dim else keep.shape[1] for d, s in enumerate(x.shape)])
    return x.gather(dim, idx)


class SwiftKVForCausalLMMixin:
    """Causal LM head over the SwiftKV stack; one model plays teacher and student."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' loader (``AutoModelForCausalLM`` lands here too), refusing in one line a damaged local
        checkpoint (``swiftkv.loading.check_model_dir``) and one whose weights do not match its config: a weight
        missing (above all a ``*_swiftkv`` projection l and g imply, which would otherwise start random) or a SwiftKV
        weight the config has no place for."""
        from pathlib import Path

        from transformers import PretrainedConfig

        from swiftkv.loading import check_model_dir, check_swiftkv_weights

        local = Path(str(pretrained_model_name_or_path), kwargs.get("subfolder") or "")
        if local.is_dir() and not kwargs.get("gguf_file"):
            check_model_dir(local)
            config = kwargs.get("config")
            if not isinstance(config, PretrainedConfig):
                config = cls.config_class.from_pretrained(local)
            check_swiftkv_weights(local, cls, config)  # before any weight is read (and any progress bar)
        asked = kwargs.get("output_loading_info", False)
        model, info = super().from_pretrained(pretrained_model_name_or_path, *args,
                                              **{**kwargs, "output_loading_info": True})
        missing, extra = model.__dict__.pop("_swiftkv_load_problems", ((), ()))
        if missing or extra:
            cfg = model.config
            what, keys = ((f"lacks {len(missing)} weight(s) its config implies", missing) if missing else
                          (f"holds {len(extra)} SwiftKV weight(s) its config has no place for", extra))
            raise SwiftKVError(
                f"{pretrained_model_name_or_path} {what} (l={cfg.num_key_value_layers}, g={cfg.key_value_group_size}"
                f"; e.g. {', '.join(keys[:3])}): the checkpoint is damaged or its config.json belongs to another "
                "model; re-create it (swiftkv convert / distill) or restore its files")
        return (model, info) if asked else model

    def _adjust_missing_and_unexpected_keys(self, loading_info) -> None:
        """transformers' hook between reading the weights and reporting on them: what does not fit the config (a
        missing weight, a SwiftKV weight without a place) is taken out of its report (a table on stderr) and refused
        in one line by ``from_pretrained``."""
        super()._adjust_missing_and_unexpected_keys(loading_info)
        missing = sorted(loading_info.missing_keys, key=lambda k: ("_swiftkv" not in k, k))  # SwiftKV ones first
        extra = sorted(k for k in loading_info.unexpected_keys if "_swiftkv" in k)
        if missing or extra:
            self.__dict__["_swiftkv_load_problems"] = (missing, extra)
            loading_info.missing_keys = set()
            loading_info.unexpected_keys -= set(extra)

    def swiftkv(self, enabled: bool = True):
        """Switch to the student (True: SwiftKV wiring, prefill skip) or the teacher (False); returns the model."""
        self.config.swiftkv = bool(enabled)
        return self

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        if not self.config.swiftkv:
            return super().forward(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                inputs_embeds=inputs_embeds,
                labels=labels,
                use_cache=use_cache,
                logits_to_keep=logits_to_keep,
                **kwargs,
            )
        return_dict = kwargs.pop("return_dict", True)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            # SwiftKV: positions whose logits are not requested stop after layer l
            swiftkv_keep=logits_to_keep,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        out = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return out if return_dict else out.to_tuple()
