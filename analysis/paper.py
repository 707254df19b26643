"""The paper's own numbers (``analysis/paper/*.csv``, transcribed from the paper summary) beside our rows.

Rows correspond by variant: for a model the paper reports (the paper profile) the same model's row; otherwise
(the embedded models) the Llama-3.1-8B-Instruct row that ``row_map.csv`` names for the variant — the same skipped
fraction, or the nearest KV-cache budget where the AcrossKV group sizes differ.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pandas as pd

PAPER_DIR = Path(__file__).parent / "paper"


@lru_cache(maxsize=None)
def _read(path: str) -> pd.DataFrame:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    if "kv_cache" not in df.columns:
        df["kv_cache"] = "native"
    return df


def paper_table(name: str, paper_dir: str | Path | None = None, *, text: bool = False) -> pd.DataFrame | None:
    """One of the paper's published tables or figures kept as data (``analysis/paper/<name>.csv``; ``name`` may end
    in ``.csv``), or None where it is absent. ``text``: every cell as the paper's text (empty for none), for quoting
    and row matching; otherwise pandas' types."""
    path = Path(paper_dir or PAPER_DIR) / (name if name.endswith(".csv") else f"{name}.csv")
    if not path.is_file():
        return None
    return _read(str(path)) if text else pd.read_csv(path)


def paper_row(table: str, model: str, variant: str, kv_cache: str = "native",
              paper_dir: str | Path | None = None) -> dict | None:
    df = paper_table(table, paper_dir, text=True)
    if df is None:
        return None
    if model not in set(df["model"]):
        rmap = _read(str(Path(paper_dir or PAPER_DIR) / "row_map.csv"))
        hit = rmap[rmap["variant"] == variant]
        if hit.empty:
            return None
        model, variant = hit.iloc[0]["paper_model"], hit.iloc[0]["paper_variant"]
    rows = df[(df["model"] == model) & (df["variant"] == variant) & (df["kv_cache"] == kv_cache)]
    return rows.iloc[0].to_dict() if not rows.empty else None


def _base_average(table: str, model: str, paper_dir) -> float | None:
    for t in (table, "table2"):
        row = paper_row(t, model, "base", "native", paper_dir)
        if row and row.get("average"):
            return float(row["average"])
    return None


def paper_columns(table: str, model: str, variant: str, kv_cache: str = "native",
                  paper_dir: str | Path | None = None) -> dict:
    """``paper_row`` (which paper row), ``paper_average``, ``paper_delta_base``, ``paper_kv_reduction``."""
    row = paper_row(table, model, variant, kv_cache, paper_dir)
    if row is None:
        return {}
    out = {"paper_row": f"{row['model']} {row['variant']}" + (" fp8" if kv_cache == "fp8" else "")}
    if row.get("average"):
        out["paper_average"] = float(row["average"])
        base = _base_average(table, row["model"], paper_dir)
        if base is not None:
            out["paper_delta_base"] = float(row["average"]) - base
    if row.get("kv_reduction"):
        out["paper_kv_reduction"] = float(row["kv_reduction"])
    return out
