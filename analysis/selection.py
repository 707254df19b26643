"""Which BIG-bench tasks to report: those where the base model beats chance, decided on the selection split only.

For every candidate task and metric (accuracy, length-normalised accuracy) the base model's per-example excess
over chance (correct - 1/choices, or the share of correct choices when several are correct) gets a bootstrap
interval on the *selection* half of the examples. A task is kept when the interval of its better metric lies
above zero; the reported scores come from the other half (the *report* split), which selection never saw.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.io import task_scores
from analysis.stats import BootstrapSettings, mean_ci


def _chances(result: dict, task: str) -> dict[str, float]:
    return {f"{task}/{s['doc']['id']}": float(s["doc"]["chance"]) for s in result["samples"][task]}


def check_same_questions(result: dict, manifest: dict, selection_dir: str | Path) -> None:
    """Raise unless ``result`` (a selection run, e.g. the committed one) scored exactly this build's selection half
    of every task of ``manifest`` (its files in ``selection_dir``): the same question ids, task by task (the ids hash
    the task, the question and its choices: swiftkv.data.bigbench.example_id)."""
    import json

    folder = Path(selection_dir)
    for name, entry in sorted(manifest["tasks"].items()):
        task = entry["splits"]["selection"]["task"]
        with open(folder / f"{entry['slug']}.jsonl", encoding="utf-8") as f:
            built = {json.loads(line)["id"] for line in f if line.strip()}
        scored = {s["doc"]["id"] for s in result.get("samples", {}).get(task, [])}
        if scored != built:
            raise ValueError(f"the selection run scored {len(scored)} questions of {name} and this build's selection "
                             f"half has {len(built)} ({len(scored & built)} in both): it was run on other questions")
    extra = set(result.get("samples", {})) - {e["splits"]["selection"]["task"] for e in manifest["tasks"].values()}
    if extra:
        raise ValueError(f"the selection run scored tasks this build does not have: {', '.join(sorted(extra))}")


def select_tasks(
    result: dict,
    manifest: dict,
    metrics: tuple[str, ...] = ("acc,none", "acc_norm,none"),
    max_tasks: int | None = None,
    min_tasks: int = 1,
    settings: BootstrapSettings = BootstrapSettings(),
) -> dict:
    """The chosen report-split tasks (lm-eval names, metric, chance) and the evidence for every candidate."""
    candidates = []
    for name, entry in sorted(manifest["tasks"].items()):
        sel = entry["splits"]["selection"]
        if sel["task"] not in result.get("samples", {}):
            raise ValueError(f"selection run has no samples for {sel['task']}")
        chance = _chances(result, sel["task"])
        best = None
        for metric in metrics:
            scores = task_scores(result, sel["task"], metric)
            excess = scores.values - np.array([chance[k] for k in scores.keys])
            ci = mean_ci(excess, settings)
            row = {"source": name, "selection_task": sel["task"], "metric": metric, "n": len(excess),
                   "score": float(scores.values.mean()), "chance": float(np.mean([chance[k] for k in scores.keys])),
                   "excess": ci.value, "excess_low": ci.low, "excess_high": ci.high}
            candidates.append(row)
            if best is None or row["excess_low"] > best["excess_low"]:
                best = row
        best["best_metric"] = True
    ranked = sorted((c for c in candidates if c.get("best_metric")), key=lambda c: -c["excess_low"])
    chosen = [dict(c, selected_by="interval above chance") for c in ranked if c["excess_low"] > 0]
    if len(chosen) < min_tasks:  # too few pass (tiny CI samples): fill up with the next best, marked as such
        chosen += [dict(c, selected_by="min_tasks fill-up (interval not above chance)")
                   for c in ranked[len(chosen):min_tasks]]
    dropped_for_budget = chosen[max_tasks:] if max_tasks else []
    chosen = chosen[:max_tasks] if max_tasks else chosen
    tasks = []
    for c in sorted(chosen, key=lambda c: c["source"]):
        report = manifest["tasks"][c["source"]]["splits"]["report"]
        tasks.append({"name": report["task"], "metric": c["metric"], "source": c["source"], "n": report["n"],
                      "chance": report["chance"], "num_fewshot": 0, "selected_by": c["selected_by"]})
    return {
        "rule": f"keep a task when the {settings.confidence:.0%} bootstrap interval of (score - chance) on the "
                "selection split lies above 0 for its better metric; report on the report split",
        "max_tasks": max_tasks,
        "min_tasks": min_tasks,
        "bootstrap": asdict(settings),
        "tasks": tasks,
        "dropped_for_budget": [c["source"] for c in dropped_for_budget],
        "candidates": candidates,
    }


def extend_tasks(fixed: dict, chosen: dict, include_paths: list[str]) -> dict:
    """The extended suite's task list (analysis/claims.yaml, extended_suite): every task of ``fixed`` (the suite's
    own choice, as it was made) and the tasks ``chosen`` by the rule among the new candidates, with the evidence of
    those; ``include_paths``: the report folders the tasks' YAMLs are in."""
    names = {t["name"] for t in fixed["tasks"]}
    clash = sorted(names & {t["name"] for t in chosen["tasks"]})
    if clash:
        raise ValueError(f"the new candidates repeat tasks of the fixed suite: {', '.join(clash)}")
    kept = [dict(t, selected_by=f"fixed: the suite's choice ({t.get('selected_by', 'as chosen')})")
            for t in fixed["tasks"]]
    return {**chosen, "tasks": kept + chosen["tasks"], "fixed": len(kept), "include_path": include_paths}


def suite_table(raw: str | Path) -> pd.DataFrame:
    """The suite's selection (a raw folder of rule raw_suite: ``eval/<model>/tasks.json`` and the tasks' manifest),
    one row per (model, candidate task, metric): the selection-half evidence, whether the metric is the task's better
    one, whether the task is reported, and its report-half size."""
    from analysis.io import read_json

    raw = Path(raw)
    manifest = read_json(raw / "tasks" / "bigbench" / "manifest.json")
    rows = []
    for tasks_json in sorted(raw.glob("eval/*/tasks.json")):
        chosen = read_json(tasks_json)
        reported = {t["source"]: t for t in chosen["tasks"]}
        for c in chosen["candidates"]:
            report = manifest["tasks"][c["source"]]["splits"]["report"]
            rows.append({"model": tasks_json.parent.name, "task": c["source"], "metric": c["metric"],
                         "selection_n": c["n"], "score": c["score"], "chance": c["chance"], "excess": c["excess"],
                         "excess_low": c["excess_low"], "excess_high": c["excess_high"],
                         "better_metric": bool(c.get("best_metric")),
                         "reported": reported.get(c["source"], {}).get("metric") == c["metric"],
                         "report_n": report["n"]})
    return pd.DataFrame(rows)
