"""A variants sheet (the pipeline's is ``config/variants.tsv``, which the command line reads by default): one row per
(model, SwiftKV configuration), explicit l and g.

Columns: model, variant, num_key_value_layers, key_value_group_size, kv_heads (MQA; empty = unchanged), loss
(kl|lm|kl+hidden|none), scope (partial|full|none), train (yes|no), skip_fraction, label, tables.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from swiftkv.errors import SwiftKVError

COLUMNS = ("model", "variant", "num_key_value_layers", "key_value_group_size", "kv_heads", "loss", "scope", "train",
           "skip_fraction", "label", "tables")

def read_variants(path: str | os.PathLike) -> list[dict[str, str]]:
    path = Path(path)
    if not path.is_file():
        raise SwiftKVError(f"variants sheet {path} not found; pass --variants FILE")
    with open(path, newline="") as f:
        reader = csv.DictReader(f, delimiter="\t")
        rows = list(reader)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or []) and c != "kv_heads"]
    if missing:
        raise SwiftKVError(f"variants sheet {path} has no column {', '.join(missing)}; it needs the tab-separated "
                           f"columns {', '.join(COLUMNS)} (kv_heads may be left out)")
    return rows


def variant_row(model: str, variant: str, path: str | os.PathLike) -> dict[str, str]:
    rows = read_variants(path)
    for row in rows:
        if row["model"] == model and row["variant"] == variant:
            return row
    known = sorted({r["variant"] for r in rows if r["model"] == model})
    if not known:
        raise SwiftKVError(f"model {model!r} has no rows in {path}; pass --model-id with its sheet id, or -l/-g")
    raise SwiftKVError(f"variant {variant!r} of {model} is not in {path}; known: {', '.join(known)}")


def distill_options(row: dict[str, str]) -> dict:
    """The distillation options a sheet row fixes (names of ``DistillSettings`` fields)."""
    if row["variant"] == "base" or (row["train"] == "no" and row["loss"] == "none" and row["scope"] == "none"):
        raise SwiftKVError(f"variant {row['variant']!r} is the base model: there is nothing to distil")
    options = {
        "num_key_value_layers": int(row["num_key_value_layers"]),
        "key_value_group_size": int(row["key_value_group_size"] or 1),
        "key_value_heads": int(row["kv_heads"]) if row.get("kv_heads") else None,
        "train": row["train"] == "yes",
    }
    if row["loss"] != "none":
        options["loss"] = row["loss"]
    if row["scope"] != "none":
        options["scope"] = row["scope"]
    return options
