"""The budget-scaling study (issue 16, item 3): reports/budget_scaling.csv and its figure from the raw results.

Each row of the study (config ``budget_scaling.runs``) is one warmup-stable-decay run read at every budget
(``swiftkv distill --schedule wsd``): its ``distill.json`` holds, per budget, the held-out KL and top-1 sums per
held-out packed row. How a claim is read from these numbers was registered before the run (analysis/claims.yaml,
``budget_scaling``); this module applies it:

- ``point``: per run and budget, held-out KL (nats/token, T = 1) and top-1 agreement (%), 95% bootstrap intervals
  over held-out rows; at the smallest and largest budget also the task average and its difference to the base
  model (points, paired bootstrap over examples).
- ``fit``: per run, KL = a * tokens^(-b), least squares in log-log over every budget; the interval on b refits the
  same bootstrap resamples of held-out rows (shared by every budget).
- ``pair``: per registered comparison and budget, KL(other) - KL(claimed better) with a paired bootstrap over the
  same held-out rows and the direction rule (threshold 0); margin claims get the difference without a KL verdict.
  At the end points the claim's own accuracy rule on the paired accuracy difference.
- ``ordering``: per comparison, whether the per-budget verdict is the same at every budget.
- ``check``: the WSD reading against separate cosine runs at two budgets (relative KL difference, 5% tolerance).

The table is tidy: one number per row (``kind``, ``claim``, ``run``, ``other``, ``budget``, ``tokens``, ``metric``,
``estimate``, ``lo``, ``hi``, ``verdict``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.io import read_json, save_figure, task_scores
from analysis.raw import eval_path
from analysis.stats import BootstrapSettings, macro_mean_ci, paired_difference_ci, paired_ratio_difference_ci, ratio_ci

COLUMNS = ["kind", "claim", "run", "other", "budget", "tokens", "metric", "estimate", "lo", "hi", "verdict"]
CHECK_TOLERANCE = 0.05  # registered: the WSD reading agrees if the held-out KL differs by at most 5% (relative)
NOT_A_KL_CLAIM = "n/a (margin claim)"


def study_paths(study: dict) -> dict:
    """The ``results/`` paths the study's table reads (rule raw_budget_scaling's inputs and the raw folder's
    layout): per run its run directory (the largest budget's student: its distill.json holds every budget's read)
    and its evaluation directories (lm_eval.json) at the ``accuracy_at`` points."""
    model = study["model"]
    root = f"results/budget_scaling/{model}"
    names = [r["name"] for r in study["runs"]]
    return {
        "runs": {r: f"{root}/{r}/largest" for r in names},
        "evals": {r: {p: f"{root}/{r}/eval-{p}/native" for p in study.get("accuracy_at", ["smallest", "largest"])}
                  for r in names},
        "checks": {int(t): f"{root}/{study['check']['run']}/check-{t}" for t in study["check"]["budgets"]},
        "base": eval_path(model, "base", "native", "lm_eval.json"),
        "tasks": eval_path(model, "tasks.json"),
    }


def _rows(read: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = read["heldout_rows"]
    return (np.array([r["kl_sum"] for r in rows], dtype=float), np.array([r["top1_sum"] for r in rows], dtype=float),
            np.array([r["positions"] for r in rows], dtype=float))


def _matrix(result: dict, base: dict, tasks: list[dict]) -> list[np.ndarray]:
    """Per task: the run's per-example scores on the base model's examples, in the base model's order."""
    return [task_scores(result, t["name"], t["metric"]).aligned(task_scores(base, t["name"], t["metric"]).keys)
            for t in tasks]


def _rec(kind, metric, interval=None, scale=1.0, **kw) -> dict:
    rec = {"kind": kind, "metric": metric, **kw}
    if interval is not None:
        rec.update(estimate=interval.value * scale, lo=interval.low * scale, hi=interval.high * scale)
    return rec


def power_law_fit(tokens: np.ndarray, kl: np.ndarray) -> tuple[float, float]:
    """(a, b) of kl = a * tokens^(-b), least squares in log-log; ``kl`` may be (resamples, budgets)."""
    x = np.log(np.asarray(tokens, dtype=float))
    y = np.log(np.asarray(kl, dtype=float))
    xc = x - x.mean()
    slope = (y - y.mean(axis=-1, keepdims=True)) @ xc / (xc @ xc)
    intercept = y.mean(axis=-1) - slope * x.mean()
    return np.exp(intercept), -slope


def _fit_records(run: str, reads: list[dict], settings: BootstrapSettings) -> list[dict]:
    tokens = np.array([r["tokens"] for r in reads], dtype=float)
    kl_sums = np.stack([_rows(r)[0] for r in reads])  # (budgets, rows)
    positions = _rows(reads[0])[2]
    a, b = power_law_fit(tokens, kl_sums.sum(axis=1) / positions.sum())
    rng = np.random.default_rng(settings.seed)
    idx = rng.integers(0, len(positions), size=(settings.resamples, len(positions)))
    boot = kl_sums[:, idx].sum(axis=2).T / positions[idx].sum(axis=1)[:, None]  # (resamples, budgets)
    _, bs = power_law_fit(tokens, boot)
    alpha = (1 - settings.confidence) / 2
    lo, hi = np.quantile(bs, [alpha, 1 - alpha])
    return [{"kind": "fit", "run": run, "metric": "exponent_b", "estimate": float(b), "lo": float(lo), "hi": float(hi)},
            {"kind": "fit", "run": run, "metric": "prefactor_a", "estimate": float(a)}]


def ordering(verdicts: list[str]) -> str:
    """The registered reading of per-budget verdicts (analysis/claims.yaml, budget_scaling.ordering)."""
    from analysis.rules import FAILS, HOLDS

    if verdicts and all(v == HOLDS for v in verdicts):
        return "same at every budget (holds)"
    if verdicts and all(v == FAILS for v in verdicts):
        return "same at every budget (does not hold)"
    if HOLDS in verdicts and FAILS in verdicts:
        return "reverses"
    return "undecided at some budgets"


def build_scaling_table(study: dict, reads: dict[str, list[dict]], checks: dict[int, dict],
                        evals: dict[str, dict[str, dict]], base: dict, tasks: list[dict],
                        settings: BootstrapSettings = BootstrapSettings(), registry=None) -> pd.DataFrame:
    """The tidy table (module docstring). ``reads``: run -> its budget reads (distill.json ``budget_reads``);
    ``checks``: budget -> the check run's distill.json; ``evals``: run -> {smallest, largest: lm-eval result}."""
    from analysis.claims import REGISTRY, load_registry
    from analysis.rules import Point, Rule, point_verdict

    rules = {c.id: c.rule for c in load_registry(registry or REGISTRY)}
    kl_rule = Rule(kind="direction", direction="above", threshold=0.0)
    base_matrix = _matrix(base, base, tasks)
    matrices = {r: {p: _matrix(res, base, tasks) for p, res in pts.items()} for r, pts in evals.items()}
    ends = {"smallest": min(study["budgets"]), "largest": max(study["budgets"])}
    records = []
    for run, rs in reads.items():
        for read in rs:
            kl, top1, pos = _rows(read)
            common = {"run": run, "budget": read["budget"], "tokens": read["tokens"]}
            records.append(_rec("point", "heldout_kl", ratio_ci(kl, pos, settings), **common))
            records.append(_rec("point", "heldout_top1", ratio_ci(top1, pos, settings), 100.0, **common))
        for point, budget in ends.items():
            if point not in matrices.get(run, {}):
                continue
            m = matrices[run][point]
            tokens = next(r["tokens"] for r in rs if r["budget"] == budget)
            common = {"run": run, "budget": budget, "tokens": tokens}
            records.append(_rec("point", "accuracy", macro_mean_ci(m, settings), 100.0, **common))
            records.append(_rec("point", "accuracy_delta_base", paired_difference_ci(m, base_matrix, settings), 100.0,
                                other="base", **common))
        records += _fit_records(run, rs, settings)

    for claim, better, other in study["pairs"]:
        rule = rules[claim]
        if other != "base" and better in reads and other in reads:
            verdicts = []
            for ra, rb in zip(reads[better], reads[other], strict=True):
                kl_a, _, pos = _rows(ra)
                kl_b, _, pos_b = _rows(rb)
                ci = paired_ratio_difference_ci(kl_b, pos_b, kl_a, pos, settings)
                verdict = (point_verdict(kl_rule, Point(str(ra["budget"]), ci.value, ci.low, ci.high))
                           if rule.kind == "direction" else NOT_A_KL_CLAIM)
                verdicts.append(verdict)
                records.append(_rec("pair", "kl_difference", ci, claim=claim, run=better, other=other,
                                    budget=ra["budget"], tokens=ra["tokens"], verdict=verdict))
            if rule.kind == "direction":
                records.append({"kind": "ordering", "claim": claim, "run": better, "other": other,
                                "metric": "kl_difference", "verdict": ordering(verdicts)})
        for point, budget in ends.items():
            if point not in matrices.get(better, {}) or (other != "base" and point not in matrices.get(other, {})):
                continue
            theirs = base_matrix if other == "base" else matrices[other][point]
            ci = paired_difference_ci(matrices[better][point], theirs, settings).scaled(100.0)
            records.append(_rec("pair", "accuracy_difference", ci, claim=claim, run=better, other=other,
                                budget=budget, verdict=point_verdict(rule, Point(point, ci.value, ci.low, ci.high))))

    check_run = study["check"]["run"]
    for budget, summary in sorted(checks.items()):
        read = next((r for r in reads.get(check_run, []) if r["budget"] == budget), None)
        if read is None:
            continue
        cosine = summary["heldout_final"]["heldout_kl"]
        rel = read["heldout_kl"] / cosine - 1
        records.append({"kind": "check", "run": check_run, "budget": budget, "tokens": read["tokens"],
                        "metric": "kl_relative_difference_wsd_vs_cosine", "estimate": rel,
                        "lo": read["heldout_kl"], "hi": cosine,
                        "verdict": "agrees" if abs(rel) <= CHECK_TOLERANCE else "does not agree"})
    frame = pd.DataFrame.from_records(records).reindex(columns=COLUMNS)
    return frame.astype({"budget": "Int64", "tokens": "Int64"})  # counts stay integers in the CSV


def scaling_from_raw(raw: str | Path, study: dict, settings: BootstrapSettings = BootstrapSettings(),
                     registry=None) -> pd.DataFrame:
    """reports/budget_scaling.csv from the raw folder (``analysis.raw``)."""
    from analysis.raw import raw_path

    paths = study_paths(study)

    def summary(run_dir):
        return json.loads(raw_path(raw, f"{run_dir}/distill.json").read_text())

    reads = {r: summary(d)["budget_reads"] for r, d in paths["runs"].items()}
    checks = {t: summary(p) for t, p in paths["checks"].items()}
    evals = {r: {p: read_json(raw_path(raw, f"{d}/lm_eval.json")) for p, d in pts.items()}
             for r, pts in paths["evals"].items()}
    base = read_json(raw_path(raw, paths["base"]))
    tasks = json.loads(raw_path(raw, paths["tasks"]).read_text())["tasks"]
    return build_scaling_table(study, reads, checks, evals, base, tasks, settings, registry)


def plot_scaling(frame: pd.DataFrame, path: str | Path, labels: dict[str, str] | None = None) -> None:
    """Held-out KL (log-log, with each run's fitted power law) and top-1 agreement against training tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels or {}
    fig, (ax_kl, ax_top) = plt.subplots(1, 2, figsize=(12, 6.2))
    points = frame[frame.kind == "point"]
    fits = frame[frame.kind == "fit"].set_index(["run", "metric"])
    for run, grp in points.groupby("run", sort=False):
        kl = grp[grp.metric == "heldout_kl"].sort_values("tokens")
        top = grp[grp.metric == "heldout_top1"].sort_values("tokens")
        b = fits.loc[(run, "exponent_b")]
        a = fits.loc[(run, "prefactor_a"), "estimate"]
        label = f"{labels.get(run, run)}: b = {b.estimate:.2f} [{b.lo:.2f}, {b.hi:.2f}]"
        line = ax_kl.errorbar(kl.tokens, kl.estimate, yerr=[kl.estimate - kl.lo, kl.hi - kl.estimate], fmt="o",
                              ms=4, capsize=2, label=label)
        x = np.geomspace(kl.tokens.min(), kl.tokens.max(), 50)
        ax_kl.plot(x, a * x ** (-b.estimate), "-", lw=1, color=line[0].get_color())
        ax_top.errorbar(top.tokens, top.estimate, yerr=[top.estimate - top.lo, top.hi - top.estimate], fmt="o-",
                        ms=4, capsize=2, lw=1, color=line[0].get_color())
    ax_kl.set(xscale="log", yscale="log", xlabel="distillation tokens", ylabel="held-out KL(teacher || student), nats/token",
              title="Held-out KL; lines: KL = a * tokens^-b")
    ax_top.set(xscale="log", xlabel="distillation tokens", ylabel="top-1 agreement with the teacher (%)",
               title="Held-out top-1 agreement")
    for ax in (ax_kl, ax_top):
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("Budget scaling (one warmup-stable-decay run per row, read at every budget; 95% intervals over "
                 "held-out rows)", fontsize=9)
    handles, texts = ax_kl.get_legend_handles_labels()
    fig.legend(handles, texts, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def _ci_text(r, digits: int = 3, signed: bool = False) -> str:
    sign = "+" if signed else ""
    return f"{r.estimate:{sign}.{digits}f} [{r.lo:{sign}.{digits}f}, {r.hi:{sign}.{digits}f}]"


def scaling_markdown(frame: pd.DataFrame, labels: dict[str, str] | None = None) -> str:
    """The README's two tables from reports/budget_scaling.csv (generated, never typed: tests/test_scaling.py):
    per row the held-out KL at the smallest and largest budget, the fitted exponent and the accuracy difference to
    base at the end points; per registered comparison the KL verdict at each budget, the ordering and the accuracy
    verdicts at the end points."""
    labels = labels or {}
    points, fits = frame[frame.kind == "point"], frame[frame.kind == "fit"]
    budgets = sorted(points.budget.dropna().unique())
    lo_b, hi_b = int(budgets[0]), int(budgets[-1])
    acc_b = [int(b) for b in sorted(points[points.metric == "accuracy_delta_base"].budget.unique())]
    lines = [f"| row | held-out KL at {lo_b:,} tokens | at {hi_b:,} | exponent b | "
             + " | ".join(f"Δ accuracy vs base at {b:,} (points)" for b in acc_b) + " |",
             "|---|---|---|---|" + "---|" * len(acc_b)]
    for run in points.run.unique():
        p = points[points.run == run]

        def cell(metric, budget, digits=3, signed=False):
            r = p[(p.metric == metric) & (p.budget == budget)]
            return _ci_text(r.iloc[0], digits, signed) if len(r) else ""

        b = fits[(fits.run == run) & (fits.metric == "exponent_b")]
        lines.append(f"| {labels.get(run, run)} | {cell('heldout_kl', lo_b)} | {cell('heldout_kl', hi_b)} | "
                     f"{_ci_text(b.iloc[0], 2) if len(b) else ''} | "
                     + " | ".join(cell("accuracy_delta_base", x, 1, True) for x in acc_b) + " |")
    lines += ["", "| claim | rows | KL verdict per budget (smallest first) | ordering | accuracy verdict at "
              f"{' / '.join(f'{b:,}' for b in acc_b)} tokens |", "|---|---|---|---|---|"]
    pairs = frame[frame.kind == "pair"]
    orders = frame[frame.kind == "ordering"].set_index("claim")
    for claim in pairs.claim.unique():
        g = pairs[pairs.claim == claim]
        kl = g[g.metric == "kl_difference"].sort_values("budget")
        acc = g[g.metric == "accuracy_difference"].sort_values("budget")
        first = g.iloc[0]
        rows = f"{labels.get(first.run, first.run)} vs {labels.get(first.other, first.other)}"
        if not len(kl):
            kl_text = "(vs base: no KL comparison)"
        elif (kl.verdict == NOT_A_KL_CLAIM).all():
            kl_text = (f"no KL verdict (margin claim); KL({first.other}) - KL({first.run}): "
                       f"{kl.estimate.iloc[0]:+.2f} at {int(kl.budget.iloc[0]):,} → {kl.estimate.iloc[-1]:+.2f} at "
                       f"{int(kl.budget.iloc[-1]):,}")
        else:
            kl_text = ", ".join(kl.verdict)
        lines.append(f"| {claim} | {rows} | {kl_text} | "
                     f"{orders.loc[claim, 'verdict'] if claim in orders.index else ''} | "
                     f"{' / '.join(acc.verdict)} |")
    checks = frame[frame.kind == "check"]
    if len(checks):
        lines += ["", "WSD reading vs separate cosine runs (registered tolerance 5%): " + "; ".join(
            f"{int(r.budget):,} tokens: {r.lo:.3f} vs {r.hi:.3f} ({r.estimate:+.1%}, {r.verdict})"
            for r in checks.itertuples()) + "."]
    return "\n".join(lines) + "\n"


def run_labels(study: dict, sheet_labels: dict[str, str]) -> dict[str, str]:
    """Each run's label: its variants-sheet row's, and the loss positions where the run sets them."""
    out = {}
    for r in study["runs"]:
        label = sheet_labels.get(r["variant"], r["variant"])
        if r.get("loss_positions") == "assistant":
            label += ", loss on assistant tokens (Snowflake's current recipe)"
        out[r["name"]] = label
    return {**out, "base": "Base"}
