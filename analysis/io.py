"""Read results (CSV / JSON written by the swiftkv CLI) into tidy DataFrames, and write tables atomically."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterable

import pandas as pd

PAPER_DIR = Path(__file__).parent / "paper"


def paper_table(name: str) -> pd.DataFrame:
    """One of the paper's published tables kept as data under ``analysis/paper/`` (e.g. ``table1``)."""
    return pd.read_csv(PAPER_DIR / f"{name}.csv")


def read_simscore(paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """SimScore CSVs (one per model: model, metric, layer, num_layers, depth, simscore, ci_low, ci_high)."""
    return pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)


def read_metadata(paths: Iterable[str | os.PathLike]) -> dict[str, dict]:
    """The JSON sidecars of SimScore runs, by model."""
    out = {}
    for p in paths:
        meta = json.loads(Path(p).read_text())
        out[meta["model"]] = meta
    return out


def read_prefill_time(paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """Prefill benchmark JSONs (``swiftkv bench prefill``) as one row per (model, variant, length)."""
    frames = []
    for p in paths:
        data = json.loads(Path(p).read_text())
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
        data = json.loads(Path(p).read_text())
        df = pd.DataFrame(data[key])
        df.insert(0, "model", data["model"])
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def _atomic(path: str | os.PathLike):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    return path, Path(tmp)


def write_csv(df: pd.DataFrame, path: str | os.PathLike, **kwargs) -> None:
    path, tmp = _atomic(path)
    try:
        df.to_csv(tmp, index=False, **kwargs)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(text: str, path: str | os.PathLike) -> None:
    path, tmp = _atomic(path)
    try:
        tmp.write_text(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_figure(fig, path: str | os.PathLike, dpi: int = 150) -> None:
    """Save a matplotlib figure atomically (same format as ``path``'s suffix)."""
    path, tmp = _atomic(path)
    try:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format=path.suffix.lstrip(".") or "png")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
