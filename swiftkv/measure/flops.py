"""Analytical FLOPs and KV-cache memory of a decoder-only transformer, base and SwiftKV (paper Table 1).

Counting convention (the paper's Table 1): a matrix multiply of an ``m x n`` weight by one token costs ``2 m n``
FLOPs; norms, activations, RoPE, softmax and biases are ignored (they are O(d) per token, well under 0.1%).
Per prefill token, with ``L`` layers, hidden size ``d``, ``h`` query heads and ``h_kv`` KV heads of size ``d_h``,
MLP width ``I`` and vocabulary ``V``:

- ``vocab``     = 2 * 2 d V: the input embedding (counted as a one-hot matmul) and the LM head, as in the paper;
- ``kv_proj``   = n_kv * 2 * 2 d h_kv d_h, with n_kv = L (base) or l + (L - l) / g (SwiftKV: the first l layers
  keep their own K/V, the later ones get theirs from one projection per AcrossKV group of g layers);
- ``qo_proj``   = n_run * 2 * 2 d h d_h and ``mlp`` = n_run * 3 * 2 d I (gated MLP), n_run = L (base) or l
  (SwiftKV: prompt tokens stop after layer l);
- ``attention`` = sum over the n_run layers of 4 h d_h k (QK^T and AV over k keys), where k is the mean number of
  keys a position of a causal prompt of S tokens attends to: (S + 1) / 2, or the mean of min(i, w) for a layer
  with a sliding window w.

``context_length`` is therefore the prompt length S. The paper's attention figure for Llama-3.1-70B-Instruct
(160 GFLOPs, i.e. 2.0 GFLOPs per layer per token, a mean of 61K attended keys) is a causal prompt of about 122K
tokens. The paper states no length; it is fitted here: with S in [122,371, 122,450] the attention column and all
four totals (302 / 228 / 154 / 153) round to the paper's values, and ``TABLE1_CONTEXT_LENGTH`` = 122,400 is the
round value we use (see ``tests/test_flops.py``). No power-of-two length fits: 120K (122,880) gives 161 and 155
at 50%; the full 128K window (131,072) gives 171.8 GFLOPs (160.0 only in units of 2^30 FLOPs). The other columns
need no assumption; ours are 4.20 / 2.68 / 21.5 / 112.7 against the paper's 4.3 / 2.6 / 22 / 113, within one unit
of the paper's last digit (the paper's totals are sums of its rounded columns).

DeepSeek-V2 (latent attention, MoE): ``kv_proj`` is the latent and RoPE-key projection (d x (c + r)) plus its per-head
expansion (c x h (n + v)); ``qo_proj`` the query (or its LoRA pair) and the output; ``attention`` 2 h (n + r) + 2 h v
per key; ``mlp`` the dense first layers' MLP and, after them, the shared plus the activated routed experts and the
router; the KV cache holds c + r values per token and layer (c = kv_lora_rank, r = qk_rope_head_dim, n, v: the
no-position key and value head dims).

``prefill_flops`` counts the work of one real forward of a prompt instead (what ``swiftkv bench prefill`` times):
the embedding is a lookup (0 FLOPs), the LM head runs only for the kept positions, and those positions also run
the layers >= l.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from swiftkv.errors import SwiftKVError

OPS = ("vocab", "kv_proj", "qo_proj", "mlp", "attention")
TABLE1_CONTEXT_LENGTH = 122_400
DEFAULT_CONTEXT_LENGTH = 2048
GIGA = 1e9


@dataclass(frozen=True)
class Dims:
    """What the FLOPs and memory formulas need from a model config."""

    num_layers: int
    hidden: int
    intermediate: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    windows: tuple[int | None, ...]  # sliding window of each layer (None = full attention)
    name: str = ""
    # DeepSeek-V2: latent attention (q_lora_rank or None, kv_lora_rank, qk_nope, qk_rope, v head dims) and the MLP width
    # each layer runs per token (MoE: shared + activated experts) with its router's expert count (0: dense)
    mla: tuple[int | None, int, int, int, int] | None = None
    mlp_widths: tuple[int, ...] | None = None
    routers: tuple[int, ...] | None = None


def load_config(path: str | os.PathLike):
    """A transformers config from a ``config.json`` file or a model directory (no hub, no weights)."""
    from transformers import AutoConfig

    path = Path(path)
    if not path.exists():
        raise SwiftKVError(f"model config {path} does not exist; give a config.json file or a model directory")
    if path.is_dir() and not (path / "config.json").is_file():
        raise SwiftKVError(f"{path} has no config.json; give a config.json file or a saved model directory")
    try:
        return AutoConfig.from_pretrained(str(path))
    except (ValueError, OSError) as err:
        raise SwiftKVError(f"could not read a transformers config from {path}: {str(err).splitlines()[0]}") from None


def model_dims(config) -> Dims:
    """Dims of a transformers config (multimodal configs: their text model): dense decoders, and DeepSeek-V2's
    latent attention with MoE (the active experts' MLP)."""
    if isinstance(config, (str, os.PathLike)):
        config = load_config(config)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    if getattr(config, "kv_lora_rank", None) and getattr(config, "qk_rope_head_dim", None):
        return _mla_dims(config)
    for moe_key in ("num_experts", "n_routed_experts", "num_local_experts", "kv_lora_rank"):
        if getattr(config, moe_key, None):
            raise SwiftKVError(
                f"{type(config).__name__} has {moe_key}={getattr(config, moe_key)}: only dense decoders with standard "
                "attention are counted (MoE / latent attention are not)"
            )
    try:
        L = int(config.num_hidden_layers)
        d = int(config.hidden_size)
        heads = int(config.num_attention_heads)
        inter = int(config.intermediate_size)
        vocab = int(config.vocab_size)
    except (AttributeError, TypeError) as err:
        raise SwiftKVError(f"{type(config).__name__} lacks a field the FLOPs count needs ({err})") from None
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or d // heads)
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        windows = tuple(window if t == "sliding_attention" else None for t in layer_types)
    elif window and getattr(config, "use_sliding_window", True):
        windows = (int(window),) * L  # e.g. Mistral-7B-v0.1: every layer slides
    else:
        windows = (None,) * L
    if len(windows) != L:
        raise SwiftKVError(f"config has {len(windows)} layer_types for {L} layers")
    return Dims(L, d, inter, heads, kv_heads, head_dim, vocab, windows, getattr(config, "model_type", ""))


def _mla_dims(config) -> Dims:
    """DeepSeek-V2: latent attention and, from layer ``first_k_dense_replace`` on, MoE layers whose active MLP is the
    shared experts plus ``num_experts_per_tok`` routed ones (all of width ``moe_intermediate_size``)."""
    L, d, heads = int(config.num_hidden_layers), int(config.hidden_size), int(config.num_attention_heads)
    dense = int(getattr(config, "first_k_dense_replace", 0) or 0)
    routed = int(getattr(config, "n_routed_experts", 0) or 0)
    active = (int(getattr(config, "n_shared_experts", 0) or 0) + int(config.num_experts_per_tok or 0)) \
        * int(config.moe_intermediate_size or 0)
    widths = tuple(int(config.intermediate_size) if i < dense or not routed else active for i in range(L))
    mla = (config.q_lora_rank, int(config.kv_lora_rank), int(config.qk_nope_head_dim), int(config.qk_rope_head_dim),
           int(config.v_head_dim))
    return Dims(L, d, int(config.intermediate_size), heads, heads, int(config.qk_rope_head_dim), int(config.vocab_size),
                (None,) * L, getattr(config, "model_type", ""), mla=mla, mlp_widths=widths,
                routers=tuple(0 if i < dense else routed for i in range(L)))


def _mlp(dims: Dims, layer: int) -> float:
    """FLOPs of one token through layer ``layer``'s MLP (gated: 3 matrices; MoE: the active experts and the router)."""
    if dims.mlp_widths is None:
        return 3 * 2 * dims.hidden * dims.intermediate
    return 3 * 2 * dims.hidden * dims.mlp_widths[layer] + 2 * dims.hidden * dims.routers[layer]


def _check_swiftkv(dims: Dims, num_key_value_layers: int | None, key_value_group_size: int) -> tuple[int, int]:
    L = dims.num_layers
    l = L if num_key_value_layers is None else int(num_key_value_layers)
    g = int(key_value_group_size)
    if not 1 <= l <= L:
        raise SwiftKVError(f"num_key_value_layers={l} is outside 1..{L} (the model has {L} layers)")
    if g < 1:
        raise SwiftKVError(f"key_value_group_size={g} must be >= 1")
    if l < L and (L - l) % g:
        raise SwiftKVError(f"key_value_group_size={g} does not divide the {L - l} layers after l={l}")
    if l == L and g != 1:
        raise SwiftKVError(f"key_value_group_size={g} needs num_key_value_layers < {L} (AcrossKV groups later layers)")
    return l, g


def _mean_keys(context_length: int, window: int | None) -> float:
    """Mean over positions i = 1..S of a causal prompt of the keys attended: min(i, w)."""
    S = int(context_length)
    if S < 1:
        raise SwiftKVError(f"context_length={S} must be >= 1")
    if window is None or window >= S:
        return (S + 1) / 2
    w = int(window)
    return (w * (w + 1) / 2 + (S - w) * w) / S


def _per_layer(dims: Dims) -> dict[str, float]:
    """FLOPs of one token through one layer's projections and MLP (the first layer's MLP: ``_mlp`` per layer)."""
    d = dims.hidden
    if dims.mla is not None:  # latent attention: K/V = the latent and RoPE key, expanded per head by kv_b_proj
        q_lora, kv_lora, nope, rope, v = dims.mla
        h = dims.num_heads
        query = 2 * d * h * (nope + rope) if q_lora is None else 2 * d * q_lora + 2 * q_lora * h * (nope + rope)
        return {
            "kv_proj": 2 * d * (kv_lora + rope) + 2 * kv_lora * h * (nope + v),
            "qo_proj": query + 2 * h * v * d,
            "mlp": _mlp(dims, 0),
            "attention_per_key": 2 * h * (nope + rope) + 2 * h * v,
        }
    return {
        "kv_proj": 2 * 2 * d * dims.num_kv_heads * dims.head_dim,
        "qo_proj": 2 * 2 * d * dims.num_heads * dims.head_dim,
        "mlp": 3 * 2 * d * dims.intermediate,
        "attention_per_key": 4 * dims.num_heads * dims.head_dim,
    }


def _finish(flops: dict[str, float], scale: float = GIGA) -> dict[str, float]:
    out = {op: flops[op] / scale for op in OPS}
    out["total"] = sum(out[op] for op in OPS)
    return out


def kv_layers(num_layers: int, num_key_value_layers: int, key_value_group_size: int) -> float:
    """Layers that hold (and compute) their own K/V: l + (L - l) / g."""
    return num_key_value_layers + (num_layers - num_key_value_layers) / key_value_group_size


def prefill_flops_per_token(
    config, num_key_value_layers: int | None = None, key_value_group_size: int = 1,
    context_length: int = DEFAULT_CONTEXT_LENGTH,
) -> dict[str, float]:
    """GFLOPs per prompt token (keys vocab, kv_proj, qo_proj, mlp, attention, total), the paper's Table 1 convention.

    ``num_key_value_layers=None`` (or L) is the base model; ``context_length`` is the prompt length S.
    """
    dims = config if isinstance(config, Dims) else model_dims(config)
    l, g = _check_swiftkv(dims, num_key_value_layers, key_value_group_size)
    per = _per_layer(dims)
    keys = sum(_mean_keys(context_length, w) for w in dims.windows[:l])
    flops = {
        "vocab": 2 * 2 * dims.hidden * dims.vocab,
        "kv_proj": kv_layers(dims.num_layers, l, g) * per["kv_proj"],
        "qo_proj": l * per["qo_proj"],
        "mlp": sum(_mlp(dims, i) for i in range(l)),
        "attention": keys * per["attention_per_key"],
    }
    return _finish(flops)


def decode_flops_per_token(config, context_length: int = DEFAULT_CONTEXT_LENGTH) -> dict[str, float]:
    """GFLOPs of one decode token attending to ``context_length`` cached keys (same keys; it runs every layer).

    The same for base and SwiftKV: a decode token runs every layer (under AcrossKV, the K/V of a decode token are
    projected once per group instead of once per layer, a difference below 1% that is not counted here).
    """
    dims = config if isinstance(config, Dims) else model_dims(config)
    if context_length < 1:
        raise SwiftKVError(f"context_length={context_length} must be >= 1")
    per = _per_layer(dims)
    keys = sum(min(context_length, w) if w else context_length for w in dims.windows)
    flops = {
        "vocab": 2 * 2 * dims.hidden * dims.vocab,
        "kv_proj": dims.num_layers * per["kv_proj"],
        "qo_proj": dims.num_layers * per["qo_proj"],
        "mlp": sum(_mlp(dims, i) for i in range(dims.num_layers)),
        "attention": keys * per["attention_per_key"],
    }
    return _finish(flops)


def prefill_flops(
    config, num_tokens: int, num_key_value_layers: int | None = None, key_value_group_size: int = 1,
    logits_to_keep: int = 1,
) -> dict[str, float]:
    """FLOPs (not GFLOPs) of one real prefill forward of a ``num_tokens`` prompt, as the benchmark runs it.

    All positions run layers < l; only the last ``logits_to_keep`` positions run layers >= l and the LM head; the
    K/V of layers >= l come from one projection per AcrossKV group for every position; the embedding is a lookup.
    """
    dims = config if isinstance(config, Dims) else model_dims(config)
    l, g = _check_swiftkv(dims, num_key_value_layers, key_value_group_size)
    N, k = int(num_tokens), max(1, min(int(logits_to_keep), int(num_tokens)))
    if N < 1:
        raise SwiftKVError(f"num_tokens={N} must be >= 1")
    per = _per_layer(dims)

    def keys(window: int | None, positions: range) -> float:  # sum of min(i, w) over the positions, closed form
        lo, hi = positions.start, positions.stop - 1
        w = hi if window is None else min(int(window), hi)
        below = max(0, min(hi, w) - lo + 1)  # positions i <= w attend to i keys
        first = lo + below - 1
        return (lo + first) * below / 2 + (hi - max(first, lo - 1)) * w

    early = range(1, N + 1)
    late = range(N - k + 1, N + 1)
    late_layers = dims.num_layers - l
    flops = {
        "vocab": k * 2 * dims.hidden * dims.vocab,
        "kv_proj": N * kv_layers(dims.num_layers, l, g) * per["kv_proj"],
        "qo_proj": (N * l + k * late_layers) * per["qo_proj"],
        "mlp": N * sum(_mlp(dims, i) for i in range(l)) + k * sum(_mlp(dims, i) for i in range(l, dims.num_layers)),
        "attention": per["attention_per_key"] * (
            sum(keys(w, early) for w in dims.windows[:l]) + sum(keys(w, late) for w in dims.windows[l:])
        ),
    }
    return _finish(flops, scale=1.0)


def kv_cache(
    config, num_key_value_layers: int | None = None, key_value_group_size: int = 1, bytes_per_value: int = 2,
) -> dict[str, float]:
    """KV-cache bytes per token (at ``bytes_per_value``, 2 = bf16, and at FP8) and the reductions vs the base model.

    Every cached layer is counted as holding every token (a sliding-window layer would hold at most w tokens).
    """
    dims = config if isinstance(config, Dims) else model_dims(config)
    l, g = _check_swiftkv(dims, num_key_value_layers, key_value_group_size)
    layers = kv_layers(dims.num_layers, l, g)
    # latent attention caches one latent and one shared RoPE key per token and layer; otherwise K and V per KV head
    per_layer = dims.mla[1] + dims.mla[3] if dims.mla else 2 * dims.num_kv_heads * dims.head_dim
    base = dims.num_layers * per_layer * bytes_per_value
    return {
        "kv_cache_layers": layers,
        "kv_cache_bytes_per_token": layers * per_layer * bytes_per_value,
        "kv_cache_bytes_per_token_fp8": layers * per_layer * 1,
        "kv_cache_reduction": 1 - layers * per_layer * bytes_per_value / base,
        "kv_cache_reduction_fp8": 1 - layers * per_layer * 1 / base,
    }


def flops_report(
    config, num_key_value_layers: int | None = None, key_value_group_size: int = 1,
    context_length: int = DEFAULT_CONTEXT_LENGTH, bytes_per_value: int = 2,
) -> dict:
    """One flat record: the setting, prefill GFLOPs per token by op, the reduction vs base, and the KV-cache fields."""
    dims = config if isinstance(config, Dims) else model_dims(config)
    l, g = _check_swiftkv(dims, num_key_value_layers, key_value_group_size)
    flops = prefill_flops_per_token(dims, l, g, context_length)
    base = prefill_flops_per_token(dims, None, 1, context_length)
    return {
        "model_type": dims.name,
        "num_hidden_layers": dims.num_layers,
        "num_key_value_layers": l,
        "key_value_group_size": g,
        "context_length": int(context_length),
        **flops,
        "prefill_reduction": 1 - flops["total"] / base["total"],
        **kv_cache(dims, l, g, bytes_per_value),
    }


def layers_for_skip(num_layers: int, skip_fraction: float) -> int:
    """l for a skipped fraction of layers (50% -> L/2), rounded, at least 1."""
    return max(1, min(num_layers, round(num_layers * (1 - skip_fraction))))


def divisors(n: int) -> list[int]:
    return [g for g in range(1, n + 1) if n % g == 0]


def nearest_group_size(later_layers: int, wanted: int) -> int:
    """The divisor of the L - l later layers closest to ``wanted`` (ties: the smaller); 1 when none are later."""
    if later_layers <= 0:
        return 1
    return min(divisors(later_layers), key=lambda g: (abs(g - wanted), g))


def settings_table(config, settings: list[dict], context_length: int) -> list[dict]:
    """``flops_report`` for each setting ``{label, skip, group}``; the AcrossKV group snaps to a divisor of L - l, and
    an AcrossKV setting whose L - l has no divisor above 1 (DeepSeek-V2-Lite at 50 %: 13 later layers) is left out
    rather than shown as a "1-way AcrossKV" copy of the SwiftKV row."""
    dims = config if isinstance(config, Dims) else model_dims(config)
    rows = []
    for s in settings:
        l = layers_for_skip(dims.num_layers, float(s.get("skip", 0.0)))
        wanted = int(s.get("group", 1))
        g = nearest_group_size(dims.num_layers - l, wanted)
        if wanted > 1 and g == 1:
            continue
        label = s["label"].replace(f"{wanted}-way", f"{g}-way") if g != wanted else s["label"]
        rows.append({"setting": label, "skip": float(s.get("skip", 0.0)),
                     **flops_report(dims, l, g, context_length)})
    return rows


def kv_memory_table(config, skip: float, group_sizes: list[int] | None = None) -> list[dict]:
    """KV-cache rows at l = L * (1 - skip) for the given AcrossKV group sizes (default: every divisor of L - l)."""
    dims = config if isinstance(config, Dims) else model_dims(config)
    l = layers_for_skip(dims.num_layers, skip)
    allowed = divisors(dims.num_layers - l) if l < dims.num_layers else [1]
    sizes = allowed if not group_sizes else [g for g in group_sizes if g in allowed]
    return [
        {"model_type": dims.name, "num_hidden_layers": dims.num_layers, "num_key_value_layers": l,
         "key_value_group_size": g, "skip": skip, **kv_cache(dims, l, g)}
        for g in sizes
    ]


def model_summary(config_path: str | os.PathLike, model: str, settings: list[dict], context_length: int,
                  kv_skip: float = 0.5, kv_group_sizes: list[int] | None = None) -> dict:
    """Everything the FLOPs and KV-memory tables need for one model, as one JSON-able record."""
    dims = model_dims(config_path)
    return {
        "model": model,
        "config": str(config_path),
        "context_length": int(context_length),
        "table1": settings_table(dims, settings, context_length),
        "kv_memory": kv_memory_table(dims, kv_skip, kv_group_sizes),
    }
