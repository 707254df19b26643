"""Distillation runs: training logs and summaries in, tidy tables and the held-out-KL curve out."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis.io import read_text, save_figure

LOG_FILE = "train_log.jsonl"
SUMMARY_FILE = "distill.json"


def read_train_log(run_dir: str | Path) -> pd.DataFrame:
    """One row per logged event (``event`` = train | eval) of a run directory's ``train_log.jsonl``."""
    lines = read_text(Path(run_dir) / LOG_FILE).splitlines()  # or a raw folder's compressed copy
    return pd.DataFrame([json.loads(x) for x in lines if x.strip()])


def heldout_curve(run_dir: str | Path) -> pd.DataFrame:
    """Held-out KL (and NLLs) against training tokens, sorted by step."""
    log = read_train_log(run_dir)
    return log[log["event"] == "eval"].sort_values("step").reset_index(drop=True)


def summarize_runs(run_dirs: list[str | Path]) -> pd.DataFrame:
    """One row per run: what it was, how fast it trained, and the held-out KL before and after."""
    rows = []
    for d in map(Path, run_dirs):
        s = json.loads((d / SUMMARY_FILE).read_text())
        st, init, final = s["settings"], s.get("heldout_initial", {}), s.get("heldout_final", {})
        rows.append({
            "model": s["model"],
            "variant": s.get("variant") or d.name,
            "num_key_value_layers": st["num_key_value_layers"],
            "key_value_group_size": st["key_value_group_size"],
            "kv_heads": st["key_value_heads"],
            "loss": st["loss"] if st["train"] else "none",
            "scope": st["scope"],
            "train_tokens": s["train_tokens"],
            "steps": s["steps"],
            "train_tok_per_s": s["train_tok_per_s"],
            "heldout_kl_initial": init.get("heldout_kl"),
            "heldout_kl_final": final.get("heldout_kl"),
            "heldout_student_nll_final": final.get("heldout_student_nll"),
            "heldout_teacher_nll": final.get("heldout_teacher_nll"),
            "heldout_tokens": final.get("heldout_tokens"),
            "trainable_parameters": s["trainable_parameters"],
            "kv_cache_bytes_per_token_fp16": s["kv_cache_bytes_per_token_fp16"],
        })
    table = pd.DataFrame(rows)
    if len(table):
        table["kv_heads"] = table["kv_heads"].astype("Int64")  # empty for unchanged heads, not a float
    return table


def lr_sweep_table(run_dirs: list[str | Path], configured: dict[str, float]) -> pd.DataFrame:
    """The learning-rate sweep: one row per run (model, variant, scope, lr, held-out KL before and after), ``chosen``
    = the lowest final held-out KL of its (model, variant) — the rule, fixed before the sweep ran — ``at_edge`` = the
    chosen lr is the smallest or largest tried (the optimum may lie outside the grid), ``configured`` = the lr the
    profile trains that scope with (config distill.lr_by_scope, else overrides.lr)."""
    table = summarize_runs(run_dirs)
    table.insert(4, "lr", [json.loads((Path(d) / SUMMARY_FILE).read_text())["settings"]["lr"] for d in run_dirs])
    table = table.sort_values(["model", "variant", "lr"], ignore_index=True)
    best = table.groupby(["model", "variant"])["heldout_kl_final"].transform("min")
    table["chosen"] = table["heldout_kl_final"] == best
    edges = table.groupby(["model", "variant"])["lr"].transform(lambda x: (x == x.min()) | (x == x.max()))
    table["at_edge"] = table["chosen"] & edges
    table["configured"] = [configured.get(scope) == lr for scope, lr in zip(table["scope"], table["lr"])]
    keep = ["model", "variant", "scope", "lr", "train_tokens", "heldout_kl_initial", "heldout_kl_final",
            "heldout_student_nll_final", "chosen", "at_edge", "configured"]
    return table[keep]


def lr_sweep_sentence(table: pd.DataFrame) -> str:
    """The sweep in one sentence per scope, for the README (generated from reports/lr_sweep.csv, never typed)."""
    def lr(x):
        return f"{x:.0e}".replace("e-0", "e-")

    parts = []
    for (variant, scope), g in table.groupby(["variant", "scope"], sort=False):
        best = g[g.chosen].iloc[0]
        kls = ", ".join(f"{lr(r.lr)}: {r.heldout_kl_final:.3f}" for r in g.itertuples())
        edge = ("; the largest lr tried, so the best may lie above it" if best.lr == g.lr.max() else
                "; the smallest lr tried, so the best may lie below it" if best.lr == g.lr.min() else "")
        parts.append(f"{scope} training ({variant}) takes lr {lr(best.lr)} (final held-out KL by lr: {kls}{edge})")
    return "; ".join(parts) + "."


def plot_heldout_curve(curve: pd.DataFrame, table: pd.DataFrame | None, table_tokens: int, label: str, path):
    """Held-out KL vs training tokens for the long run, with the table-budget run and its budget marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=150)
    ax.plot(curve["tokens"], curve["heldout_kl"], "o-", color="C0", ms=4, label=f"{label}: longer run")
    if table is not None and len(table):
        ax.plot(table["tokens"], table["heldout_kl"], "s--", color="C1", ms=4, label=f"{label}: table budget")
    ax.axvline(table_tokens, color="0.5", ls=":", lw=1)
    ax.annotate("table budget", (table_tokens, ax.get_ylim()[1]), textcoords="offset points", xytext=(3, -12),
                fontsize=8, color="0.3")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("held-out KL(teacher || student), nats/token")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=None, bbox_inches=None)
    plt.close(fig)
