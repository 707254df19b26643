"""Bootstrap confidence intervals over examples (scipy.stats.bootstrap), for scores, averages and differences.

- one task: the mean of per-example scores;
- an average over tasks: the mean of per-task means, resampling examples *within* each task (stratified), so that
  every task keeps its size and the average weighs tasks equally, as the paper's "Avg." column does;
- a difference between two rows: per-example differences on the same examples (paired), then as above;
- a ratio of sums (perplexity, KL per token): documents resampled with their numerator and denominator together.

Percentile intervals (robust when per-example scores are 0/1 and a resample can be degenerate).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float

    def excludes(self, x: float = 0.0) -> bool:
        return not (self.low <= x <= self.high)

    def scaled(self, factor: float) -> "Interval":
        return Interval(self.value * factor, self.low * factor, self.high * factor)


@dataclass(frozen=True)
class BootstrapSettings:
    resamples: int = 2000
    confidence: float = 0.95
    seed: int = 0


def _bootstrap(data: tuple, statistic, settings: BootstrapSettings, paired: bool = False) -> tuple[float, float]:
    res = stats.bootstrap(
        data,
        statistic,
        n_resamples=settings.resamples,
        confidence_level=settings.confidence,
        method="percentile",
        paired=paired,
        vectorized=True,
        random_state=np.random.default_rng(settings.seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def mean_ci(x, settings: BootstrapSettings = BootstrapSettings()) -> Interval:
    """Mean of ``x`` with its bootstrap interval."""
    x = np.asarray(x, dtype=float)
    if len(x) < 2 or np.all(x == x[0]):
        return Interval(float(x.mean()), float(x.mean()), float(x.mean())) if len(x) else Interval(np.nan, np.nan, np.nan)
    low, high = _bootstrap((x,), lambda a, axis=-1: a.mean(axis=axis), settings)
    return Interval(float(x.mean()), low, high)


def macro_mean_ci(groups: list, settings: BootstrapSettings = BootstrapSettings()) -> Interval:
    """Mean over groups of each group's mean; examples are resampled within each group (stratified)."""
    groups = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not groups:
        return Interval(np.nan, np.nan, np.nan)
    value = float(np.mean([g.mean() for g in groups]))
    varying = [g for g in groups if len(g) > 1 and not np.all(g == g[0])]
    if not varying:
        return Interval(value, value, value)
    fixed = sum(g.mean() for g in groups if not any(g is v for v in varying))

    def statistic(*samples, axis=-1):
        return (fixed + sum(s.mean(axis=axis) for s in samples)) / len(groups)

    low, high = _bootstrap(tuple(varying), statistic, settings)
    return Interval(value, low, high)


def paired_difference_ci(a: list, b: list, settings: BootstrapSettings = BootstrapSettings()) -> Interval:
    """Macro mean of per-example differences a - b (each pair of arrays aligned on the same examples)."""
    diffs = []
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        if x.shape != y.shape:
            raise ValueError("paired arrays must hold the same examples")
        diffs.append(x - y)
    return macro_mean_ci(diffs, settings)


def ratio_ci(numerator, denominator, settings: BootstrapSettings = BootstrapSettings(), transform=None) -> Interval:
    """sum(numerator) / sum(denominator) (then ``transform``), documents resampled as pairs."""
    num, den = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    f = transform or (lambda v: v)

    def statistic(n, d, axis=-1):
        return f(n.sum(axis=axis) / d.sum(axis=axis))

    value = float(f(num.sum() / den.sum()))
    if len(num) < 2:
        return Interval(value, value, value)
    low, high = _bootstrap((num, den), statistic, settings, paired=True)
    lo, hi = sorted((low, high))
    return Interval(value, lo, hi)


def paired_ratio_difference_ci(num_a, den_a, num_b, den_b, settings: BootstrapSettings = BootstrapSettings(),
                               transform=None) -> Interval:
    """f(sum a_num / sum a_den) - f(sum b_num / sum b_den) over the same documents, resampled together."""
    arrays = [np.asarray(v, dtype=float) for v in (num_a, den_a, num_b, den_b)]
    f = transform or (lambda v: v)

    def statistic(na, da, nb, db, axis=-1):
        return f(na.sum(axis=axis) / da.sum(axis=axis)) - f(nb.sum(axis=axis) / db.sum(axis=axis))

    value = float(statistic(*arrays))
    if len(arrays[0]) < 2:
        return Interval(value, value, value)
    low, high = _bootstrap(tuple(arrays), statistic, settings, paired=True)
    return Interval(value, *sorted((low, high)))


def median_ci(x, settings: BootstrapSettings = BootstrapSettings()) -> Interval:
    """Median of ``x`` with its bootstrap interval (e.g. per-repeat speedups: with 5 repeats, about [min, max])."""
    x = np.asarray(x, dtype=float)
    if not len(x):
        return Interval(np.nan, np.nan, np.nan)
    value = float(np.median(x))
    if len(x) < 2 or np.all(x == x[0]):
        return Interval(value, value, value)
    low, high = _bootstrap((x,), lambda a, axis=-1: np.median(a, axis=axis), settings)
    return Interval(value, low, high)


def paired_median_ratio_ci(a, b, settings: BootstrapSettings = BootstrapSettings()) -> Interval:
    """median(a) / median(b) over paired items (the same requests of two runs, in the order they were sent),
    resampled together in circular blocks of consecutive requests (``block_indices``): a request that waited behind
    a slow one is slow too (lag-1 autocorrelation ~0.5 at 1 req/s), so resampling requests one by one would treat
    neighbours as independent and give too narrow an interval. Percentile interval."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError("paired arrays must hold the same items")
    value = float(np.median(a) / np.median(b)) if len(a) else np.nan
    if len(a) < 2:
        return Interval(value, value, value)
    idx = block_indices(len(a), settings.resamples, np.random.default_rng(settings.seed))
    ratios = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    alpha = (1 - settings.confidence) / 2
    low, high = np.quantile(ratios, [alpha, 1 - alpha])
    return Interval(value, float(low), float(high))


def median_difference_ci(a, b, settings: BootstrapSettings = BootstrapSettings()) -> Interval:
    """median(a) - median(b) of two independent samples (each resampled on its own), with its interval."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    value = float(np.median(a) - np.median(b)) if len(a) and len(b) else np.nan
    if len(a) < 2 or len(b) < 2:
        return Interval(value, value, value)

    def statistic(x, y, axis=-1):
        return np.median(x, axis=axis) - np.median(y, axis=axis)

    low, high = _bootstrap((a, b), statistic, settings)
    return Interval(value, *sorted((low, high)))


def _seed_rows(a, b):
    """Per-seed rows of per-example values as 2-D float arrays (one row per seed), ``b`` paired with ``a`` (the same
    examples per task) or None."""
    a = [np.atleast_2d(np.asarray(x, dtype=float)) for x in a]
    b = None if b is None else [np.atleast_2d(np.asarray(x, dtype=float)) for x in b]
    if b is not None and [x.shape[1] for x in a] != [y.shape[1] for y in b]:
        raise ValueError("paired rows must hold the same examples per task")
    return a, b


def hierarchical_difference_ci(a: list, b: list | None = None,
                               settings: BootstrapSettings = BootstrapSettings()) -> Interval:
    """Macro mean over tasks of (seed-mean of a) - (seed-mean of b), with an interval that carries both training-seed
    and example variance: a two-level bootstrap that resamples seeds (each row's own, with replacement) and, within
    them, examples (stratified by task and shared by both rows: the rows are paired on examples).

    ``a`` and ``b``: one array per task of shape (seeds, examples), the same examples in the same order for both rows
    (a row without a training seed, the base model, has one). ``b`` None: the macro mean of ``a`` itself. With few
    seeds (3) the seed level is coarse and percentile intervals run narrow (too narrow to pool seeds: see
    ``seed_difference_ci``); with one seed it is the paired example bootstrap of a single run (analysis.seeds'
    per-seed rows)."""
    a, b = _seed_rows(a, b)
    if not a or any(x.shape[1] == 0 for x in a):
        return Interval(np.nan, np.nan, np.nan)

    def row_value(x):
        return x.mean(axis=1).mean(axis=0)  # per seed, then over seeds

    value = float(np.mean([row_value(x) - (row_value(y) if b is not None else 0.0)
                           for x, y in zip(a, b if b is not None else a)]))
    rng = np.random.default_rng(settings.seed)
    R = settings.resamples
    seeds_a = rng.integers(0, a[0].shape[0], size=(R, a[0].shape[0]))
    seeds_b = rng.integers(0, b[0].shape[0], size=(R, b[0].shape[0])) if b is not None else None
    total = np.zeros(R)
    for t, x in enumerate(a):
        idx = rng.integers(0, x.shape[1], size=(R, x.shape[1]))  # examples, shared by a and b
        part = x[seeds_a[:, :, None], idx[:, None, :]].mean(axis=2).mean(axis=1)
        if b is not None:
            part = part - b[t][seeds_b[:, :, None], idx[:, None, :]].mean(axis=2).mean(axis=1)
        total += part
    total /= len(a)
    alpha = (1 - settings.confidence) / 2
    low, high = np.quantile(total, [alpha, 1 - alpha])
    return Interval(value, float(low), float(high))


def seed_difference_ci(a: list, b: list | None = None, confidence: float = 0.95) -> Interval:
    """Macro mean over tasks of (seed mean of ``a``) - (seed mean of ``b``), with an interval that carries training
    seeds and the report split's examples together (the pooled rows of reports/seeds.csv).

    ``a`` and ``b``: one array per task of shape (seeds, examples), the same examples in the same order for both rows;
    a row without training seeds (the base model, the untrained rewiring) has one row and no training variance.
    ``b`` None: the macro mean of ``a`` itself. Two sources, each with its own quantile, combined in quadrature:

    - training: a seed-level t interval, ``t(n - 1) * sd(per-seed macro averages) / sqrt(n)`` per trained row (the
      two rows' seeds are separate runs: unpaired, which is conservative where a seed's data stream makes two rows'
      seeds alike);
    - examples: ``z * sqrt(sum_t var_t / n_t) / T``, the stratified standard error of the macro mean of the
      per-example differences of seed means (the report split is a sample of each task too).

    Half-width = sqrt(training**2 + examples**2). With 3 seeds the training part uses t(2) = 4.30: the price of three
    seeds, which a percentile bootstrap over three seeds hides. By simulation (tests/test_stats_coverage.py) this
    covers a known difference 95-99% of the time with 3 seeds whether seeds vary little or dominate (seed SD 0 to
    6 points against ~2 points of example standard error), where the two-level percentile bootstrap covered 98% down
    to 80% as the seed SD grew, and a Welch-Satterthwaite t interval 92% when seeds dominate.
    A row with a single seed contributes no training variance (none can be estimated): such a point is not seeded
    and its claim stays provisional (analysis.evidence)."""
    a, b = _seed_rows(a, b)
    if not a or any(x.shape[1] == 0 for x in a):
        return Interval(np.nan, np.nan, np.nan)
    rows = [a] if b is None else [a, b]
    value = float(np.mean([x.mean(axis=1).mean() for x in a])
                  - (np.mean([y.mean(axis=1).mean() for y in b]) if b is not None else 0.0))
    upper = 0.5 + confidence / 2
    half_sq = 0.0
    for row in rows:
        n = row[0].shape[0]
        if n > 1:
            per_seed = np.mean([x.mean(axis=1) for x in row], axis=0)  # (seeds,) macro averages
            half_sq += float(stats.t.ppf(upper, n - 1)) ** 2 * float(np.var(per_seed, ddof=1)) / n
    diffs = [x.mean(axis=0) - (y.mean(axis=0) if b is not None else 0.0) for x, y in zip(a, b or a)]
    if min(len(d) for d in diffs) > 1:
        var_ex = sum(np.var(d, ddof=1) / len(d) for d in diffs) / len(diffs) ** 2
        half_sq += float(stats.norm.ppf(upper)) ** 2 * float(var_ex)
    half = half_sq**0.5
    return Interval(value, value - half, value + half)


def block_length(n: int) -> int:
    """Block length of the circular block bootstrap for ``n`` consecutive items: the n^(1/3) rule, rounded up."""
    return max(1, int(np.ceil(n ** (1 / 3))))


def block_indices(n: int, resamples: int, rng: np.random.Generator, block: int | None = None) -> np.ndarray:
    """(resamples, n) indices of a circular block bootstrap: runs of ``block`` consecutive items from random
    starts, wrapping at the end, so that items correlated with their neighbours (requests queued behind one
    another) are resampled together."""
    block = block or block_length(n)
    starts = rng.integers(0, n, size=(resamples, -(-n // block)))
    return ((starts[:, :, None] + np.arange(block)) % n).reshape(resamples, -1)[:, :n]
