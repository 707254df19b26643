"""Training-seed variance (issue 16): the compared rows of Tables 2, 4a, 4b and B.2 distilled with several seeds.

A seed changes the training token stream (which conversations, in which order; the teacher cache of that seed); the
initialisation of SwiftKV is deterministic and the held-out and evaluation sets are fixed. Every seed's student is
evaluated exactly as the tables' rows are (the same tasks, examples, perplexity documents and fidelity sequences).

``reports/seeds.csv`` has one row per (model, variant, seed) — ``seed`` = the seed — and one pooled row per
(model, variant) — ``seed`` = ``all`` — whose intervals carry training-seed and report-split example variance
together: a seed-level t interval with the examples' variance added (``analysis.stats.seed_difference_ci``; a
per-seed row's interval is over examples only):

- ``average``: task-average accuracy (percent), the mean over seeds;
- ``delta_base``: average minus the base model's, paired on the same examples;
- ``delta_ref`` / ``ref``: the same against the row this one is compared with (``reference``): SwiftKV 50% for the
  ablations, the AcrossKV row of the same KV budget for MQA; both rows' seeds are resampled;
- ``average_seed_sd``: the standard deviation of the per-seed averages (the spread training alone adds);
- ``heldout_kl``: the training log's final held-out KL (nats/token; ``swiftkv distill``'s fixed 2,048-token
  held-out sample) — per seed, and its mean and seed SD in the pooled row;
- ``kl`` / ``top1``: the evaluation's fidelity to the teacher (``swiftkv.measure.fidelity``: KL per token and top-1
  agreement on the fidelity sequences), per seed and mean.
- ``kl_seq`` / ``kl_delta_ref``: the held-out KL as the registry's co-primary measure (analysis/claims.yaml,
  power_run.heldout_kl): per fidelity sequence its KL per token (kl_sum / tokens), a run's value the mean over the
  sequences (``kl`` weights sequences by their tokens instead); ``kl_delta_ref`` is KL(row) - KL(ref) paired on the
  sequences. Pooled rows carry intervals over seeds and sequences (``seed_difference_ci``, the sequences as the
  examples of one task), in nats/token, unscaled.

A row without training (the untrained rewiring) has one evaluation, used for every seed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.accuracy import teacher_forced
from analysis.distill import SUMMARY_FILE
from analysis.io import read_json, task_scores
from analysis.raw import eval_path
from analysis.stats import BootstrapSettings, hierarchical_difference_ci, seed_difference_ci


@dataclass(frozen=True)
class SeedRun:
    """One evaluated student: its row, its training seed (None: not trained) and where its results are."""

    model: str
    variant: str
    seed: int | None
    lm_eval: str | Path
    fidelity: str | Path | None = None
    checkpoint: str | Path | None = None


def checkpoint_path(model: str, variant: str, seed: int, profile_seed: int) -> str:
    """The checkpoint of (model, variant) trained with ``seed``: the tables' own run for the profile's seed."""
    if seed == profile_seed:
        return f"results/checkpoints/{model}/{variant}"
    return f"results/seeds/{model}/{variant}/seed-{seed}/checkpoint"


def seed_runs(model: str, variants: list[str], seeds: list[int], profile_seed: int,
              trained: dict[str, bool]) -> list[dict]:
    """The runs of the seeds study for a model, with their ``results/`` paths: per trained variant one per seed (the
    profile's seed is the tables' own run and evaluation), an untrained variant once (seed None: the tables'
    evaluation). The workflow (rules make_seeds / raw_seeds) and the tests take the runs from here."""
    runs = []
    for variant in variants:
        for seed in seeds if trained[variant] else [None]:
            own = seed is None or seed == profile_seed
            d = eval_path(model, variant, "native") if own else f"results/seeds/{model}/{variant}/seed-{seed}/native"
            runs.append({"variant": variant, "seed": seed, "lm_eval": f"{d}/lm_eval.json",
                         "fidelity": f"{d}/fidelity.json",
                         "checkpoint": None if seed is None else checkpoint_path(model, variant, seed, profile_seed)})
    return runs


def _matrix(runs: list[dict], base: dict, tasks: list[dict]) -> list[np.ndarray]:
    """Per task: (seeds, examples) scores of ``runs`` on the base model's examples, in the base model's order."""
    out = []
    for t in tasks:
        keys = task_scores(base, t["name"], t["metric"]).keys
        out.append(np.stack([task_scores(r, t["name"], t["metric"]).aligned(keys) for r in runs]))
    return out


POOLED_FAMILIES = ("mmlu",)  # benchmarks whose tasks (MMLU's subjects) count as one benchmark when pooled


def benchmark_of(task: dict) -> str:
    """The benchmark a task of a task list belongs to: ``mmlu`` for MMLU's subjects (one benchmark, as in the
    paper's tables), the task itself otherwise (``olmes/arc_easy``)."""
    source = task.get("source") or task["name"]
    family = source.split("/")[0]
    return family if family in POOLED_FAMILIES else source


def pool_benchmarks(matrices: list[np.ndarray], tasks: list[dict]) -> list[np.ndarray]:
    """Per-task (seeds, examples) matrices joined per benchmark (``benchmark_of``), in order of first appearance:
    the macro mean over the result is the mean over benchmarks (analysis/claims.yaml, extended_suite.estimator)."""
    order: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        order.setdefault(benchmark_of(t), []).append(i)
    return [np.concatenate([matrices[i] for i in idx], axis=1) for idx in order.values()]


def _fidelity(path) -> tuple[dict, np.ndarray | None]:
    """A run's fidelity file read once: its token-weighted KL and top-1 agreement, and per sequence its KL per token
    (the co-primary measure's examples); ({}, None) without a fidelity file."""
    if not path or not (Path(path).is_file() or Path(f"{path}.gz").is_file()):
        return {}, None
    kl, top1, tokens = teacher_forced(read_json(path))
    return {"kl": kl.sum() / tokens.sum(), "top1": 100 * top1.sum() / tokens.sum()}, kl / tokens


def _kl_matrix(runs: list[SeedRun], sequences: dict) -> list[np.ndarray] | None:
    """The runs' per-sequence KL as one task of shape (seeds, sequences), or None if a run has none (or the runs
    measured different numbers of sequences: they could not be paired)."""
    rows = [sequences[id(r)] for r in runs]
    if any(x is None for x in rows) or len({len(x) for x in rows}) != 1:
        return None
    return [np.stack(rows)]


def _heldout_kl(checkpoint) -> float:
    path = Path(checkpoint) / SUMMARY_FILE if checkpoint else None
    if path is None or not path.is_file():
        return math.nan
    return json.loads(path.read_text()).get("heldout_final", {}).get("heldout_kl", math.nan)


def _put(rec: dict, name: str, ci, scale: float = 100.0) -> None:
    rec[name], rec[f"{name}_lo"], rec[f"{name}_hi"] = ci.value * scale, ci.low * scale, ci.high * scale


def build_seeds_table(runs: list[SeedRun], base: SeedRun, tasks: list[dict], reference: dict[str, str],
                      settings: BootstrapSettings = BootstrapSettings(), by_benchmark: bool = False) -> pd.DataFrame:
    """Per-seed rows, then one pooled row per variant (see the module docstring). ``reference``: variant -> the
    variant it is compared with (``delta_ref``); ``default`` for any other. ``by_benchmark``: the task average is the
    mean over benchmarks (``pool_benchmarks``: MMLU's subjects one benchmark) instead of over tasks."""
    base_results = read_json(base.lm_eval)
    results = {id(r): read_json(r.lm_eval) for r in runs}
    by_variant: dict[str, list[SeedRun]] = {}
    for r in runs:
        by_variant.setdefault(r.variant, []).append(r)
    matrices = {v: _matrix([results[id(r)] for r in rs], base_results, tasks) for v, rs in by_variant.items()}
    base_matrix = _matrix([base_results], base_results, tasks)
    if by_benchmark:
        matrices = {v: pool_benchmarks(m, tasks) for v, m in matrices.items()}
        base_matrix = pool_benchmarks(base_matrix, tasks)
    model = base.model

    read = {id(r): _fidelity(r.fidelity) for r in runs}  # each run's files read once
    fidelity = {k: summary for k, (summary, _) in read.items()}
    sequences = {k: per_sequence for k, (_, per_sequence) in read.items()}
    kl_matrices = {v: _kl_matrix(rs, sequences) for v, rs in by_variant.items()}
    heldout = {id(r): _heldout_kl(r.checkpoint) for r in runs}
    records = []
    for v, rs in by_variant.items():
        for i, r in enumerate(rs):
            rec = {"model": model, "variant": v, "seed": "untrained" if r.seed is None else str(r.seed),
                   "n_seeds": 1}
            one = [m[i:i + 1] for m in matrices[v]]
            _put(rec, "average", hierarchical_difference_ci(one, None, settings))
            _put(rec, "delta_base", hierarchical_difference_ci(one, base_matrix, settings))
            rec.update(fidelity[id(r)])
            rec["heldout_kl"] = heldout[id(r)]
            if sequences[id(r)] is not None:
                rec["kl_seq"] = float(sequences[id(r)].mean())
            records.append(rec)
    for v, rs in by_variant.items():
        m = matrices[v]
        per_seed = 100 * np.mean([x.mean(axis=1) for x in m], axis=0)
        rec = {"model": model, "variant": v, "seed": "all", "n_seeds": len(rs),
               "seeds": " ".join("untrained" if r.seed is None else str(r.seed) for r in rs)}
        _put(rec, "average", seed_difference_ci(m, None, settings.confidence))
        rec["average_seed_sd"] = float(np.std(per_seed, ddof=1)) if len(rs) > 1 else math.nan
        _put(rec, "delta_base", seed_difference_ci(m, base_matrix, settings.confidence))
        ref = reference.get(v, reference.get("default"))
        if ref and ref != v and ref in matrices:
            _put(rec, "delta_ref", seed_difference_ci(m, matrices[ref], settings.confidence))
            rec["ref"] = ref
        fid = [fidelity[id(r)] for r in rs]
        for key in ("kl", "top1"):
            vals = [f[key] for f in fid if key in f]
            if vals:
                rec[key] = float(np.mean(vals))
        kls = [k for k in (heldout[id(r)] for r in rs) if not math.isnan(k)]
        rec["heldout_kl"] = float(np.mean(kls)) if kls else math.nan
        rec["heldout_kl_seed_sd"] = float(np.std(kls, ddof=1)) if len(kls) > 1 else math.nan
        if kl_matrices[v] is not None:
            _put(rec, "kl_seq", seed_difference_ci(kl_matrices[v], None, settings.confidence), 1.0)
            if ref and ref != v and kl_matrices.get(ref) is not None \
                    and kl_matrices[ref][0].shape[1] == kl_matrices[v][0].shape[1]:
                _put(rec, "kl_delta_ref", seed_difference_ci(kl_matrices[v], kl_matrices[ref], settings.confidence),
                     1.0)
        records.append(rec)
    columns = ["model", "variant", "seed", "n_seeds", "seeds", "average", "average_lo", "average_hi",
               "average_seed_sd", "delta_base", "delta_base_lo", "delta_base_hi", "ref", "delta_ref", "delta_ref_lo",
               "delta_ref_hi", "heldout_kl", "heldout_kl_seed_sd", "kl", "top1", "kl_seq", "kl_seq_lo", "kl_seq_hi",
               "kl_delta_ref", "kl_delta_ref_lo", "kl_delta_ref_hi"]
    frame = pd.DataFrame.from_records(records)
    return frame.reindex(columns=columns)


def seeds_from_raw(raw: str | Path, models: list[dict], reference: dict[str, str],
                   settings: BootstrapSettings = BootstrapSettings()) -> pd.DataFrame:
    """reports/seeds.csv from the raw folder (``analysis.raw``): ``models`` as the rule's params give them (per model
    its runs, with their ``results/`` paths: variant, seed, lm_eval, fidelity, checkpoint)."""
    from analysis.raw import raw_path

    def at(p):
        return raw_path(raw, p) if p else None

    frames = []
    for spec in models:
        model = spec["model"]
        with open(at(eval_path(model, "tasks.json"))) as f:
            tasks = json.load(f)["tasks"]
        runs = [SeedRun(model, r["variant"], r["seed"], at(r["lm_eval"]), at(r["fidelity"]), at(r["checkpoint"]))
                for r in spec["runs"]]
        base = SeedRun(model, "base", None, at(eval_path(model, "base", "native", "lm_eval.json")))
        frames.append(build_seeds_table(runs, base, tasks, reference, settings))
    return pd.concat(frames, ignore_index=True)


def _ci(r, name: str, digits: int = 1, signed: bool = False) -> str:
    v, lo, hi = r.get(name), r.get(f"{name}_lo"), r.get(f"{name}_hi")
    if v is None or pd.isna(v):
        return ""
    f = f"{{:+.{digits}f}}" if signed else f"{{:.{digits}f}}"
    return f"{f.format(v)} [{f.format(lo)}, {f.format(hi)}]".replace("-", "−")


def seeds_markdown(frame: pd.DataFrame, labels: dict[str, str] | None = None) -> str:
    """The pooled rows of reports/seeds.csv as the README's table (generated, never typed: tests/test_seeds.py)."""
    labels = labels or {}
    lines = ["| row (SmolLM2-135M) | seeds | average (seed SD) | Δ vs base | Δ vs ref (ref) | training log's KL (seed SD) "
             "| co-primary KL, Δ vs ref (nats/token) |",
             "|---|---|---|---|---|---|---|"]
    for _, r in frame[frame.seed.astype(str) == "all"].iterrows():
        r = r.to_dict()
        sd = "" if pd.isna(r["average_seed_sd"]) else f" ({r['average_seed_sd']:.1f})"
        ref = f"{_ci(r, 'delta_ref', signed=True)} ({r['ref']})" if isinstance(r.get("ref"), str) else ""
        kl = "" if pd.isna(r["heldout_kl"]) else f"{r['heldout_kl']:.3f}"
        if kl and not pd.isna(r["heldout_kl_seed_sd"]):
            kl += f" ({r['heldout_kl_seed_sd']:.3f})"
        lines.append(f"| {labels.get(r['variant'], r['variant'])} | {r['seeds']} | {_ci(r, 'average')}{sd} | "
                     f"{_ci(r, 'delta_base', signed=True)} | {ref} | {kl} | "
                     f"{_ci(r, 'kl_delta_ref', digits=3, signed=True)} |")
    return "\n".join(lines) + "\n"
