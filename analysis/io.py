"""Read evaluation results (lm-eval JSON with per-sample logs, fidelity JSON) into plain per-example arrays."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def read_json(path: str | Path) -> dict:
    with open(path) as f:
        return json.load(f)


def read_variants(path: str | Path) -> list[dict]:
    """Rows of ``config/variants.tsv`` as dicts (``tables`` split into a list)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    for row in rows:
        row["tables"] = [t for t in row.get("tables", "").split(",") if t]
    return rows


def split_metric(key: str) -> tuple[str, str]:
    """lm-eval metric key ``"acc,none"`` / ``"exact_match,strict_match"`` -> (metric, filter)."""
    metric, _, filt = key.partition(",")
    return metric, filt or "none"


def _doc_key(sample: dict) -> str:
    doc = sample.get("doc") or {}
    return str(doc["id"]) if isinstance(doc, dict) and "id" in doc else str(sample["doc_id"])


def _subtasks(result: dict, task: str) -> list[str]:
    groups = result.get("group_subtasks", {})
    if task in groups and groups[task]:
        out = []
        for sub in groups[task]:
            out += _subtasks(result, sub)
        return out
    return [task]


@dataclass
class TaskScores:
    """Per-example scores of one task (group tasks: all their subtasks' examples), keyed by example id."""

    task: str
    metric: str
    keys: list[str]
    values: np.ndarray

    def aligned(self, keys: list[str]) -> np.ndarray:
        index = dict(zip(self.keys, self.values))
        missing = [k for k in keys if k not in index]
        if missing:
            raise ValueError(f"{self.task}: {len(missing)} examples are missing from one of the rows compared")
        return np.array([index[k] for k in keys], dtype=float)


def task_scores(result: dict, task: str, metric_key: str) -> TaskScores:
    """Per-example values of ``metric_key`` (``"metric,filter"``) for ``task`` from an lm-eval result with samples."""
    metric, filt = split_metric(metric_key)
    keys, values = [], []
    for sub in _subtasks(result, task):
        for sample in result.get("samples", {}).get(sub, []):
            if sample.get("filter", "none") != filt or metric not in sample:
                continue
            keys.append(f"{sub}/{_doc_key(sample)}")
            values.append(float(sample[metric]))
    if not keys:
        raise ValueError(f"no per-sample '{metric_key}' for task {task}; was it run with log_samples?")
    return TaskScores(task, metric_key, keys, np.array(values))


@dataclass
class RollingScores:
    """Per-document (log-likelihood, words, bytes) of a loglikelihood_rolling task."""

    keys: list[str]
    loglikelihood: np.ndarray
    words: np.ndarray
    bytes: np.ndarray


def rolling_scores(result: dict, task: str) -> RollingScores:
    keys, ll, words, nbytes = [], [], [], []
    for sample in result.get("samples", {}).get(task, []):
        if "word_perplexity" not in sample:
            continue
        lw, w = sample["word_perplexity"]
        lb, b = sample["byte_perplexity"] if "byte_perplexity" in sample else sample["bits_per_byte"]
        keys.append(_doc_key(sample))
        ll.append(float(lw))
        words.append(float(w))
        nbytes.append(float(b))
    if not keys:
        raise ValueError(f"no per-document log-likelihoods for {task}; was it run with log_samples?")
    return RollingScores(keys, np.array(ll), np.array(words), np.array(nbytes))
