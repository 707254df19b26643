"""One packed forward with every distinct position run once: the rows' shared ancestors are not copied.

``prefix_tree.plan_rows`` cuts the requests into rows, and a node that two rows of one forward need (a task's
instructions, a long context) is in both. Only attention needs the rows: every other part of a decoder layer (norms,
projections, MLP) works on each position alone. So the forward's input here is the distinct positions as one
sequence of U (each node once, in the column where it is scored, else where it first runs; row-major), and each
attention layer gathers the rows' queries, keys and values from it by a (rows, width) index, runs sdpa attention on
them with the rows' 4D mask, and takes each position's output back from its column. A node's copies see the same
ancestors at the same positions, so any copy's output is its output. A node's ancestors come before it in its row, so
the queries run in blocks of ``QUERY_BLOCK`` columns, each against the keys up to its last column only (about half the
attention work of the whole rows).

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
_LAYOUT: contextvars.ContextVar[tuple | None] = contextvars.ContextVar(
    "swiftkv_shared_rows", default=None)
_FULL_ONLY = ("softcap", "position_bias", "s_aux")  # attention extras that only transformers' own sdpa call handles
QUERY_BLOCK = 32  # query columns per sdpa call: each block's keys stop at its last column


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


def query_blocks(mask: np.ndarray, block: int | None = None) -> tuple[tuple[int, int, int, int], ...]:
    """(start, stop, first key, key stop) of each ``block`` (default ``QUERY_BLOCK``) query columns of a (R, 1, W, W)
    boolean mask: the keys any row's queries in the block may see lie in [first key, key stop). A column sees only its
    ancestors, which come before it, so a block's keys stop at its last column and the blocks' attention covers about
    half of W x W."""
    block = block or QUERY_BLOCK
    seen = mask[:, 0].any(axis=0)  # (W, W): a key any row's query sees
    width = seen.shape[0]
    out = []
    for start in range(0, width, block):
        stop = min(width, start + block)
        keys = np.flatnonzero(seen[start:stop].any(axis=0))
        out.append((start, stop, int(keys[0]), int(keys[-1]) + 1))  # every column sees itself: never empty
    return tuple(out)


def shared_rows_attention(module, query, key, value, attention_mask, **kwargs):
    """sdpa attention over the rows gathered from one sequence of distinct positions: ``query``, ``key``, ``value``
    (1, heads, U, head_dim); returns (1, U, heads, head_dim) as attention functions do. Each block of query columns
    (``query_blocks``) runs torch's sdpa on only the keys its mask lets it see (the keys left out are masked for all of
    its queries, so the softmax is the same), key/value heads shared by their query heads without copies; a layout of
    one block, or an attention with extras (a softcap, a position bias, sinks), runs transformers' own sdpa call."""
    layout = _LAYOUT.get()
    if layout is None:
        raise RuntimeError(f"attention {ATTENTION_NAME!r} runs only inside swiftkv.measure.shared_rows.shared_rows")
    gather, source, blocks = layout
    gather, source = (x.to(query.device) for x in (gather, source))  # a no-op unless accelerate spread the layers
    rows, width = gather.shape
    flat = gather.reshape(-1)

    def as_rows(x: torch.Tensor) -> torch.Tensor:  # (1, H, U, D) -> (R, H, W, D)
        return x[0].index_select(1, flat).unflatten(1, (rows, width)).transpose(0, 1)

    query, key, value = as_rows(query), as_rows(key), as_rows(value)
    if any(kwargs.get(name) is not None for name in _FULL_ONLY) or len(blocks) == 1:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)  # (R, W, H, D)
    else:
        gqa = query.shape[1] != key.shape[1]  # sdpa reads each key/value head for its query heads: no copies
        scale, dropout = kwargs.get("scaling"), kwargs.get("dropout", 0.0)
        out = torch.cat([F.scaled_dot_product_attention(
            query[:, :, start:stop], key[:, :, first:end], value[:, :, first:end],
            attn_mask=attention_mask[:, :, start:stop, first:end], dropout_p=dropout, scale=scale, enable_gqa=gqa)
            for start, stop, first, end in blocks], dim=2).transpose(1, 2)  # (R, H, W, D) -> (R, W, H, D)
    return out.flatten(0, 1).index_select(0, source).unsqueeze(0), None  # (R, W, H, D) -> (1, U, H, D)


AttentionInterface.register(ATTENTION_NAME, shared_rows_attention)


@contextlib.contextmanager
def shared_rows(model: torch.nn.Module, gather: torch.Tensor, source: torch.Tensor, blocks=None):
    """Within the block, ``model``'s attention layers run ``shared_rows_attention`` with this layout; ``blocks``
    (``query_blocks`` of the rows' mask) splits each row's queries, default one block over all keys."""
    config = model.config
    saved = config._attn_implementation
    width = gather.shape[1]
    token = _LAYOUT.set((gather, source, tuple(blocks) if blocks is not None else ((0, width, 0, width),)))
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = saved
        _LAYOUT.reset(token)
