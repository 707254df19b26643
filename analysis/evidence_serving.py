"""The evidence of the serving claims (``analysis/claims.yaml``): the raw results of ``reports/raw/serving/<study>``,
every point with its interval, registered into ``analysis.evidence.EVALUATORS`` (``analysis.evidence.evaluators()`` imports this module)."""

from __future__ import annotations

import math
from pathlib import Path

from analysis.evidence import MIN_REPEATS, Evidence, NoEvidence, _csv, _single_run, evaluates, num
from analysis.rules import Point

MIN_REQUESTS = 50  # requests per latency rate (registry: ">= 50 requests")
SWIFTKV, ACROSSKV, REFERENCE = "swiftkv-50", "swiftkv-50-acrosskv-3", "base"


def _serving(reports: Path, study: str):
    """The measured rows of a serving study as committed in reports/raw/serving/<study> (every result file of its
    manifest), and the manifest's path; a missing folder is no evidence."""
    from analysis.raw import MANIFEST, serving_raw
    from analysis.serving import load_study

    root = Path(serving_raw(study, reports))
    if not (root / MANIFEST).is_file():
        raise NoEvidence(str(root), f"{serving_raw(study, reports.name)} is missing (rule raw_serving)")
    return load_study(root), str(root / MANIFEST)


def _engine_point(row, key: str, unit: str) -> str:
    return f"{row['engine']} {row[key]:g} {unit}"


def _interval_point(label: str, row, name: str, enough: bool) -> Point:
    """A point from an interval column set of analysis.serving (``name``, ``_lo``, ``_hi``, noise); below the
    registered repeats or requests it has an estimate but no interval (it cannot decide)."""
    lo, hi = (num(row[f"{name}_lo"]), num(row[f"{name}_hi"])) if enough else (math.nan, math.nan)
    return Point(label, num(row[name]), lo, hi, noise=(num(row[f"{name}_noise_lo"]), num(row[f"{name}_noise_hi"])))


@evaluates("throughput-gain")
def _throughput_gain(reports: Path) -> Evidence:
    """Per (engine, input length >= 1024): SwiftKV 50% over base, median of interleaved rounds' ratios."""
    from analysis.serving import speedup_intervals

    df, path = _serving(reports, "throughput")
    rows = speedup_intervals(df)
    rows = rows[(rows["variant"] == SWIFTKV) & (rows["input_len"] >= 1024)]
    if rows.empty:
        raise NoEvidence(path, f"no {SWIFTKV} row at an input length >= 1024 in {path}")
    enough = rows["n_repeats"].fillna(0) >= MIN_REPEATS
    points = [_interval_point(_engine_point(r, "input_len", "tokens in"), r, "speedup_paired", ok)
              for (_, r), ok in zip(rows.iterrows(), enough)]
    return _rounds_evidence(points, path, bool(enough.all()), "points", "")


def _rounds_evidence(points: list[Point], path: str, enough: bool, unit: str, none: str) -> Evidence:
    """The evidence of a claim read from interleaved rounds: decided only if every point had the registered
    repeats; ``none``: why there is no point."""
    if not points:
        raise NoEvidence(path, none)
    return Evidence(points, [path], powered=enough,
                    short="" if enough else f"some {unit} have fewer than {MIN_REPEATS} interleaved repeats")


@evaluates("ttft-lower", metric="ttft")
@evaluates("tpot-lower", metric="tpot", skip_lowest=True)
def _latency(reports: Path, metric: str, skip_lowest: bool = False) -> Evidence:
    """Per (engine, request rate): SwiftKV 50%'s median TTFT (or TPOT) over base's, on the same requests."""
    from analysis.serving import latency_intervals

    df, path = _serving(reports, "latency")
    rows = latency_intervals(df)
    rows = rows[rows["variant"] == SWIFTKV].sort_values(["engine", "request_rate"])
    if rows.empty:
        raise NoEvidence(path, f"no {SWIFTKV} row in {path}")
    enough = rows["n_requests_timed"].fillna(0) >= MIN_REQUESTS
    points, note = [], []
    for (_, r), ok in zip(rows.iterrows(), enough):
        p = _interval_point(_engine_point(r, "request_rate", "req/s"), r, f"{metric}_ratio", ok)
        lowest = r["request_rate"] == rows.loc[rows["engine"] == r["engine"], "request_rate"].min()
        if skip_lowest and lowest:  # registered: reported, not deciding (the paper expects no change there)
            note.append(f"{p.label}: {p.estimate:.4g} [{p.lo:.4g}, {p.hi:.4g}] (lowest rate, not deciding)")
        else:
            points.append(p)
    return Evidence(points, [path], powered=bool(enough.all()), note="; ".join(note),
                    short="" if enough.all() else f"some rates have fewer than {MIN_REQUESTS} requests")


def _rounds(g, key: str) -> dict:
    """Per (point key, variant) of one engine's rows (the noise-floor copy as ``<reference>-again``): the throughput
    of every round."""
    return {(r[key], r["variant"]): r.get("throughput_runs_tok_s") for _, r in g.iterrows()}


@evaluates("acrosskv-helps-under-memory-limits")
def _memory_limits(reports: Path) -> Evidence:
    """Per engine: (AcrossKV / SwiftKV 50%) throughput at the smallest KV limit minus at the largest, each the median
    of the rounds' ratios, the difference's interval by resampling each limit's rounds; its noise floor is the same
    statistic for the base model measured twice in the same rounds (base-again / base), which the effect must clear.
    An engine decides only where the smallest limit binds (amended 2026-12-05): there, AcrossKV ran more requests at
    once than SwiftKV (``analysis.serving.concurrency``); else its point has no interval. Without the raw serving
    results, the single-run Table 3 stands in."""
    from analysis.serving import concurrency, round_ratios
    from analysis.stats import median_difference_ci

    try:
        df, path = _serving(reports, "kv-limit")
    except NoEvidence:
        return _memory_limits_table(reports)
    df = df.assign(concurrency=concurrency(df))
    points, enough, unbound = [], True, []
    for engine, g in df.groupby("engine"):
        runs = _rounds(g, "kv_limit_bytes")
        at_once = {(r["kv_limit_bytes"], r["variant"]): r["concurrency"] for _, r in g.iterrows()}
        by_limit = {k: round_ratios(runs.get((k, ACROSSKV)), runs.get((k, SWIFTKV))) for k, _ in runs}
        limits = sorted(k for k, v in by_limit.items() if v is not None)
        if len(limits) < 2:
            continue
        ends = (limits[0], limits[-1])
        est = median_difference_ci(*(by_limit[k] for k in ends))
        noise = [round_ratios(runs.get((k, f"{REFERENCE}-again")), runs.get((k, REFERENCE))) for k in ends]
        floor = median_difference_ci(*noise) if all(noise) else None
        n = min(len(by_limit[k]) for k in ends)
        across, swift = (at_once.get((ends[0], v), math.nan) for v in (ACROSSKV, SWIFTKV))
        binds = across > swift  # False where either is unknown (NaN)
        if not binds:
            at = f"{engine}: at {ends[0] / 2**20:g} MiB"
            unbound.append(f"{at} the requests run at once were not recorded" if math.isnan(across + swift) else
                           f"{at} AcrossKV ran {across:g} and SwiftKV {swift:g} requests at once")
        enough &= n >= MIN_REPEATS and floor is not None and binds
        lo, hi = (est.low, est.high) if n >= MIN_REPEATS and binds else (math.nan, math.nan)
        points.append(Point(f"{engine}: {limits[0] / 2**20:g} vs {limits[-1] / 2**20:g} MiB ({n} repeats, "
                            f"{_n(across)} vs {_n(swift)} requests at once)",
                            est.value, lo, hi, noise=(floor.low, floor.high) if floor else (math.nan, math.nan)))
    if points and unbound:
        why = ("the smallest limit does not bind (AcrossKV must run more requests at once than SwiftKV there): "
               + "; ".join(unbound))
        return Evidence(points, [path], short=why, note=why)
    return _rounds_evidence(points, path, enough, "limits", f"no engine with {ACROSSKV} and {SWIFTKV} at two KV "
                            f"limits in {path}")


def _n(value: float) -> str:
    return "?" if math.isnan(value) else f"{value:g}"


def _memory_limits_table(reports: Path) -> Evidence:
    """The single-run reading of Table 3 (no interval): stands in until the raw serving results are committed."""
    df, path = _csv(reports, "table3.csv")
    df = df[df.status == "measured"].copy()
    df["mib"] = df.kv_limit.str.extract(r"([\d.]+)\s*MiB", expand=False).astype(float)
    points = []
    for engine, g in df.groupby("engine"):
        t = g.pivot_table(index="mib", columns="variant", values="throughput_tok_s")
        if {SWIFTKV, ACROSSKV} - set(t.columns) or len(t) < 2:
            continue
        ratio = (t[ACROSSKV] / t[SWIFTKV]).sort_index()
        points.append(_single_run(f"{engine}: {ratio.index[0]:g} vs {ratio.index[-1]:g} MiB",
                                  ratio.iloc[0] - ratio.iloc[-1]))
    if not points:
        raise NoEvidence(path, f"no engine with two KV limits in {path}")
    return Evidence(points, [path])


MIN_RATIOS = 5  # registry (amended 2026-12-03): the ShareGPT trend decides only over >= 5 input/output ratios


def _spearman_ci(filters: list, ratios: list, rng, resamples: int) -> tuple[float, float, float]:
    """Spearman(filter, median ratio per filter) and its interval, rounds resampled within each filter."""
    import numpy as np
    from scipy.stats import spearmanr

    rho = spearmanr(filters, [np.median(r) for r in ratios]).statistic
    boot = [spearmanr(filters, [np.median(rng.choice(r, len(r))) for r in ratios]).statistic
            for _ in range(resamples)]
    lo, hi = np.nanpercentile(boot, [2.5, 97.5])
    return float(rho), float(lo), float(hi)


@evaluates("speedup-grows-with-input-output-ratio")
def _sharegpt_trend(reports: Path, resamples: int = 2000, seed: int = 0) -> Evidence:
    """Per engine: the Spearman correlation of the filter's minimum input/output ratio with the SwiftKV 50% speedup
    (each filter's median over rounds of the round's ratio); interval: rounds resampled within each filter; noise
    floor: the same correlation for the base model measured twice in the same rounds (base-again / base). Decided
    only over MIN_RATIOS filters (a rank correlation over 3 points takes 4 values); without the raw serving results,
    the single-run Table A.3 stands in."""
    import numpy as np

    from analysis.serving import round_ratios

    try:
        df, path = _serving(reports, "sharegpt")
    except NoEvidence:
        return _sharegpt_trend_table(reports)
    rng = np.random.default_rng(seed)
    points, enough = [], True
    for engine, g in df.groupby("engine"):
        runs = _rounds(g, "min_ratio")
        by_filter = {k: round_ratios(runs.get((k, SWIFTKV)), runs.get((k, REFERENCE))) for k, _ in runs}
        filters = sorted(k for k, v in by_filter.items() if v is not None)
        if len(filters) < 2:
            continue
        rho, lo, hi = _spearman_ci(filters, [np.array(by_filter[k]) for k in filters], rng, resamples)
        noise = [round_ratios(runs.get((k, f"{REFERENCE}-again")), runs.get((k, REFERENCE))) for k in filters]
        floor = _spearman_ci(filters, [np.array(x) for x in noise], rng, resamples) if all(noise) else None
        n = min(len(by_filter[k]) for k in filters)
        ok = n >= MIN_REPEATS and len(filters) >= MIN_RATIOS and floor is not None
        enough &= ok
        points.append(Point(f"{engine} ({len(filters)} ratios, {n} repeats)", rho, lo if ok else math.nan,
                            hi if ok else math.nan, noise=(floor[1], floor[2]) if floor else (math.nan, math.nan)))
    if points and not enough:
        return Evidence(points, [path], short=f"the trend is decided over >= {MIN_RATIOS} input/output ratios, "
                        f">= {MIN_REPEATS} interleaved repeats each, with its noise floor; some engines have fewer")
    return _rounds_evidence(points, path, enough, "filters", f"fewer than two measured ratios per engine in {path}")


def _sharegpt_trend_table(reports: Path) -> Evidence:
    """The single-run reading of Table A.3 (no interval): stands in until the raw serving results are committed."""
    df, path = _csv(reports, "tableA3.csv")
    df = df[(df.status == "measured") & (df.variant == SWIFTKV)]
    points = []
    for engine, g in df.groupby("engine"):
        if len(g) >= 2:
            rho = g["min_ratio"].rank().corr(g["speedup"].rank())
            points.append(_single_run(f"{engine} ({len(g)} ratios)", rho))
    if not points:
        raise NoEvidence(path, f"fewer than two measured ratios per engine in {path}")
    return Evidence(points, [path])
