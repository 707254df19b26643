"""Intervals that do not flatter (issue 30): by simulation, the pooled-seeds interval covers a known difference at
least 93% of the time at 95% nominal with 3 training seeds, and the percentile bootstrap over seeds it replaces does
not (so the check can fail); latency intervals resample blocks of consecutive requests."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.stats import (BootstrapSettings, block_indices, block_length, hierarchical_difference_ci,
                            paired_median_ratio_ci, seed_difference_ci)

TASKS, EXAMPLES, SEEDS = 4, 60, 3
TRUE_DIFF = -3.0  # points: what the simulated student loses against the base model, on average over seeds


def _simulate(rng: np.random.Generator, seed_sd: float, example_sd: float = 20.0, noise_sd: float = 10.0):
    """One simulated study, in points: per task a fresh sample of examples (each with its own difficulty, shared by
    both rows: paired), the base model once, the student with SEEDS training seeds whose effects vary by ``seed_sd``;
    the population difference (over examples and seeds) is TRUE_DIFF."""
    base, student = [], []
    seed_effect = rng.normal(0.0, seed_sd, size=(SEEDS, 1))
    for _ in range(TASKS):
        difficulty = rng.normal(50.0, example_sd, size=EXAMPLES)
        base.append((difficulty + rng.normal(0.0, noise_sd, size=EXAMPLES))[None])
        student.append(difficulty + TRUE_DIFF + seed_effect + rng.normal(0.0, noise_sd, size=(SEEDS, EXAMPLES)))
    return student, base


def coverage(interval, seed_sd: float, runs: int, seed: int = 0) -> float:
    """The share of simulated studies whose interval holds TRUE_DIFF."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(runs):
        student, base = _simulate(rng, seed_sd)
        ci = interval(student, base)
        hits += ci.low <= TRUE_DIFF <= ci.high
    return hits / runs


@pytest.mark.parametrize("seed_sd", [0.0, 1.5, 3.0])
def test_pooled_seed_interval_covers_a_known_difference_with_three_seeds(seed_sd):
    # seed SD 1.0-1.7 points is what the committed seeds study measured; 0 and 3 bracket it
    assert coverage(seed_difference_ci, seed_sd, runs=2000) >= 0.93


def test_the_percentile_bootstrap_over_three_seeds_is_too_narrow():
    """The planted violation: the interval the seeds table used before (a two-level percentile bootstrap) misses
    the known difference far more often than 5% when seeds vary, and the coverage check catches it."""
    fast = BootstrapSettings(resamples=400)
    boot = coverage(lambda a, b: hierarchical_difference_ci(a, b, fast), seed_sd=3.0, runs=300)
    assert boot < 0.93
    assert coverage(seed_difference_ci, seed_sd=3.0, runs=300) >= 0.93


def test_seed_interval_widens_with_seed_spread_and_handles_rows_without_seeds():
    rng = np.random.default_rng(1)
    base = [rng.normal(50, 20, size=(1, 80))]
    same = [np.repeat(base[0] - 2.0, 3, axis=0)]
    spread = [same[0] + np.array([[-4.0], [0.0], [4.0]])]
    narrow, wide = seed_difference_ci(same, base), seed_difference_ci(spread, base)
    assert narrow.value == pytest.approx(-2.0) and wide.value == pytest.approx(-2.0)
    assert wide.high - wide.low > 5 * (narrow.high - narrow.low)
    one = seed_difference_ci([same[0][:1]], base)  # one seed: examples only
    assert one.low == pytest.approx(-2.0) and one.high == pytest.approx(-2.0)  # identical differences
    with pytest.raises(ValueError):
        seed_difference_ci([np.ones((2, 10))], [np.ones((1, 9))])


def test_block_bootstrap_keeps_neighbours_together():
    rng = np.random.default_rng(0)
    idx = block_indices(50, 100, rng)
    assert idx.shape == (100, 50) and block_length(50) == 4
    steps = np.diff(idx, axis=1)
    assert ((steps == 1) | (steps == -49)).mean() > 0.7  # most neighbours stay neighbours (blocks of 4: 3 in 4)
    # autocorrelated latencies (a queue): the block interval is wider than one that resamples requests singly
    n, rho = 200, 0.8
    noise = rng.normal(size=(2, n))
    series = np.zeros((2, n))
    for t in range(1, n):
        series[:, t] = rho * series[:, t - 1] + noise[:, t]
    a, b = np.exp(0.3 * series[0]) * 100, np.exp(0.3 * series[1]) * 100
    blocked = paired_median_ratio_ci(a, b)
    singles = np.random.default_rng(0).integers(0, n, size=(2000, n))
    iid = np.quantile(np.median(a[singles], axis=1) / np.median(b[singles], axis=1), [0.025, 0.975])
    assert blocked.high - blocked.low > iid[1] - iid[0]
