"""The analytical model: SwiftKV speedup predicted from FLOPs and a workload's input/output lengths.

time ~ FLOPs, so for requests (n_in, n_out):
    speedup = sum(n_in * prefill_base + n_out * decode) / sum(n_in * prefill_swiftkv + n_out * decode)
with per-token FLOPs from ``swiftkv.flops`` (prefill at the prompt's length, decode at the mean context while
generating). Only the prompt tokens get cheaper, so the predicted speedup grows with the input/output ratio
towards the prefill-only bound — the paper's workload-asymmetry argument as a formula.
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
        from swiftkv.flops import decode_flops_per_token, prefill_flops_per_token
    except ImportError:  # the FLOPs accounting lands with the analysis issue
        logger.warning("swiftkv.flops is not available: predicted speedups are left empty")
        return None
    return prefill_flops_per_token, decode_flops_per_token


def workload_flops(config, lengths: Iterable[tuple[int, int]], num_key_value_layers: int | None = None,
                   key_value_group_size: int = 1) -> float | None:
    """Total GFLOPs of serving requests with (input, output) lengths, for the base (l=None) or a SwiftKV wiring."""
    fns = _flops_functions()
    if fns is None:
        return None
    prefill, decode = fns
    total = 0.0
    for (n_in, n_out), count in Counter(lengths).items():
        p = prefill(config, num_key_value_layers=num_key_value_layers, key_value_group_size=key_value_group_size,
                    context_length=n_in)["total"]
        d = decode(config, context_length=n_in + n_out // 2)["total"]
        total += count * (n_in * p + n_out * d)
    return total


def predicted_speedup(config, lengths: list[tuple[int, int]], num_key_value_layers: int | None,
                      key_value_group_size: int = 1) -> float | None:
    """Base FLOPs / SwiftKV FLOPs of the workload; 1.0 for the base itself; None without ``swiftkv.flops``."""
    if num_key_value_layers is None:
        return 1.0 if _flops_functions() is not None else None
    base = workload_flops(config, lengths)
    swift = workload_flops(config, lengths, num_key_value_layers, key_value_group_size)
    if base is None or not swift:
        return None
    return base / swift
