"""The evidence of each registered claim (``analysis/claims.yaml``): an evaluator per claim reads the artefact(s) in
``reports/`` that its claim names and returns every measured point (never a chosen one) with the files it read.
A claim whose deciding run has not produced its evidence yet gets no points (it is then "awaiting"); one decided by
a later run (seeds, budget scaling, serving repeats) but with points from single runs is "provisional"
(``analysis.claims.evaluate``).
"""

from __future__ import annotations

import functools
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
    powered: bool = False  # serving: every point has the registered repeats (or requests) and its noise floor
    note: str = ""  # points reported but not deciding (e.g. the lowest request rate of the TPOT claim)
    short: str = ""  # serving: why the points do not decide yet (fewer repeats or requests than registered)


# the registry's "seeds x examples" estimators need at least this many training seeds per trained row (power_run.seeds:
# 5 since the power run's registration; 3 before)
MIN_SEEDS = 5
MIN_POOLED = 3  # a pooled row of fewer seeds still stands in for a single run's (provisional) from this many
MIN_REPEATS = 5  # interleaved repeats per timed point (registry: "median over >= 5 interleaved repeats")

EVALUATORS: dict = {}  # claim id -> evaluator(reports) -> Evidence, filled by @evaluates where each is defined
# claim id -> evaluator of its co-primary held-out KL points (analysis/claims.yaml, power_run.heldout_kl)
KL_EVALUATORS: dict = {}


def kl_evaluators() -> dict:
    """The claims with a co-primary held-out KL verdict and their evaluators."""
    return KL_EVALUATORS


def evaluators() -> dict:
    """Every registered evaluator: this module's and ``analysis.evidence_serving``'s (imported here, not at module
    level, since that module builds on this one)."""
    from analysis import evidence_serving  # noqa: F401  (registers the serving claims' evaluators)

    return EVALUATORS


def evaluates(claim: str, **bound):
    """Register the decorated function as the evaluator of the registry's claim ``claim`` (analysis/claims.yaml),
    with ``bound`` keyword arguments (one function may judge several claims, e.g. every seeded comparison)."""
    def register(fn):
        if claim in EVALUATORS:
            raise ValueError(f"claim {claim} has two evaluators")
        EVALUATORS[claim] = functools.partial(fn, **bound) if bound else fn
        return fn

    return register


def evaluates_kl(claim: str, **bound):
    """Register the decorated function as the evaluator of claim ``claim``'s co-primary held-out KL points."""
    def register(fn):
        if claim in KL_EVALUATORS:
            raise ValueError(f"claim {claim} has two held-out KL evaluators")
        KL_EVALUATORS[claim] = functools.partial(fn, **bound)
        return fn

    return register


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


@evaluates("flops-table1", name="table1.csv", value="total", paper="paper_total",
           label=lambda row: f"{row['model']} {row['setting']}")
@evaluates("kv-memory-acrosskv", name="table_kv_memory.csv", value="kv_cache_reduction",
           paper="paper_kv_cache_reduction", label=lambda row: f"{row['model']} g={row['key_value_group_size']}")
def _exact_points(reports: Path, name: str, value: str, paper: str, label) -> Evidence:
    df, path = _csv(reports, name)
    rows = df[df[paper].notna()]
    return Evidence([Point(label(r), num(r[value]), num(r[value]), num(r[value]), paper=num(r[paper]))
                     for _, r in rows.iterrows()], [path])


def _table_point(r, column: str, negate: bool, label: str) -> Point:
    est, lo, hi = num(r[column]), num(r[f"{column}_lo"]), num(r[f"{column}_hi"])
    if negate:
        est, lo, hi = 0.0 - est, 0.0 - hi, 0.0 - lo
    return Point(label, est, lo, hi)


@evaluates("fp8-costs-little", name="tableB1.csv", column="delta_ref", kv_cache="fp8")
def _delta_points(reports: Path, name: str, column: str, kv_cache: str) -> Evidence:
    """Paired differences (and their 95% intervals) of every row of the table with this ``kv_cache`` against its
    reference row (Table B.1: each row's FP8 cache against its native one)."""
    df, path = _csv(reports, name)
    df = df[df.kv_cache == kv_cache]
    points = [_table_point(r, column, False, f"{r['model']} {r['variant']} ({kv_cache} KV) vs {r[f'{column}_row']}")
              for _, r in df.iterrows()]
    if not points:
        raise NoEvidence(path, f"no {kv_cache} KV row in {path}")
    return Evidence(points, [path])


def _pooled_seeds(pooled, name: str, untrained_counts: bool = True) -> int:
    """Training seeds of a pooled row of reports/seeds.csv (0 if it has none); an untrained row has one evaluation and
    needs no seed, so it counts as MIN_SEEDS unless ``untrained_counts`` is False (then its n_seeds, 1)."""
    if name not in pooled.index:
        return 0
    untrained = str(pooled.loc[name, "seeds"]) == "untrained"
    return MIN_SEEDS if untrained and untrained_counts else int(pooled.loc[name, "n_seeds"])


def _pair_label(model: str, variant: str, ref: str, negate: bool) -> str:
    """The registered name of a comparison point (analysis/claims.yaml ``points``): the row claimed better first."""
    return f"{model} {ref} vs {variant}" if negate else f"{model} {variant} vs {ref}"


@evaluates("quality-loss-25", variants=["swiftkv-25"], ref="base", table="table2.csv", column="delta_base")
@evaluates("quality-loss-50", variants=["swiftkv-50"], ref="base", table="table2.csv", column="delta_base")
@evaluates("quality-cliff-beyond-50", variants=["swiftkv-62"], ref="swiftkv-50", table="table2.csv")
@evaluates("acrosskv-costs-little", variants=["swiftkv-50-acrosskv-3", "swiftkv-50-acrosskv-5"], ref="swiftkv-50",
           table="table2.csv")
@evaluates("kl-beats-lm-loss", variants=["swiftkv-50-lm"], ref="swiftkv-50", table="table4a.csv", negate=True)
@evaluates("distillation-needed", variants=["swiftkv-50-nodistill"], ref="swiftkv-50", table="table4a.csv",
           negate=True)
@evaluates("partial-beats-full", variants=["swiftkv-50-full"], ref="swiftkv-50", table="table4b.csv", negate=True)
@evaluates("acrosskv-beats-mqa", variants=["swiftkv-50-mqa-1"], ref="swiftkv-50-acrosskv-3", table="tableB2.csv",
           negate=True)
def _seeded_points(reports: Path, variants: list[str], ref: str, table: str, negate: bool = False,
                   column: str = "delta_ref") -> Evidence:
    """Every variant's difference against ``ref`` (``delta_base``: against the base model): the pooled row of
    reports/seeds.csv, intervals over training seeds and examples, when the row and its reference have at least
    MIN_SEEDS training seeds; otherwise the best there is — the pooled row of at least MIN_POOLED seeds, else the
    single run of ``table``, else the pooled row of fewer seeds — judged like the others and marked, so that the
    claim is provisional. No variant is left out: one
    with no number at all is a missing point (analysis.claims adds it as not measured)."""
    import pandas as pd

    files, pooled, single = [], pd.DataFrame(), pd.DataFrame()
    if (reports / "seeds.csv").is_file():
        df, path = _csv(reports, "seeds.csv")
        pooled, files = df[df.seed.astype(str) == "all"].set_index("variant"), [path]
    if (reports / table).is_file():
        df, path = _csv(reports, table)
        single = df[df.kv_cache == "native"].set_index("variant") if "kv_cache" in df else df.set_index("variant")

    points, short = [], []
    for v in variants:
        from_pool = v in pooled.index and (column == "delta_base" or pooled.loc[v, "ref"] == ref) \
            and not math.isnan(num(pooled.loc[v, column]))
        ref_row = f"{ref} (native KV)"
        from_table = v in single.index and (column == "delta_base" or single.loc[v].get(f"{column}_row") == ref_row)
        n = min(_pooled_seeds(pooled, v), _pooled_seeds(pooled, ref) if column == "delta_ref" else MIN_SEEDS)
        if from_pool and (n >= MIN_POOLED or not from_table):
            both = max(_pooled_seeds(pooled, v, False),
                       _pooled_seeds(pooled, ref, False) if column == "delta_ref" else 0)
            r, how = pooled.loc[v], f"({both} seeds)"
        elif from_table:
            r, how = single.loc[v], "(one training run)"
        else:
            short.append(f"{v}: no number")
            continue
        model = r["model"]
        if how == "(one training run)" or n < MIN_SEEDS:
            short.append(f"{v}: {how.strip('()')}")
        points.append(_table_point(r, column, negate, f"{_pair_label(model, v, ref, negate)} {how}"))
    if any(p.label.endswith("(one training run)") for p in points):
        files.append(str(reports / table))
    if not points:
        raise NoEvidence(str(reports / table), f"no number for {', '.join(variants)} against {ref} in "
                         f"{Path(reports.name) / 'seeds.csv'} or {Path(reports.name) / table}")
    return Evidence(points, files, seeded=not short,
                    short="" if not short else f"fewer than {MIN_SEEDS} training seeds for " + "; ".join(short))


@evaluates_kl("quality-cliff-beyond-50", variants=["swiftkv-62"], ref="swiftkv-50")
@evaluates_kl("kl-beats-lm-loss", variants=["swiftkv-50-lm"], ref="swiftkv-50", negate=True)
@evaluates_kl("distillation-needed", variants=["swiftkv-50-nodistill"], ref="swiftkv-50", negate=True)
@evaluates_kl("partial-beats-full", variants=["swiftkv-50-full"], ref="swiftkv-50", negate=True)
@evaluates_kl("acrosskv-beats-mqa", variants=["swiftkv-50-mqa-1"], ref="swiftkv-50-acrosskv-3", negate=True)
def _seeded_kl_points(reports: Path, variants: list[str], ref: str, negate: bool = False) -> Evidence:
    """The co-primary held-out KL points of a claim comparing rows (analysis/claims.yaml, power_run.heldout_kl): the
    pooled rows of reports/seeds.csv, quality taken as -KL, so a point is -(KL(variant) - KL(ref)) (``kl_delta_ref``
    negated; with ``negate``, where the reference row is the one claimed better, KL(variant) - KL(ref)) and the
    claim's own rule applies to it unchanged. Only the seeds study measures it with an interval (the tables' single
    runs have no seed variance): a row with fewer than MIN_SEEDS seeds makes the point provisional, a row without
    the measure leaves it out (then analysis.claims reports it as not measured)."""
    df, path = _csv(reports, "seeds.csv")  # a missing one is NoEvidence
    pooled = df[df.seed.astype(str) == "all"].set_index("variant")
    if "kl_delta_ref" not in pooled:
        raise NoEvidence(path, f"{Path(reports.name) / 'seeds.csv'} has no held-out KL difference (kl_delta_ref: "
                         "rendered before the power run's registration)")

    points, short = [], []
    for v in variants:
        if v not in pooled.index or pooled.loc[v, "ref"] != ref or math.isnan(num(pooled.loc[v, "kl_delta_ref"])):
            short.append(f"{v}: no held-out KL difference against {ref}")
            continue
        r = pooled.loc[v]
        both = max(_pooled_seeds(pooled, v, False), _pooled_seeds(pooled, ref, False))
        if min(_pooled_seeds(pooled, v), _pooled_seeds(pooled, ref)) < MIN_SEEDS:
            short.append(f"{v}: {both} seeds")
        est, lo, hi = (num(r[c]) for c in ("kl_delta_ref", "kl_delta_ref_lo", "kl_delta_ref_hi"))
        if not negate:
            est, lo, hi = 0.0 - est, 0.0 - hi, 0.0 - lo
        points.append(Point(f"{_pair_label(r['model'], v, ref, negate)} ({both} seeds)", est, lo, hi))
    if not points:
        raise NoEvidence(path, "; ".join(short))
    return Evidence(points, [path], seeded=not short,
                    short="" if not short else f"fewer than {MIN_SEEDS} training seeds for " + "; ".join(short))


@evaluates("simscore-half-depth")
def _simscore(reports: Path) -> Evidence:
    df, path = _csv(reports, "simscore_crossings.csv")
    rows = df[df.metric == "cosine"]
    return Evidence([Point(r["model"], num(r["simscore_at_half"]), num(r["ci_low_at_half"]), num(r["ci_high_at_half"]))
                     for _, r in rows.iterrows()], [path])


def _single_run(label: str, estimate: float) -> Point:
    """A point measured once: its estimate, no interval (the rule cannot decide it)."""
    return Point(label, estimate, math.nan, math.nan)


MIN_DISTINCT_CUTS = 5  # registry: a model's rank correlation decides only with >= 5 distinct trained l


@evaluates("simscore-predicts-loss")
def _simscore_predicts_loss(reports: Path) -> Evidence:
    """Per advised model with trained rows: Spearman(SimScore at l, trained held-out KL) and its bootstrap interval
    (the advisor's calibration); decided only where every model has the registered number of distinct cuts."""
    df, path = _csv(reports, "table_advisor_calibration.csv")
    rows = df[(df.predictor == "simscore") & (df.trained_points > 0)]
    if rows.empty:
        raise NoEvidence(path, f"no advised model has trained rows in {path}")
    points = [Point(f"{r['model']} ({int(r['distinct_l'])} trained l, {int(r['trained_points'])} rows)",
                    num(r["spearman"]), num(r["spearman_lo"]), num(r["spearman_hi"])) for _, r in rows.iterrows()]
    enough = bool((rows.distinct_l >= MIN_DISTINCT_CUTS).all())
    return Evidence(points, [path], powered=enough,
                    short="" if enough else f"some models have fewer than {MIN_DISTINCT_CUTS} distinct trained cuts "
                    "(train more cuts of the tables' recipe to decide)")


MIN_LONG_CONTEXT_CONVERSATIONS = 10  # registry: long-context-loss-flat decides only with this many conversations


@evaluates("long-context-loss-flat")
def _long_context_flat(reports: Path) -> Evidence:
    """Per SwiftKV variant: minus the growth of its loss gap to the base from the shortest to the longest context
    (so that the margin rule reads "grows by at most the margin")."""
    df, path = _csv(reports, "table_long_context.csv")
    rows = df[df.kind == "growth"]
    if rows.empty:
        raise NoEvidence(path, f"no growth row in {path}")
    points = [Point(f"{r['model']} {r['variant']} ({int(r['from_context'])} -> {int(r['context'])} tokens)",
                    0.0 - num(r["estimate"]), 0.0 - num(r["hi"]), 0.0 - num(r["lo"])) for _, r in rows.iterrows()]
    fewest = int(rows.n.min())
    enough = fewest >= MIN_LONG_CONTEXT_CONVERSATIONS
    return Evidence(points, [path], powered=enough,
                    short="" if enough else f"the context measure read {fewest} conversation(s), fewer than the "
                    f"{MIN_LONG_CONTEXT_CONVERSATIONS} its rule needs (long_context.contexts: a shorter longest context)")


MIN_FIDELITY_PROMPTS = 64  # registry: served-model-faithful reads 64 held-out prompts per configuration


@evaluates("served-model-faithful")
def _served_model_faithful(reports: Path) -> Evidence:
    """Per served configuration: the largest |log-prob difference| (deterministic: no interval); the other measures
    and their tolerances are reported in the note."""
    df, path = _csv(reports, "table_serving_fidelity.csv")
    if df.empty:
        raise NoEvidence(path, f"{path} has no served configuration")
    points = [Point(f"{r['model']} {r['config']}", num(r["logprob_max_abs"]), num(r["logprob_max_abs"]),
                    num(r["logprob_max_abs"])) for _, r in df.iterrows()]
    note = "; ".join(f"{r['config']}: greedy {num(r['greedy_mean']):.3f}, mean |diff| {num(r['logprob_mean_abs']):.2g}, "
                     f"top-{int(r['top_k'])} {num(r['topk_mean']):.3f}"
                     f" ({'within' if str(r['within_tolerance']) == 'True' else 'OUTSIDE'} tolerance)"
                     for _, r in df.iterrows())
    enough = bool((df.prompts >= MIN_FIDELITY_PROMPTS).all())
    return Evidence(points, [path], powered=enough, note=note,
                    short="" if enough else f"some configurations have fewer than {MIN_FIDELITY_PROMPTS} prompts")


@evaluates("prefill-time-halved", skips=(0.5,), min_tokens=1024)
@evaluates("prefill-time-full-scope", skips=(0.5, 0.75), min_tokens=0)
def _prefill_time(reports: Path, skips: tuple[float, ...], min_tokens: int) -> Evidence:
    """Per (model, skipped fraction, prompt length >= ``min_tokens``): the student's prefill speedup over base, the
    median over the interleaved repeats of the same repeat's time ratio (interval: bootstrap over repeats), divided
    by the speedup the FLOPs predict (reports/raw/forward_time, rule bench_forward_time). Fewer than MIN_REPEATS
    repeats: no interval."""
    import json

    from analysis.io import read_json
    from analysis.raw import MANIFEST, raw_path
    from analysis.stats import median_ci
    from swiftkv.measure.flops import layers_for_skip

    root = reports / "raw" / "forward_time"
    if not (root / MANIFEST).is_file():
        raise NoEvidence(str(root), "reports/raw/forward_time is missing (rule raw_analysis)")
    points = []
    for meta in json.loads((root / MANIFEST).read_text())["files"].values():
        data = read_json(raw_path(root, meta["source"]))
        L, model = data["num_hidden_layers"], data.get("model", Path(meta["source"]).stem)
        rows = {(r["variant"], r["prefill_tokens"]): r for r in data["results"]}
        for skip in skips:  # the benchmark's rows are named by l (swiftkv.bench.speed.kept_layers)
            name = f"swiftkv-l{layers_for_skip(L, skip)}"
            for tokens in sorted(t for v, t in rows if v == name and t >= min_tokens and ("base", t) in rows):
                base, row = rows[("base", tokens)], rows[(name, tokens)]
                ratios = [b / t for b, t in zip(base["times_s"], row["times_s"])]
                predicted = 1.0 / row["predicted_ratio"]
                est = median_ci(ratios)
                enough = len(ratios) >= MIN_REPEATS
                label = f"{model} {tokens} tokens" if len(skips) == 1 else f"{model} {skip:.0%} {tokens} tokens"
                points.append(Point(label, est.value / predicted, est.low / predicted if enough else math.nan,
                                    est.high / predicted if enough else math.nan))
    if not points:
        raise NoEvidence(str(root), f"no SwiftKV row at a prompt of >= {min_tokens} tokens in "
                         "reports/raw/forward_time")
    return Evidence(points, [str(root / MANIFEST)])
