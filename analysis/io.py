"""Read results (CSV / JSON written by the swiftkv CLI, lm-eval JSON with per-sample logs) into DataFrames or
per-example arrays, and write tables atomically."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from swiftkv.io import atomic_path

def read_text(path: str | os.PathLike) -> str:
    """A text file, or its gzip-compressed copy ``<path>.gz`` where only that exists (a raw folder stores large
    results compressed, ``analysis.raw``)."""
    path = Path(path)
    if not path.exists() and Path(f"{path}.gz").is_file():
        import gzip

        return gzip.decompress(Path(f"{path}.gz").read_bytes()).decode()
    return path.read_text()


def read_simscore(paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """SimScore CSVs (one per model: model, metric, layer, num_layers, depth, simscore, ci_low, ci_high)."""
    from io import StringIO

    return pd.concat([pd.read_csv(StringIO(read_text(p))) for p in paths], ignore_index=True)


def read_metadata(paths: Iterable[str | os.PathLike]) -> dict[str, dict]:
    """The JSON sidecars of SimScore runs, by model."""
    out = {}
    for p in paths:
        meta = read_json(p)
        out[meta["model"]] = meta
    return out


def read_prefill_time(paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """Prefill benchmark JSONs (``swiftkv bench prefill``) as one row per (model, variant, length)."""
    frames = []
    for p in paths:
        data = read_json(p)
        df = pd.DataFrame(data["results"]).drop(columns=["times_s"], errors="ignore")
        df.insert(0, "model", data.get("model", Path(p).stem))
        df["num_hidden_layers"] = data["num_hidden_layers"]
        df["dtype"] = data.get("dtype")
        df["torch_threads"] = data.get("hardware", {}).get("torch_threads")
        df["cpu"] = data.get("hardware", {}).get("cpu")
        df["repeats"] = data.get("settings", {}).get("repeats")
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def read_flops(paths: Iterable[str | os.PathLike], key: str) -> pd.DataFrame:
    """The ``key`` records ('table1' or 'kv_memory') of per-model FLOPs JSONs, with the model name."""
    frames = []
    for p in paths:
        data = read_json(p)
        df = pd.DataFrame(data[key])
        df.insert(0, "model", data["model"])
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def write_csv(df: pd.DataFrame, path: str | os.PathLike, **kwargs) -> None:
    """``df.to_csv`` through the package's one atomic writer (``swiftkv.io``)."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False, **kwargs)


def save_figure(fig, path: str | os.PathLike, dpi: int | None = 150, **kwargs) -> None:
    """Save a matplotlib figure atomically (same format as ``path``'s suffix); ``kwargs`` go to ``savefig``
    (default ``bbox_inches="tight"``)."""
    kwargs.setdefault("bbox_inches", "tight")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=Path(path).suffix.lstrip(".") or "png", **kwargs)


def read_json(path: str | Path) -> dict:
    """A JSON file, or its gzip-compressed copy ``<path>.gz`` where only that exists (``read_text``)."""
    return json.loads(read_text(path))


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


def task_samples(result: dict, task: str, filt: str = "none") -> list[tuple[str, dict]]:
    """(example id ``<subtask>/<doc id>``, sample) of every logged sample of ``task`` (group tasks: all their
    subtasks') under filter ``filt``, in logged order."""
    return [(f"{sub}/{_doc_key(sample)}", sample) for sub in _subtasks(result, task)
            for sample in result.get("samples", {}).get(sub, []) if sample.get("filter", "none") == filt]


def task_scores(result: dict, task: str, metric_key: str) -> TaskScores:
    """Per-example values of ``metric_key`` (``"metric,filter"``) for ``task`` from an lm-eval result with samples."""
    metric, filt = split_metric(metric_key)
    keys, values = [], []
    for key, sample in task_samples(result, task, filt):
        if metric in sample:
            keys.append(key)
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
