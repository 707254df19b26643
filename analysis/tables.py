"""Tables from tidy results: Table 1 (prefill FLOPs), KV-cache memory, SimScore crossing layers."""

from __future__ import annotations

import math

import pandas as pd

OPS = ["vocab", "kv_proj", "qo_proj", "mlp", "attention", "total"]


def crossing_layer(values, threshold: float = 0.5) -> int | None:
    """The smallest l from which the curve stays >= threshold (None if its last value is below)."""
    values = list(values)
    crossing = None
    for l in range(len(values) - 1, -1, -1):
        if values[l] >= threshold:
            crossing = l
        else:
            break
    return crossing


def simscore_crossings(df: pd.DataFrame, threshold: float = 0.5) -> pd.DataFrame:
    """Per (model, metric): the layer l from which SimScore stays >= threshold, its depth l/L and the SimScore at L/2."""
    rows = []
    for (model, metric), g in df.groupby(["model", "metric"], sort=False):
        g = g.sort_values("layer")
        L = int(g.num_layers.iloc[0])
        l = crossing_layer(g.simscore, threshold)
        half = g[g.layer == L // 2]
        rows.append({
            "model": model, "metric": metric, "num_layers": L, "crossing_layer": l,
            "crossing_depth": None if l is None else l / L,
            "skip_fraction_at_crossing": None if l is None else 1 - l / L,
            "simscore_at_half": float(half.simscore.iloc[0]) if len(half) else math.nan,
            "ci_low_at_half": float(half.ci_low.iloc[0]) if len(half) else math.nan,
            "ci_high_at_half": float(half.ci_high.iloc[0]) if len(half) else math.nan,
        })
    return pd.DataFrame(rows)


def table1(ours: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Our GFLOPs per prefill token by op and setting, with the paper's value beside each op where it has one."""
    cols = ["model", "setting", "num_hidden_layers", "num_key_value_layers", "key_value_group_size",
            "context_length", *OPS, "prefill_reduction"]
    out = ours[cols].copy()
    out["prefill_reduction"] = 100 * out["prefill_reduction"]
    keys = ["model", "num_key_value_layers", "key_value_group_size"]
    ref = paper[keys + OPS].rename(columns={op: f"paper_{op}" for op in OPS})
    return out.merge(ref, on=keys, how="left")


def kv_memory(ours: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """KV-cache bytes per token and reductions (%) with and without FP8, with the paper's where it has them."""
    cols = ["model", "num_hidden_layers", "num_key_value_layers", "key_value_group_size", "kv_cache_layers",
            "kv_cache_bytes_per_token", "kv_cache_reduction", "kv_cache_bytes_per_token_fp8", "kv_cache_reduction_fp8"]
    out = ours[cols].copy()
    ref = paper[["model", "num_key_value_layers", "key_value_group_size", "kv_cache_reduction", "kv_cache_reduction_fp8"]]
    out = out.merge(ref.rename(columns={"kv_cache_reduction": "paper_kv_cache_reduction",
                                        "kv_cache_reduction_fp8": "paper_kv_cache_reduction_fp8"}),
                    on=["model", "num_key_value_layers", "key_value_group_size"], how="left")
    for c in ["kv_cache_reduction", "kv_cache_reduction_fp8", "paper_kv_cache_reduction", "paper_kv_cache_reduction_fp8"]:
        out[c] = 100 * out[c]
    return out


def _fmt(value, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        if value == int(value) and abs(value) >= 1:
            return str(int(value))
        if value == 0:
            return "0"
        mag = math.floor(math.log10(abs(value)))
        return f"{value:.{max(0, digits - 1 - mag)}f}"
    return str(value)


def to_markdown(df: pd.DataFrame, digits: int = 3, caption: str = "") -> str:
    """A GitHub markdown table, floats to ``digits`` significant digits (no extra dependency)."""
    header = "| " + " | ".join(df.columns) + " |"
    rule = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else "---" for c in df.columns) + "|"
    lines = [header, rule]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v, digits) for v in row) + " |")
    text = "\n".join(lines) + "\n"
    return (caption.strip() + "\n\n" + text) if caption else text


def table1_markdown(t: pd.DataFrame) -> str:
    """Table 1 as the paper prints it (ours, and the paper's total where it has one)."""
    view = t[["model", "setting", "num_hidden_layers", "num_key_value_layers", "key_value_group_size", "context_length",
              *OPS, "prefill_reduction", "paper_total"]].rename(columns={
        "num_hidden_layers": "L", "num_key_value_layers": "l", "key_value_group_size": "g", "context_length": "S",
        "prefill_reduction": "reduction %", "paper_total": "paper total"})
    caption = ("GFLOPs per prefill token by operation (vocab = embedding + LM head as matmuls; attention over a causal "
               "prompt of S tokens). `paper total`: Table 1 of the paper (Llama-3.1-70B-Instruct).")
    return to_markdown(view, caption=caption)


def kv_memory_markdown(t: pd.DataFrame) -> str:
    view = t[["model", "num_hidden_layers", "num_key_value_layers", "key_value_group_size", "kv_cache_layers",
              "kv_cache_bytes_per_token", "kv_cache_reduction", "kv_cache_reduction_fp8", "paper_kv_cache_reduction",
              "paper_kv_cache_reduction_fp8"]].rename(columns={
        "num_hidden_layers": "L", "num_key_value_layers": "l", "key_value_group_size": "g",
        "kv_cache_layers": "cached layers", "kv_cache_bytes_per_token": "bytes/token (16-bit)",
        "kv_cache_reduction": "reduction %", "kv_cache_reduction_fp8": "reduction % (FP8)",
        "paper_kv_cache_reduction": "paper %", "paper_kv_cache_reduction_fp8": "paper % (FP8)"})
    caption = ("KV-cache memory per token with SwiftKV at l and g-way AcrossKV, relative to the base model with a "
               "16-bit cache; FP8 halves every cached value.")
    return to_markdown(view, digits=5, caption=caption)
