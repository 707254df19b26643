"""The extended-suite study (analysis/claims.yaml, extended_suite) from its raw folder (rule raw_extended): the
students of the tables and of the seeds study re-scored on the suite's tasks plus the new tasks the suite rule kept,
with the task average taken over benchmarks (MMLU's subjects one benchmark: ``analysis.seeds.pool_benchmarks``).

It writes, under ``<root>/extended_suite/``, the two files the claims' own evaluators read (analysis/evidence.py), in
the layout of the tables they read elsewhere, so that every accuracy claim gets its second reading by exactly its
registered rule:

- ``seeds.csv``: per row and seed, then pooled over seeds (``analysis.seeds.build_seeds_table`` by benchmark);
- ``tableB1.csv``: each FP8 row against the same row with the native cache (one training run, the profile's seed);

and ``<root>/extended_suite.csv``: the suite (tasks, benchmarks, report examples) and, per pooled row, the average,
the difference from the base model and its minimum detectable difference. ``agreement.csv`` (``mmlu_agreement``) is
the registered check that the study's MMLU part, scored again, gives the power run's per-question results.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.accuracy import minimum_detectable_difference
from analysis.io import read_json, task_samples
from analysis.raw import eval_path, raw_path
from analysis.seeds import SeedRun, _matrix, benchmark_of, build_seeds_table, pool_benchmarks
from analysis.stats import BootstrapSettings, paired_difference_ci, seed_difference_ci

FOLDER = "extended_suite"  # under a reports root: the files the evaluators read
# the power run's raw folders that hold its evaluations of the study's rows (the seeds study's, then the tables')
POWER_RAWS = ("seeds", "table2", "table4a", "table4b", "tableB1", "tableB2")


def extended_path(model: str, *parts: str) -> str:
    """Where the study's results live under ``results/`` (workflow/rules/extended.smk writes them there)."""
    return "/".join(("results", "extended", model, *parts))


def power_run_path(model: str, variant: str, seed: int, kv_cache: str, own_seed: int) -> str:
    """Where the power run scored a row-seed of the study on its suite (a ``results/`` path): the tables' evaluation
    at the profile's seed (an untrained row has only that one), the seeds study's at any other."""
    if seed == own_seed:
        return eval_path(model, variant, kv_cache, "lm_eval.json")
    return f"results/seeds/{model}/{variant}/seed-{seed}/{kv_cache}/lm_eval.json"


def _fp8_rows(results: dict, tasks: list[dict], model: str, settings: BootstrapSettings) -> list[dict]:
    """Each row's FP8 cache against its native one (Table B.1's delta_ref), paired on the native run's examples."""
    rows = []
    for variant, pair in results.items():
        if "fp8" not in pair or "native" not in pair:
            continue
        fp8 = pool_benchmarks(_matrix([pair["fp8"]], pair["native"], tasks), tasks)
        native = pool_benchmarks(_matrix([pair["native"]], pair["native"], tasks), tasks)
        ci = paired_difference_ci([x[0] for x in fp8], [y[0] for y in native], settings).scaled(100)
        rows.append({"model": model, "variant": variant, "kv_cache": "fp8", "delta_ref": ci.value,
                     "delta_ref_lo": ci.low, "delta_ref_hi": ci.high, "delta_ref_row": f"{variant} (native KV)"})
    return rows


def extended_tables(raw: str | Path, models: list[dict], reference: dict[str, str],
                    settings: BootstrapSettings = BootstrapSettings()) -> tuple[pd.DataFrame, pd.DataFrame,
                                                                                   pd.DataFrame]:
    """(seeds.csv, tableB1.csv, the study's summary) from the raw folder. ``models``: per model its runs as the
    rule's params give them ({variant, seed, kv_cache, trained, lm_eval}: ``results/`` paths)."""
    seeds, fp8, summary = [], [], []
    for spec in models:
        model = spec["model"]
        chosen = read_json(raw_path(raw, extended_path(model, "tasks.json")))
        tasks = chosen["tasks"]
        base, runs, pairs, loaded = None, [], {}, {}
        for r in spec["runs"]:
            path = raw_path(raw, r["lm_eval"])
            if r["variant"] == "base" and r["kv_cache"] == "native":
                base = SeedRun(model, "base", None, path)
            elif r["kv_cache"] == "native":
                runs.append(SeedRun(model, r["variant"], r["seed"] if r["trained"] else None, path))
            if r["kv_cache"] == "fp8" or (r["variant"] in spec["fp8_variants"] and r["seed"] == spec["own_seed"]):
                loaded[path] = read_json(path)  # each file read once here
                pairs.setdefault(r["variant"], {})[r["kv_cache"]] = loaded[path]
        if base is None:
            raise ValueError(f"the extended suite of {model} has no base-model evaluation")
        table = build_seeds_table(runs, base, tasks, reference, settings, by_benchmark=True)
        seeds.append(table)
        fp8 += _fp8_rows(pairs, tasks, model, settings)
        benchmarks = sorted({benchmark_of(t) for t in tasks})
        rec = {"model": model, "row": "suite", "tasks": len(tasks), "fixed_tasks": chosen.get("fixed", 0),
               "benchmarks": len(benchmarks), "report_examples": int(sum(t["n"] for t in tasks)),
               "benchmark_list": " ".join(benchmarks)}
        summary.append(rec)
        base_result = loaded.get(base.lm_eval) or read_json(base.lm_eval)
        ci = seed_difference_ci(pool_benchmarks(_matrix([base_result], base_result, tasks), tasks), None,
                                settings.confidence).scaled(100)
        summary.append({"model": model, "row": "base", "seeds": "untrained", "average": ci.value,
                        "average_lo": ci.low, "average_hi": ci.high})
        for _, r in table[table.seed.astype(str) == "all"].iterrows():
            summary.append({"model": model, "row": r["variant"], "seeds": r["seeds"], "average": r["average"],
                            "average_lo": r["average_lo"], "average_hi": r["average_hi"],
                            "delta_base": r["delta_base"], "delta_base_lo": r["delta_base_lo"],
                            "delta_base_hi": r["delta_base_hi"],
                            "mdd_base": minimum_detectable_difference(r["delta_base_lo"], r["delta_base_hi"])
                            if not math.isnan(r["delta_base_lo"]) else math.nan})
    fp8_frame = pd.DataFrame(fp8, columns=["model", "variant", "kv_cache", "delta_ref", "delta_ref_lo",
                                          "delta_ref_hi", "delta_ref_row"])
    columns = ["model", "row", "tasks", "fixed_tasks", "benchmarks", "report_examples", "benchmark_list", "seeds",
               "average", "average_lo", "average_hi", "delta_base", "delta_base_lo", "delta_base_hi", "mdd_base"]
    frame = pd.DataFrame(summary).reindex(columns=columns)
    for key in ("tasks", "fixed_tasks", "benchmarks", "report_examples"):
        frame[key] = frame[key].astype("Int64")
    return pd.concat(seeds, ignore_index=True), fp8_frame, frame



# -- the claims' second reading (analysis.claims adds it beside the first) --------------------------------------


def extended_judged(registry: str | Path | None = None) -> list[str]:
    """The claims the extended suite reads a second time (analysis/claims.yaml, extended_suite.judged)."""
    import yaml

    from analysis.claims import REGISTRY

    block = yaml.safe_load(Path(registry or REGISTRY).read_text()).get("extended_suite") or {}
    return list(block.get("judged", []))


def extended_reading(claim, reports: Path, registered_points: bool) -> dict | None:
    """A claim's extended-suite verdict (analysis/claims.yaml, extended_suite): its own evaluator and rule on the
    study's files (``<reports>/extended_suite/``, from ``extended_tables``), beside the power run's and never replacing
    it; None where the study has not run."""
    from analysis.claims import AWAITING, DECIDED, PROVISIONAL, _judged, _points_text
    from analysis.rules import UNCLEAR, decide

    folder = reports / FOLDER
    if not (folder / "seeds.csv").is_file():
        return None
    ev, points, missing, decider = _judged(claim, folder, registered_points)
    decided = bool(ev.points) and (ev.seeded or ev.powered or claim.decided_by.startswith("default profile")) \
        and not missing
    return {"verdict": decide(claim.rule, points) if ev.points else UNCLEAR,
            "status": AWAITING if not ev.points else DECIDED if decided else PROVISIONAL,
            "estimate": decider.estimate if decider else math.nan, "lo": decider.lo if decider else math.nan,
            "hi": decider.hi if decider else math.nan, "points": _points_text(claim.rule, points)}


# -- the MMLU part scored twice (analysis/claims.yaml, extended_suite.rows) --------------------------------------


def _loglikelihoods(sample: dict) -> np.ndarray | None:
    resps = sample.get("filtered_resps")
    return np.array([float(r[0]) for r in resps]) if resps else None


def _find(raws: list[Path], source: str) -> tuple[Path, Path] | None:
    for raw in raws:
        path = raw_path(raw, source)
        if path.is_file() or path.with_name(path.name + ".gz").is_file():
            return raw, path
    return None


def mmlu_agreement(raw: str | Path, power_raws: list[str | Path], models: list[dict]) -> pd.DataFrame:
    """Per row-seed of the study, its fixed part (the power run's suite, kept as chosen) against the power run's
    evaluation of the same checkpoint on the same questions: how many questions each has that the other lacks, on how
    many the task's metric differs, and the largest difference of a choice's log-likelihood. ``models`` as for
    ``extended_tables``; ``power_raws``: the power run's raw folders (``POWER_RAWS``), searched in that order. A
    row-seed the power run's folders do not hold is an error: the study only re-scores what the power run scored."""
    raws, rows = [Path(p) for p in power_raws], []
    for spec in models:
        model = spec["model"]
        chosen = read_json(raw_path(raw, extended_path(model, "tasks.json")))
        fixed = chosen["tasks"][:chosen.get("fixed", 0)]
        for r in spec["runs"]:
            source = power_run_path(model, r["variant"], r["seed"], r["kv_cache"], spec["own_seed"])
            found = _find(raws, source)
            if found is None:
                raise ValueError(f"{source} (the power run's {r['variant']} at seed {r['seed']}, {r['kv_cache']} "
                                 f"cache) is in none of {', '.join(str(p) for p in raws)}")
            folder, path = found
            ours, theirs = read_json(raw_path(raw, r["lm_eval"])), read_json(path)
            rec = {"model": model, "variant": r["variant"], "seed": r["seed"], "kv_cache": r["kv_cache"],
                   "power_run": f"{folder.name}/{path.relative_to(folder).as_posix()}",
                   "tasks": len(fixed), "questions": 0, "only_one": 0, "score_differs": 0}
            diffs = []  # per question compared: its largest choice difference (None: not comparable)
            for task in fixed:
                metric = task["metric"].partition(",")[0]
                a, b = dict(task_samples(ours, task["name"])), dict(task_samples(theirs, task["name"]))
                rec["only_one"] += len(a.keys() ^ b.keys())
                for key in a.keys() & b.keys():
                    rec["questions"] += 1
                    rec["score_differs"] += a[key].get(metric) != b[key].get(metric)
                    la, lb = _loglikelihoods(a[key]), _loglikelihoods(b[key])
                    comparable = la is not None and lb is not None and la.shape == lb.shape
                    diffs.append(float(np.abs(la - lb).max(initial=0.0)) if comparable else None)
            rec["largest_ll_difference"] = math.nan if None in diffs else max(diffs, default=0.0)
            rows.append(rec)
    return pd.DataFrame(rows, columns=["model", "variant", "seed", "kv_cache", "power_run", "tasks", "questions",
                                       "only_one", "score_differs", "largest_ll_difference"])


# -- the README's section (analysis.readme) ---------------------------------------------------------------------------


def extended_markdown(summary: pd.DataFrame, agreement: pd.DataFrame | None = None,
                      labels: dict[str, str] | None = None) -> str:
    """``<root>/extended_suite.csv`` as the README's table (the suite, then per row its average, difference from the
    base model and minimum detectable difference), with the MMLU part's agreement with the power run, counted per
    KV cache from ``agreement.csv``."""
    from analysis.seeds import _ci

    labels = labels or {}
    parts = []
    for model, rows in summary.groupby("model", sort=False):
        suite = rows[rows.row == "suite"].iloc[0]
        tasks, fixed = int(suite.tasks), int(suite.fixed_tasks)
        benchmarks = str(suite.benchmark_list).split()
        parts.append(f"{model}: {tasks} tasks ({fixed} of the power run's suite, {tasks - fixed} added by the suite "
                     f"rule) in {len(benchmarks)} benchmarks ({', '.join(benchmarks)}), "
                     f"{int(suite.report_examples):,} report examples; the average is the mean over benchmarks, "
                     f"MMLU's subjects one benchmark. 95% intervals over training seeds and report examples.\n")
        lines = ["| row | seeds | average (%) | Δ vs base | minimum detectable Δ vs base |", "|---|---|---|---|---|"]
        for _, r in rows[rows.row != "suite"].iterrows():
            r = r.to_dict()
            seeds = str(r["seeds"])
            seeds = seeds if seeds == "untrained" else str(len(seeds.split()))
            mdd = "" if pd.isna(r["mdd_base"]) else f"{r['mdd_base']:.1f}"
            lines.append(f"| {labels.get(r['row'], r['row'])} | {seeds} | {_ci(r, 'average')} | "
                         f"{_ci(r, 'delta_base', signed=True)} | {mdd} |")
        parts.append("\n".join(lines) + "\n")
    if agreement is not None and len(agreement):
        said = []
        for kv, g in agreement.groupby("kv_cache", sort=False):
            said.append(f"{kv} KV cache, {len(g)} row-seeds: {int(g.questions.sum()):,} question scores compared, "
                        f"{int(g.only_one.sum())} in one run only, {int(g.score_differs.sum())} scored differently, "
                        f"largest log-likelihood difference {g.largest_ll_difference.max():.2g}")
        parts.append("The MMLU part scored again against the power run's evaluations of the same checkpoints "
                     "(extended_suite/agreement.csv): " + "; ".join(said) + ".\n")
    return "\n".join(parts)
