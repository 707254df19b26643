"""The evidence of each registered claim (``analysis/claims.yaml``): an evaluator per claim reads the artefact(s) in
``reports/`` that its claim names and returns every measured point (never a chosen one) with the files it read.
A claim whose deciding run has not produced its evidence yet gets no points (it is then "awaiting"); one decided by
a later run (seeds, budget scaling, serving repeats) but with points from single runs is "provisional"
(``analysis.claims.evaluate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from analysis.rules import Point


@dataclass(frozen=True)
class Evidence:
    points: list[Point]
    files: list[str]
    missing: str = ""  # why there are no points (awaiting)
    seeded: bool = False  # the points carry training-seed variance (>= MIN_SEEDS seeds: reports/seeds.csv)


MIN_SEEDS = 3  # the registry's "seeds x examples" estimators need at least this many training seeds per trained row


class NoEvidence(Exception):
    """An evaluator found no point to judge: ``files`` it looked at, ``why`` (the claim is then awaiting)."""

    def __init__(self, path: str, why: str):
        super().__init__(why)
        self.path, self.why = path, why


def _csv(reports: Path, name: str):
    """The artefact ``reports/name`` as a frame, and its path; a missing one is no evidence (``NoEvidence``)."""
    import pandas as pd

    path = reports / name
    if not path.is_file():
        raise NoEvidence(str(path), f"{Path(reports.name) / name} is missing")
    return pd.read_csv(path), str(path)


def num(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _exact_points(reports: Path, name: str, value: str, paper: str, label) -> Evidence:
    df, path = _csv(reports, name)
    rows = df[df[paper].notna()]
    return Evidence([Point(label(r), num(r[value]), num(r[value]), num(r[value]), paper=num(r[paper]))
                     for _, r in rows.iterrows()], [path])


def _delta_points(reports: Path, name: str, variants: list[str] | None, column: str, negate: bool = False,
                  kv_cache: str = "native") -> Evidence:
    """Paired differences (and their 95% intervals) of the table's rows of ``variants`` (None: every row with this
    ``kv_cache``); negate: the claim's difference is the reference row minus this row."""
    df, path = _csv(reports, name)
    if "kv_cache" in df:
        df = df[df.kv_cache == kv_cache]
    points = []
    for v in variants if variants is not None else list(df.variant):
        for _, r in df[df.variant == v].iterrows():
            est, lo, hi = num(r[column]), num(r[f"{column}_lo"]), num(r[f"{column}_hi"])
            if negate:
                est, lo, hi = 0.0 - est, 0.0 - hi, 0.0 - lo
            ref = r.get(f"{column}_row", "base") if column != "delta_base" else "base"
            row = v if kv_cache == "native" else f"{v} ({kv_cache} KV)"
            points.append(Point(f"{r['model']} {row} vs {ref}" if not negate else f"{r['model']} {ref} vs {row}",
                                est, lo, hi))
    if not points:
        raise NoEvidence(path, f"no row {', '.join(variants or [kv_cache + ' KV'])} in {path}")
    return Evidence(points, [path])


def _seeded_points(reports: Path, variants: list[str], ref: str, negate: bool, column: str = "delta_ref",
                   fallback=None) -> Evidence:
    """The pooled rows of ``reports/seeds.csv`` (seed = all): ``column`` of each of ``variants`` against ``ref``
    (``delta_base``: against the base model), intervals over training seeds and examples. The claim is decided by
    them only if every row (and its reference) has at least MIN_SEEDS training seeds; otherwise the table's
    single-run points (``fallback``) stand in, or the seeded rows there are, and the claim is provisional."""
    df, path = _csv(reports, "seeds.csv") if (reports / "seeds.csv").is_file() or fallback is None else (None, "")
    if df is None:
        return fallback(reports)
    pooled = df[df.seed.astype(str) == "all"].set_index("variant")
    shown = Path(reports.name) / "seeds.csv"  # in messages: no absolute paths

    def enough(name):  # an untrained row has one evaluation and no training seed
        return name in pooled.index and (pooled.loc[name, "n_seeds"] >= MIN_SEEDS
                                         or str(pooled.loc[name, "seeds"]) == "untrained")

    points, lacking = [], []
    for v in variants:
        if not enough(v) or (column == "delta_ref" and (pooled.loc[v, "ref"] != ref or not enough(ref))):
            lacking.append(v)
            continue
        r = pooled.loc[v]
        est, lo, hi = num(r[column]), num(r[f"{column}_lo"]), num(r[f"{column}_hi"])
        seeds = max(r["n_seeds"], pooled.loc[ref, "n_seeds"] if column == "delta_ref" else 0)
        label = f"{r['model']} {v} vs {ref}"
        if negate:
            est, lo, hi = 0.0 - est, 0.0 - hi, 0.0 - lo
            label = f"{r['model']} {ref} vs {v}"
        points.append(Point(f"{label} ({int(seeds)} seeds)", est, lo, hi))
    if not lacking:
        return Evidence(points, [path], seeded=True)
    if fallback is not None:
        return fallback(reports)
    if not points:
        raise NoEvidence(path, f"{shown} has no pooled row with >= {MIN_SEEDS} seeds for {', '.join(lacking)} "
                          f"against {ref}")
    return Evidence(points, [path], missing=f"no row with >= {MIN_SEEDS} seeds for {', '.join(lacking)}")


def _seeded(variants: list[str], ref: str, negate: bool = False, column: str = "delta_ref", table: str | None = None):
    """An evaluator on the seeds study's pooled rows; ``table``: the single-run table that stands in without them."""
    fallback = None if table is None else (lambda r: _delta_points(r, table, variants, column, negate=negate))
    return lambda r: _seeded_points(r, variants, ref, negate, column, fallback)


def _simscore(reports: Path) -> Evidence:
    df, path = _csv(reports, "simscore_crossings.csv")
    rows = df[df.metric == "cosine"]
    return Evidence([Point(r["model"], num(r["simscore_at_half"]), num(r["ci_low_at_half"]), num(r["ci_high_at_half"]))
                     for _, r in rows.iterrows()], [path])


def _single_run(label: str, estimate: float) -> Point:
    """A point measured once: its estimate, no interval (the rule cannot decide it)."""
    return Point(label, estimate, math.nan, math.nan)


def _memory_limits(reports: Path) -> Evidence:
    """Per engine: (AcrossKV / SwiftKV 50%) throughput at the smallest KV limit minus at the largest."""
    df, path = _csv(reports, "table3.csv")
    df = df[df.status == "measured"].copy()
    df["mib"] = df.kv_limit.str.extract(r"([\d.]+)\s*MiB", expand=False).astype(float)
    points = []
    for engine, g in df.groupby("engine"):
        t = g.pivot_table(index="mib", columns="variant", values="throughput_tok_s")
        if {"swiftkv-50", "swiftkv-50-acrosskv-3"} - set(t.columns) or len(t) < 2:
            continue
        ratio = (t["swiftkv-50-acrosskv-3"] / t["swiftkv-50"]).sort_index()
        points.append(_single_run(f"{engine}: {ratio.index[0]:g} vs {ratio.index[-1]:g} MiB",
                                  ratio.iloc[0] - ratio.iloc[-1]))
    if not points:
        raise NoEvidence(path, f"no engine with two KV limits in {path}")
    return Evidence(points, [path])


def _sharegpt_trend(reports: Path) -> Evidence:
    """Per engine: Spearman correlation of the filter's input/output ratio with the SwiftKV 50% speedup."""
    df, path = _csv(reports, "tableA3.csv")
    df = df[(df.status == "measured") & (df.variant == "swiftkv-50")]
    points = []
    for engine, g in df.groupby("engine"):
        if len(g) >= 2:
            rho = g["min_ratio"].rank().corr(g["speedup"].rank())
            points.append(_single_run(f"{engine} ({len(g)} ratios)", rho))
    if not points:
        raise NoEvidence(path, f"fewer than two measured ratios per engine in {path}")
    return Evidence(points, [path])


def _awaiting(what: str):
    return lambda reports: Evidence([], [], what)


EVALUATORS = {
    "flops-table1": lambda r: _exact_points(r, "table1.csv", "total", "paper_total",
                                            lambda row: f"{row['model']} {row['setting']}"),
    "kv-memory-acrosskv": lambda r: _exact_points(r, "table_kv_memory.csv", "kv_cache_reduction",
                                                  "paper_kv_cache_reduction",
                                                  lambda row: f"{row['model']} g={row['key_value_group_size']}"),
    "simscore-half-depth": _simscore,
    "simscore-predicts-loss": _awaiting("a rank correlation needs >= 3 trained cut points of a model; the "
                                        "budget-scaling study trains two (l = 22, 15): the advisor's calibration "
                                        "(issue 18) adds more"),
    "prefill-time-halved": _awaiting("the repeat-level timings behind Fig. 2 (right) are in results/, not reports/; "
                                     "evaluated once they are committed (raw results)"),
    "quality-loss-25": _seeded(["swiftkv-25"], "base", column="delta_base", table="table2.csv"),
    "quality-loss-50": _seeded(["swiftkv-50"], "base", column="delta_base", table="table2.csv"),
    "quality-cliff-beyond-50": _seeded(["swiftkv-62"], "swiftkv-50"),
    "acrosskv-costs-little": _seeded(["swiftkv-50-acrosskv-3", "swiftkv-50-acrosskv-5"], "swiftkv-50"),
    "kl-beats-lm-loss": _seeded(["swiftkv-50-lm"], "swiftkv-50", negate=True, table="table4a.csv"),
    "distillation-needed": _seeded(["swiftkv-50-nodistill"], "swiftkv-50", negate=True, table="table4a.csv"),
    "partial-beats-full": _seeded(["swiftkv-50-full"], "swiftkv-50", negate=True, table="table4b.csv"),
    "acrosskv-beats-mqa": _seeded(["swiftkv-50-mqa-1"], "swiftkv-50-acrosskv-3", negate=True, table="tableB2.csv"),
    "fp8-costs-little": lambda r: _delta_points(r, "tableB1.csv", None, "delta_ref", kv_cache="fp8"),
    "throughput-gain": _awaiting("throughput repeats (>= 5 per point) are not run yet; Fig. 3's single runs are in "
                                 "results/"),
    "ttft-lower": _awaiting("latency runs of >= 50 requests per rate are not run yet"),
    "tpot-lower": _awaiting("latency runs of >= 50 requests per rate are not run yet"),
    "acrosskv-helps-under-memory-limits": _memory_limits,
    "speedup-grows-with-input-output-ratio": _sharegpt_trend,
}
