"""One packed forward with every distinct position run once: the rows' shared ancestors are not copied.

``prefix_tree.plan_rows`` cuts the requests into rows, and a node that two rows of one forward need (a task's
instructions, a long context) is in both. Only attention needs the rows: every other part of a decoder layer (norms,
projections, MLP) works on each position alone. So the forward's input here is the distinct positions as one
sequence of U (each node once, in the column where it is scored, else where it first runs; row-major), and each
attention layer gathers the rows' queries, keys and values from it by a (rows, width) index, runs attention on them
with the rows' 4D mask, and takes each position's output back from its column. A node's copies see the same
ancestors at the same positions, so any copy's output is its output. The queries run in blocks of ``QUERY_BLOCK``
columns, each against only the key columns that one of its queries sees in some row: the block's shared ancestors and
its own subtrees, never a column after the block (ancestors come first) nor, mostly, the other subtrees between them
(about a third of the whole rows' attention work on the report suite). A block's masks are made once a forward.

``shared_rows`` sets this up around one forward: the attention function is registered with transformers'
``AttentionInterface`` under ``ATTENTION_NAME`` and the model's ``_attn_implementation`` points to it inside the
block only; the 4D mask passed as ``attention_mask`` reaches every layer as is (transformers passes a 4D mask on
unchanged).

(Attention per unit of a row, a subtree with its ancestors, instead of per row was tried: less attention work, but
the extra gathers and sdpa calls made the forward slower on the report suite.)
"""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTENTION_NAME = "swiftkv_shared_rows"
_LAYOUT: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "swiftkv_shared_rows", default=None)
_FULL_ONLY = ("softcap", "position_bias", "s_aux")  # attention extras that only transformers' own sdpa call handles
QUERY_BLOCK = 32  # query columns per attention call: each block's keys stop at its last column
FOLDED_DEVICES = ("cpu",)  # device types whose blocks run _folded_attention (measured faster); others run sdpa


def shared_layout(rows, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(gather, source) of packed ``rows`` (``prefix_tree.Row``) laid out ``width`` columns wide: ``source`` (U,),
    ascending, is the flat (row * width + column) place each distinct node runs at (its scored column, else its first
    column, row-major), so the U positions' inputs and outputs are the rows' flattened ones at ``source``; ``gather``
    (R, width) is each column's index into the U positions (padding columns take 0: they see only themselves, and
    nothing reads them)."""
    place: dict[int, int] = {}
    for r, row in enumerate(rows):
        for col in row.scored:
            place[row.nodes[col]] = r * width + col
    for r, row in enumerate(rows):
        for col, node in enumerate(row.nodes):
            place.setdefault(node, r * width + col)
    source = np.fromiter(sorted(place.values()), dtype=np.int64, count=len(place))
    slot = np.zeros(len(rows) * width, dtype=np.int64)
    slot[source] = np.arange(len(source))
    gather = np.zeros((len(rows), width), dtype=np.int64)
    for r, row in enumerate(rows):
        gather[r, :len(row.nodes)] = slot[[place[node] for node in row.nodes]]
    return gather, source


def query_blocks(mask: np.ndarray, block: int | None = None) -> tuple[tuple[int, int, np.ndarray], ...]:
    """(start, stop, keys) of each ``block`` (default ``QUERY_BLOCK``) query columns of a (R, 1, W, W) boolean mask:
    ``keys``, ascending, are the columns that some row's query in the block sees; no query of the block sees any
    other. A column sees only its ancestors, which come before it, so a block's keys end at its last column. On the
    report suite the blocks cover about a third of W x W: a block's queries see their shared ancestors and their own
    subtrees, not the other subtrees between them."""
    block = block or QUERY_BLOCK
    seen = mask[:, 0].any(axis=0)  # (W, W): a key any row's query sees
    width = seen.shape[0]
    return tuple((start, min(width, start + block), np.flatnonzero(seen[start:start + block].any(axis=0)))
                 for start in range(0, width, block))  # every column sees itself: keys never empty


def _key_selector(keys: np.ndarray) -> slice | torch.Tensor:
    """A block's keys as a slice where they are one run of columns (a view, no copy), else as an index."""
    if keys[-1] + 1 - keys[0] == len(keys):
        return slice(int(keys[0]), int(keys[-1]) + 1)
    return torch.from_numpy(keys)


def _take(x: torch.Tensor, keys: slice | torch.Tensor, dim: int = -2) -> torch.Tensor:
    """``x``'s entries ``keys`` along ``dim`` (the keys of (R, H, W, D); -1: a mask's key columns)."""
    if isinstance(keys, slice):
        return x.narrow(dim, keys.start, keys.stop - keys.start)
    return x.index_select(dim, keys.to(x.device))


def _block_masks(layout: dict, attention_mask: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
    """Each block's mask, (R, 1, block, keys), additive in ``dtype`` (0 where a query sees a key, -inf elsewhere, as
    sdpa reads a boolean mask): made at the first layer of a forward, reused by the others."""
    cache_key = (attention_mask.data_ptr(), tuple(attention_mask.shape), attention_mask.device, dtype)
    cached = layout["masks"].get(cache_key)
    if cached is None:
        cached = []
        for start, stop, keys in layout["blocks"]:
            part = _take(attention_mask[:, :, start:stop], keys, dim=-1)
            if part.dtype == torch.bool:
                part = torch.zeros(part.shape, dtype=dtype, device=part.device).masked_fill_(~part, float("-inf"))
            cached.append(part.to(dtype).contiguous())
        layout["masks"] = {cache_key: cached}  # one forward's masks at a time
    return cached


def _sdpa_attention(query, key, value, mask, scale: float, dropout: float) -> torch.Tensor:
    """One block's attention by torch's sdpa: query (R, H, B, D), key (R, Hkv, n, D), value (R, Hkv, n, Dv), an
    additive mask (R, 1, B, n); (R, H, B, Dv). Key/value heads are read for their query heads without copies."""
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scale,
                                          enable_gqa=query.shape[1] != key.shape[1])


def _folded_attention(query, key, value, mask, scale: float, dropout: float = 0.0) -> torch.Tensor:
    """``_sdpa_attention`` without dropout as two matmuls a key/value head: the query heads that share one (heads
    ``j * g`` to ``j * g + g - 1`` for head j, as transformers' ``repeat_kv`` pairs them) are folded into the rows of
    one product, which on a CPU beats sdpa's kernel on blocks of a few dozen queries. The softmax runs in fp32, as
    transformers' eager attention runs it."""
    rows, heads, block, dim = query.shape
    groups = key.shape[1]
    scores = torch.matmul(query.reshape(rows, groups, heads // groups * block, dim), key.transpose(-1, -2))
    scores = scores.view(rows, groups, heads // groups, block, -1).mul_(scale).add_(mask.unsqueeze(1))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    return torch.matmul(probs.view(rows, groups, heads // groups * block, -1), value).view(rows, heads, block, -1)


def shared_rows_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention over the rows gathered from one sequence of distinct positions: ``query``, ``key``, ``value``
    (1, heads, U, head_dim); returns (1, U, heads, head_dim) as attention functions do. Each block of query columns
    (``query_blocks``) attends to only the keys its mask lets it see (the keys left out are masked for all of its
    queries, so the softmax is the same): by ``_folded_attention`` on a device of ``FOLDED_DEVICES``, else by torch's
    sdpa (``_sdpa_attention``); a layout of one block, or an attention with extras (a softcap, a position bias,
    sinks), runs transformers' own sdpa call on the whole rows."""
    layout = _LAYOUT.get()
    if layout is None:
        raise RuntimeError(f"attention {ATTENTION_NAME!r} runs only inside swiftkv.measure.shared_rows.shared_rows")
    gather, source = (layout[x].to(query.device) for x in ("gather", "source"))  # no-ops unless layers spread
    rows, width = gather.shape
    flat = gather.reshape(-1)

    def as_rows(x: torch.Tensor) -> torch.Tensor:  # (1, H, U, D) -> (R, H, W, D)
        return x[0].index_select(1, flat).unflatten(1, (rows, width)).transpose(0, 1)

    query, key, value = as_rows(query), as_rows(key), as_rows(value)
    if any(kwargs.get(name) is not None for name in _FULL_ONLY) or len(layout["blocks"]) == 1:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)  # (R, W, H, D)
    else:
        scale, dropout = kwargs.get("scaling"), kwargs.get("dropout", 0.0)
        scale = query.shape[-1] ** -0.5 if scale is None else scale
        masks = _block_masks(layout, attention_mask, query.dtype)
        attend = _folded_attention if query.device.type in FOLDED_DEVICES and not dropout else _sdpa_attention
        out = query.new_empty(rows, width, query.shape[1], value.shape[-1])
        for (start, stop, keys), mask in zip(layout["blocks"], masks):
            out[:, start:stop] = attend(query[:, :, start:stop], _take(key, keys), _take(value, keys), mask, scale,
                                        dropout).transpose(1, 2)  # (R, H, block, D) -> (R, block, H, D)
    return out.flatten(0, 1).index_select(0, source).unsqueeze(0), None  # (R, W, H, D) -> (1, U, H, D)


AttentionInterface.register(ATTENTION_NAME, shared_rows_attention)


@contextlib.contextmanager
def shared_rows(model: torch.nn.Module, gather: torch.Tensor, source: torch.Tensor, blocks=None):
    """Within the block, ``model``'s attention layers run ``shared_rows_attention`` with this layout; ``blocks``
    (``query_blocks`` of the rows' mask) splits each row's queries, default one block over all keys."""
    config = model.config
    saved = config._attn_implementation
    width = gather.shape[1]
    if blocks is None:
        blocks = ((0, width, np.arange(width)),)
    layout = {"gather": gather, "source": source, "masks": {},
              "blocks": tuple((start, stop, _key_selector(keys)) for start, stop, keys in blocks)}
    token = _LAYOUT.set(layout)
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = saved
        _LAYOUT.reset(token)
