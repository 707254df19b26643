"""Row bookkeeping of the prefill skip that needs only torch (tested without vLLM)."""

from __future__ import annotations

import torch


def merge_sampled_rows(stream: torch.Tensor, index: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """``stream`` (N, H) with row ``index[j]`` replaced by ``hidden[j]`` for every real entry of the engine's padded
    sampled-token indices; the other rows keep h_l (the engine never reads them).

    The engine pads ``index`` by repeating its last entry, and real entries strictly increase, so an entry equal to
    the one before it is padding; padding rows are sent to a scratch row N. No host read of the real count, so the
    same code runs inside a captured CUDA graph."""
    index = index.long()
    real = torch.ones_like(index, dtype=torch.bool)
    real[1:] = index[1:] != index[:-1]
    target = torch.where(real, index, torch.full_like(index, stream.shape[0]))  # n
    out = torch.cat([stream, stream[:1]])  # N + 1, H: the last row takes the padding
    out.index_copy_(0, target, hidden)
    return out[:-1]
