"""The analytical model: SwiftKV speedup predicted from FLOPs and a workload's input/output lengths.

time ~ FLOPs, so for requests (n_in, n_out), summed over the workload:
    FLOPs = prefill(n_in prompt tokens, as one forward runs them) + (n_out - 1) * decode(mean context)
    speedup = FLOPs(base) / FLOPs(SwiftKV at l, g)
with ``swiftkv.measure.flops.prefill_flops`` (the real forward: all prompt positions through layers < l, only the last
through layers >= l and the LM head; it also yields the first output token) and ``decode_flops_per_token`` for
the other tokens, less the input-embedding matmul that the paper's convention counts (a lookup when serving).
Only the prompt gets cheaper, so the prediction grows with the input/output ratio towards the prefill-only
bound: the paper's workload-asymmetry argument as a formula.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from typing import Iterable

logger = logging.getLogger(__name__)


@functools.cache
def _flops_functions():
    try:
        from swiftkv.measure.flops import decode_flops_per_token, prefill_flops
    except ImportError:  # the FLOPs accounting lands with the analysis issue
        logger.warning("swiftkv.measure.flops is not available: predicted speedups are left empty")
        return None
    return prefill_flops, decode_flops_per_token


def workload_flops(config, lengths: Iterable[tuple[int, int]], num_key_value_layers: int | None = None,
                   key_value_group_size: int = 1) -> float | None:
    """Total FLOPs of serving requests with (input, output) lengths, for the base (l=None) or a SwiftKV wiring."""
    fns = _flops_functions()
    if fns is None:
        return None
    prefill, decode = fns
    total = 0.0
    for (n_in, n_out), count in Counter(lengths).items():
        p = prefill(config, n_in, num_key_value_layers, key_value_group_size, logits_to_keep=1)["total"]
        if n_out > 1:
            d = decode(config, context_length=n_in + n_out // 2)
            p += (n_out - 1) * (d["total"] - d["vocab"] / 2) * 1e9  # GFLOPs per token; embedding is a lookup
        total += count * p
    return total


def predicted_speedup(config, lengths: list[tuple[int, int]], num_key_value_layers: int | None,
                      key_value_group_size: int = 1) -> float | None:
    """Base FLOPs / SwiftKV FLOPs of the workload; 1.0 for the base itself; None without ``swiftkv.measure.flops``."""
    if num_key_value_layers is None:
        return 1.0 if _flops_functions() is not None else None
    base = workload_flops(config, lengths)
    swift = workload_flops(config, lengths, num_key_value_layers, key_value_group_size)
    if base is None or not swift:
        return None
    return base / swift
