"""The claims registry (``analysis/claims.yaml``): the paper's headline claims with the rule that decides each,
written before the runs that decide them. ``load_registry`` reads and checks it; ``decide`` applies a rule to the
estimates of every measured point.

A rule never looks at a subset of the points: ``decide`` takes all of them and returns the worst of their
verdicts, so the verdict over all points is never better than over any subset — no choice of points can make a
claim look better than the full set does (``tests/test_claims.py`` checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REGISTRY = Path(__file__).parent / "claims.yaml"
HOLDS, FAILS, UNCLEAR = "holds", "does not hold", "cannot tell"
KINDS = ("direction", "margin", "exact", "every_point")
REQUIRED = ("id", "statement", "paper", "artefact", "estimator", "rule", "over", "registered", "decided_by")


class RegistryError(ValueError):
    """The registry file is malformed (one line: which claim, what is wrong)."""


@dataclass(frozen=True)
class Rule:
    kind: str
    direction: str = "above"  # direction / every_point: the effect must lie above (or below) the threshold
    threshold: float = 0.0
    margin: float = 0.0  # margin: the largest loss the claim allows
    tolerance: float = 0.0  # exact
    per_row: bool = False
    of: str | None = None
    unit: str | None = None


@dataclass(frozen=True)
class RegisteredClaim:
    id: str
    statement: str
    paper: dict
    artefact: str
    estimator: str
    rule: Rule
    over: str
    registered: str
    decided_by: str
    noise: str | None = None
    extra: dict = field(default_factory=dict)


def load_registry(path: str | Path = REGISTRY) -> list[RegisteredClaim]:
    """Every claim of the registry, checked: required fields, a known rule kind, unique ids."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("claims"), list):
        raise RegistryError(f"{path}: expected a mapping with a 'claims' list")
    out, seen = [], set()
    for entry in data["claims"]:
        cid = entry.get("id", "?") if isinstance(entry, dict) else "?"
        missing = [k for k in REQUIRED if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise RegistryError(f"{path}: claim {cid} lacks {', '.join(missing)}")
        if cid in seen:
            raise RegistryError(f"{path}: claim id {cid} appears twice")
        seen.add(cid)
        rule = dict(entry["rule"])
        if rule.get("kind") not in KINDS:
            raise RegistryError(f"{path}: claim {cid}: rule kind {rule.get('kind')!r} is not one of {', '.join(KINDS)}")
        unknown = set(rule) - set(Rule.__dataclass_fields__)
        if unknown:
            raise RegistryError(f"{path}: claim {cid}: unknown rule field(s) {', '.join(sorted(unknown))}")
        if rule.get("direction", "above") not in ("above", "below"):
            raise RegistryError(f"{path}: claim {cid}: direction must be 'above' or 'below'")
        known = {k: entry[k] for k in RegisteredClaim.__dataclass_fields__ if k in entry and k not in ("rule", "extra")}
        extra = {k: v for k, v in entry.items() if k not in RegisteredClaim.__dataclass_fields__}
        out.append(RegisteredClaim(**{**known, "registered": str(entry["registered"])}, rule=Rule(**rule),
                                   extra=extra))
    return out


@dataclass(frozen=True)
class Point:
    """One measured point: its label (engine, rate, budget ...), estimate and 95% interval (lo = hi = estimate for
    a deterministic quantity)."""

    label: str
    estimate: float
    lo: float
    hi: float
    paper: float | None = None  # exact rules: the paper's value at this point


def _direction(rule: Rule, p: Point) -> str:
    if any(math.isnan(v) for v in (p.lo, p.hi)):
        return UNCLEAR
    if rule.direction == "above":
        return HOLDS if p.lo > rule.threshold else FAILS if p.hi < rule.threshold else UNCLEAR
    return HOLDS if p.hi < rule.threshold else FAILS if p.lo > rule.threshold else UNCLEAR


def _margin(rule: Rule, p: Point) -> str:
    if any(math.isnan(v) for v in (p.lo, p.hi)):
        return UNCLEAR
    return HOLDS if p.lo >= -rule.margin else FAILS if p.hi < -rule.margin else UNCLEAR


def _exact(rule: Rule, p: Point) -> str:
    if p.paper is None or math.isnan(p.estimate):
        return UNCLEAR
    return HOLDS if abs(p.estimate - p.paper) <= rule.tolerance else FAILS


def point_verdict(rule: Rule, p: Point) -> str:
    if rule.kind == "margin":
        return _margin(rule, p)
    if rule.kind == "exact":
        return _exact(rule, p)
    return _direction(rule, p)


def decide(rule: Rule, points: list[Point]) -> str:
    """The verdict over ALL measured points: holds only if it holds at every point, does not hold if it fails at
    any point, else cannot tell. No points: cannot tell."""
    if not points:
        return UNCLEAR
    verdicts = [point_verdict(rule, p) for p in points]
    if FAILS in verdicts:
        return FAILS
    return HOLDS if all(v == HOLDS for v in verdicts) else UNCLEAR


# -- evidence: the registered claims against the artefacts in reports/ --------------------------------------------
#
# Each evaluator reads the artefact(s) its claim names and returns every measured point (never a chosen one) with
# the files it read. A claim whose deciding run has not produced its evidence yet gets no points ("awaiting"); a
# claim decided by a later run (seeds, budget scaling, serving repeats) but with points from today's single runs is
# "provisional": its verdict applies the registered rule to those points and says which run will decide it.

AWAITING, PROVISIONAL, DECIDED = "awaiting", "provisional", "decided"


@dataclass(frozen=True)
class Evidence:
    points: list[Point]
    files: list[str]
    missing: str = ""  # why there are no points (awaiting)
    seeded: bool = False  # the points carry training-seed variance (>= MIN_SEEDS seeds: reports/seeds.csv)


MIN_SEEDS = 3  # the registry's "seeds x examples" estimators need at least this many training seeds per trained row


class _NoEvidence(Exception):
    """An evaluator found no point to judge: ``files`` it looked at, ``why`` (the claim is then awaiting)."""

    def __init__(self, path: str, why: str):
        super().__init__(why)
        self.path, self.why = path, why


def _csv(reports: Path, name: str):
    """The artefact ``reports/name`` as a frame, and its path; a missing one is no evidence (``_NoEvidence``)."""
    import pandas as pd

    path = reports / name
    if not path.is_file():
        raise _NoEvidence(str(path), f"{Path(reports.name) / name} is missing")
    return pd.read_csv(path), str(path)


def _f(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _exact_points(reports: Path, name: str, value: str, paper: str, label) -> Evidence:
    df, path = _csv(reports, name)
    rows = df[df[paper].notna()]
    return Evidence([Point(label(r), _f(r[value]), _f(r[value]), _f(r[value]), paper=_f(r[paper]))
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
            est, lo, hi = _f(r[column]), _f(r[f"{column}_lo"]), _f(r[f"{column}_hi"])
            if negate:
                est, lo, hi = 0.0 - est, 0.0 - hi, 0.0 - lo
            ref = r.get(f"{column}_row", "base") if column != "delta_base" else "base"
            row = v if kv_cache == "native" else f"{v} ({kv_cache} KV)"
            points.append(Point(f"{r['model']} {row} vs {ref}" if not negate else f"{r['model']} {ref} vs {row}",
                                est, lo, hi))
    if not points:
        raise _NoEvidence(path, f"no row {', '.join(variants or [kv_cache + ' KV'])} in {path}")
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
        est, lo, hi = _f(r[column]), _f(r[f"{column}_lo"]), _f(r[f"{column}_hi"])
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
        raise _NoEvidence(path, f"{shown} has no pooled row with >= {MIN_SEEDS} seeds for {', '.join(lacking)} "
                          f"against {ref}")
    return Evidence(points, [path], missing=f"no row with >= {MIN_SEEDS} seeds for {', '.join(lacking)}")


def _seeded(variants: list[str], ref: str, negate: bool = False, column: str = "delta_ref", table: str | None = None):
    """An evaluator on the seeds study's pooled rows; ``table``: the single-run table that stands in without them."""
    fallback = None if table is None else (lambda r: _delta_points(r, table, variants, column, negate=negate))
    return lambda r: _seeded_points(r, variants, ref, negate, column, fallback)


def _simscore(reports: Path) -> Evidence:
    df, path = _csv(reports, "simscore_crossings.csv")
    rows = df[df.metric == "cosine"]
    return Evidence([Point(r["model"], _f(r["simscore_at_half"]), _f(r["ci_low_at_half"]), _f(r["ci_high_at_half"]))
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
        raise _NoEvidence(path, f"no engine with two KV limits in {path}")
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
        raise _NoEvidence(path, f"fewer than two measured ratios per engine in {path}")
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


def rule_text(rule: Rule) -> str:
    unit = f" {rule.unit}" if rule.unit else ""
    of = f" ({rule.of})" if rule.of else ""
    if rule.kind == "exact":
        return f"|ours - paper| <= {rule.tolerance:g}{unit} at every point"
    if rule.kind == "margin":
        return f"interval lower bound >= -{rule.margin:g}{unit}" + (" for every row" if rule.per_row else "")
    side = ">" if rule.direction == "above" else "<"
    return f"95% interval {side} {rule.threshold:g}{of} at every point"


def _deciding(rule: Rule, points: list[Point]) -> Point | None:
    """The point that decides the verdict: the first failing one, else the first unclear one, else the one nearest
    its bound (all points are listed beside it)."""
    if not points:
        return None
    verdicts = [point_verdict(rule, p) for p in points]
    for wanted in (FAILS, UNCLEAR):
        if wanted in verdicts:
            return points[verdicts.index(wanted)]
    if rule.kind == "exact":
        return max(points, key=lambda p: abs(p.estimate - p.paper))
    if rule.kind == "margin":
        return min(points, key=lambda p: p.lo)
    return min(points, key=lambda p: p.lo - rule.threshold if rule.direction == "above" else rule.threshold - p.hi)


DEPENDS = "depends on budget"


@dataclass(frozen=True)
class Scaling:
    """What the budget-scaling study says of a claim (analysis/claims.yaml, budget_scaling): the per-budget KL
    verdicts, their ordering, and the claim's accuracy rule at the end points (smallest first)."""

    kl: str = ""
    ordering: str = ""
    accuracy: list[tuple[int, str]] = field(default_factory=list)

    def text(self) -> str:
        return "; ".join(f"{b} tokens: {v}" for b, v in self.accuracy)


def _scaling(reports: Path) -> dict[str, Scaling]:
    """Per claim, the registered reading of reports/budget_scaling.csv (empty without the study)."""
    import pandas as pd

    path = reports / "budget_scaling.csv"
    if not path.is_file():
        return {}
    df = pd.read_csv(path)
    out = {}
    for claim, g in df[df.claim.notna()].groupby("claim", sort=False):
        kl = g[(g.kind == "pair") & (g.metric == "kl_difference")].sort_values("budget")
        acc = g[(g.kind == "pair") & (g.metric == "accuracy_difference")].sort_values("budget")
        order = g[g.kind == "ordering"]
        out[claim] = Scaling(
            kl="; ".join(f"{int(r.budget)}: {_fmt(r.estimate)} [{_fmt(r.lo)}, {_fmt(r.hi)}] {r.verdict}"
                         for r in kl.itertuples()),
            ordering=order.verdict.iloc[0] if len(order) else "",
            accuracy=[(int(r.budget), f"{_fmt(r.estimate)} [{_fmt(r.lo)}, {_fmt(r.hi)}] {r.verdict}")
                      for r in acc.itertuples()],
        )
    return out


def budget_verdict(table_verdict: str, largest_accuracy: str | None) -> str:
    """The registered rule: the table budget's verdict stands unless the claim's accuracy rule at the largest budget
    decides the opposite (then "depends on budget")."""
    if largest_accuracy is None:
        return table_verdict
    opposite = {HOLDS: FAILS, FAILS: HOLDS}.get(table_verdict)
    return DEPENDS if opposite is not None and largest_accuracy.endswith(opposite) else table_verdict


def _fmt(v: float) -> str:
    return "nan" if math.isnan(v) else f"{v:.4g}"


def evaluate(reports: str | Path, registry: str | Path = REGISTRY, commit: str = "",
             commits: dict[str, str] | None = None):
    """One row per registered claim: its rule, every point, the deciding point, the verdict over all points and
    its status (decided / provisional / awaiting). ``commit``: the commit that computed the evidence; ``commits``:
    per evidence file name (``seeds.csv``), where files come from different runs. Returns a DataFrame in the
    registry's order; ``evidence_commit`` lists one commit per evidence file."""
    import pandas as pd

    reports, commits = Path(reports), commits or {}
    scaling = _scaling(reports)
    rows = []
    for claim in load_registry(registry):
        if claim.id not in EVALUATORS:
            raise RegistryError(f"{registry}: claim {claim.id} has no evaluator in analysis/claims.py")
        try:
            ev = EVALUATORS[claim.id](reports)
        except _NoEvidence as none:
            ev = Evidence([], [none.path], none.why)
        verdict = decide(claim.rule, ev.points)
        decider = _deciding(claim.rule, ev.points)
        by_current_run = claim.decided_by.startswith("default profile")
        by_scaling = "budget-scaling" in claim.decided_by
        study = scaling.get(claim.id)
        scaling_pending = by_scaling and study is None
        status = (AWAITING if not ev.points else DECIDED if by_current_run or (ev.seeded and not scaling_pending)
                  else PROVISIONAL)
        if by_scaling and study is not None and study.accuracy and ev.points:
            verdict = budget_verdict(verdict, study.accuracy[-1][1])
        if status == PROVISIONAL and ev.seeded:
            why = ("decided at the table budget by the seeds run (seeds.csv); "
                   + ("reports/budget_scaling.csv has no row of this comparison" if (reports / "budget_scaling.csv")
                      .is_file() else "the ordering across budgets awaits the budget-scaling study"))
        elif status == PROVISIONAL and ev.missing:
            why = f"decided by {claim.decided_by}; these points are seeded, but {ev.missing} yet"
        elif status == PROVISIONAL:
            why = f"decided by {claim.decided_by}; these points are from single training runs or single serving runs"
        else:
            why = ev.missing if status == AWAITING else ""
        rows.append({
            "id": claim.id,
            "statement": claim.statement,
            "rule": rule_text(claim.rule),
            "estimate": decider.estimate if decider else math.nan,
            "lo": decider.lo if decider else math.nan,
            "hi": decider.hi if decider else math.nan,
            "deciding_point": decider.label if decider else "",
            "points": "; ".join(f"{p.label}: {_fmt(p.estimate)} [{_fmt(p.lo)}, {_fmt(p.hi)}]"
                                + (f" (paper {_fmt(p.paper)})" if p.paper is not None else "")
                                + f" {point_verdict(claim.rule, p)}" for p in ev.points),
            "n_points": len(ev.points),
            "verdict": verdict,
            "status": status,
            "why": why,
            "evidence": " ".join(ev.files + ([str(reports / "budget_scaling.csv")] if study else [])),
            "evidence_commit": " ".join(commits.get(Path(f).name, commit) for f in ev.files
                                        + (["budget_scaling.csv"] if study else [])) or commit,
            "registered": claim.registered,
            "decided_by": claim.decided_by,
            "scaling_kl": study.kl if study else "",
            "scaling_ordering": study.ordering if study else "",
            "scaling_accuracy": study.text() if study else "",
        })
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m analysis.claims",
                                     description="Apply the registered rules (analysis/claims.yaml) to the "
                                     "artefacts in REPORTS and write one row per claim (reports/claims.csv).")
    parser.add_argument("reports", help="the reports/ folder whose tables are the evidence")
    parser.add_argument("--output", "-o", required=True, help="CSV to write")
    parser.add_argument("--registry", default=str(REGISTRY), help="the claims registry (default: %(default)s)")
    parser.add_argument("--evidence-commit", default=None,
                        help="the commit that computed the tables in REPORTS (default: this checkout's HEAD, as in a "
                        "pipeline run; for tables committed earlier, the commit in their provenance.json)")
    parser.add_argument("--commit-of", action="append", default=[], metavar="FILE=COMMIT",
                        help="the commit that computed one evidence file (e.g. seeds.csv=abc123), where the tables "
                        "come from different runs; repeatable")
    args = parser.parse_args(argv)
    bad = [x for x in args.commit_of if x.count("=") != 1 or not all(x.split("="))]
    if bad:
        parser.exit(2, f"error: --commit-of {bad[0]!r}: expected FILE=COMMIT, e.g. seeds.csv=abc123\n")
    from analysis.io import write_csv
    from swiftkv.bench.provenance import git_commit

    try:
        frame = evaluate(args.reports, args.registry, commit=args.evidence_commit or git_commit(),
                         commits=dict(x.split("=") for x in args.commit_of))
    except RegistryError as err:
        parser.exit(2, f"error: {err}\n")
    write_csv(frame, args.output)
    counts = frame.groupby(["status", "verdict"]).size()
    print("; ".join(f"{s}, {v}: {n}" for (s, v), n in counts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
