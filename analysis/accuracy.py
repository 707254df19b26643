"""The accuracy tables (paper Tables 2, 4a, 4b, B.1, B.2) from evaluation results, with bootstrap intervals.

Each row is one (model, variant, KV cache) evaluation. Columns, each with ``_lo`` / ``_hi`` (95% bootstrap over
examples, see ``analysis.stats``):

- one score per reported task (percent) and their unweighted ``average``;
- ``delta_base``: average minus the base model's, paired on the same examples (``_sig``: the interval excludes 0);
- ``delta_ref``: the same against the table's reference row (Table 2: SwiftKV 50%, for every other student — the
  rows the cliff and AcrossKV claims compare with it; Table 4a/4b: the KL-distilled partial 50% row; Table B.1: the
  same variant with the native cache; Table B.2: the AcrossKV row);
- ``delta_base_mdd``: the minimum detectable difference of ``delta_base`` (two-sided 5% test, 80% power), from the
  interval's half-width read as 1.96 standard errors (normal approximation): what this many examples can resolve;
- ``bpb``: held-out ShareGPT bits per byte (the rolling log-likelihood of each document over its UTF-8 bytes, in
  bits; tokenizer-independent), ``bpb_delta_base`` its paired difference to the base model; ``kl``, ``top1``,
  ``greedy``: fidelity to the teacher (``swiftkv.measure.fidelity``; ``fidelity_sequences``, ``fidelity_positions`` and
  ``greedy_prompts`` give its sizes);
- ``kv_reduction``: KV-cache memory saved against the base model with a bf16 cache (percent);
- ``paper_*``: the paper's average (and its difference to the paper's base) for the corresponding row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import paper
from analysis.io import read_json, rolling_scores, task_scores
from analysis.stats import (
    BootstrapSettings,
    Interval,
    macro_mean_ci,
    mean_ci,
    paired_difference_ci,
    paired_ratio_difference_ci,
    ratio_ci,
)
from swiftkv.data.heldout import PPL_TASK  # the held-out perplexity task, as its writer names it

MDD_FACTOR = (1.959964 + 0.841621) / 1.959964  # (z_0.975 + z_0.80) / z_0.975: MDD at 80% power from a 95% half-width
TABLES = ("table2", "table4a", "table4b", "tableB1", "tableB2")
CAPTIONS = {
    "table2": "Table 2: accuracy of SwiftKV variants (skipped fraction, AcrossKV) against the base model",
    "table4a": "Table 4a: the effect of distillation (no training, LM loss, KL, KL + hidden-state MSE)",
    "table4b": "Table 4b: partial (W_QKV of layers >= l) vs full training of the later layers",
    "tableB1": "Table B.1: FP8 per-token KV-cache quantisation after training, with and without AcrossKV",
    "tableB2": "Table B.2: MQA vs AcrossKV at an equal KV-cache budget",
}


@dataclass
class Row:
    """One evaluated row: what it is (a ``config/variants.tsv`` row) and where its results are."""

    model: str
    variant: str
    kv_cache: str
    spec: dict
    lm_eval: str | Path
    fidelity: str | Path | None = None
    heldout: str | Path | None = None  # the bits-per-byte task's lm-eval result (heldout.json); None: in lm_eval
    results: dict = field(default_factory=dict, repr=False)
    fid: dict | None = field(default=None, repr=False)
    ppl: dict = field(default_factory=dict, repr=False)

    @property
    def key(self) -> tuple[str, str, str]:
        return self.model, self.variant, self.kv_cache

    def load(self) -> "Row":
        self.results = read_json(self.lm_eval)
        self.fid = read_json(self.fidelity) if self.fidelity else None
        self.ppl = read_json(self.heldout) if self.heldout else self.results
        return self


def _group_size(row: Row) -> int:
    """g of a row's sheet entry (1 where the sheet leaves it empty)."""
    return int(row.spec.get("key_value_group_size") or 1)


def _is_kl_partial(r: Row) -> bool:
    """The paper's recipe: KL-distilled, only Q/K/V trained, one K/V per layer, native KV cache."""
    return (r.spec.get("loss") == "kl" and r.spec.get("scope") == "partial" and _group_size(r) == 1
            and not r.spec.get("kv_heads") and r.kv_cache == "native")


def _is_swiftkv_50(r: Row) -> bool:
    return _is_kl_partial(r) and float(r.spec.get("skip_fraction") or 0) == 0.5


def reference_of(table: str, row: Row, rows: list[Row]) -> Row | None:
    """The row a table compares ``row`` with (besides the base model)."""
    same = [r for r in rows if r.model == row.model]
    if table == "table2":
        found = [] if row.variant == "base" else [r for r in same if _is_swiftkv_50(r)]
    elif table == "tableB1":
        found = [r for r in same if r.variant == row.variant and r.kv_cache == "native"]
    elif table in ("table4a", "table4b"):
        found = [r for r in same if _is_kl_partial(r)]
    elif table == "tableB2":
        found = [r for r in same if _group_size(r) != 1 and r.kv_cache == "native"]
    else:
        found = []
    found = [r for r in found if r is not row]
    return found[0] if found else None


def _scores(row: Row, tasks: list[dict]) -> dict[str, tuple[list[str], np.ndarray]]:
    out = {}
    for t in tasks:
        s = task_scores(row.results, t["name"], t["metric"])
        out[t["name"]] = (s.keys, s)
    return out


def _put(record: dict, name: str, ci: Interval, scale: float = 1.0) -> None:
    ci = ci.scaled(scale)
    record[name], record[f"{name}_lo"], record[f"{name}_hi"] = ci.value, ci.low, ci.high


def _diff(record: dict, name: str, row: Row, other: Row, tasks: list[dict], settings: BootstrapSettings) -> None:
    a, b = [], []
    for t in tasks:
        sa = task_scores(row.results, t["name"], t["metric"])
        sb = task_scores(other.results, t["name"], t["metric"])
        keys = [k for k in sb.keys if k in set(sa.keys)]
        a.append(sa.aligned(keys))
        b.append(sb.aligned(keys))
        ci = paired_difference_ci([a[-1]], [b[-1]], settings)
        record[f"{t['label']}_{name}_sig"] = ci.excludes(0)
    _put(record, name, paired_difference_ci(a, b, settings), 100)
    record[f"{name}_sig"] = record[f"{name}_lo"] > 0 or record[f"{name}_hi"] < 0
    record[f"{name}_row"] = f"{other.variant} ({other.kv_cache} KV)"


def _bits_per_byte(record: dict, row: Row, base: Row | None, settings: BootstrapSettings) -> None:
    if PPL_TASK not in row.ppl.get("samples", {}):
        return
    s = rolling_scores(row.ppl, PPL_TASK)
    to_bits = np.log2(np.e)
    _put(record, "bpb", ratio_ci(-s.loglikelihood * to_bits, s.bytes, settings))
    if base is not None and base is not row and PPL_TASK in base.ppl.get("samples", {}):
        b = rolling_scores(base.ppl, PPL_TASK)
        index = dict(zip(b.keys, range(len(b.keys))))
        order = [index[k] for k in s.keys]
        ci = paired_ratio_difference_ci(-s.loglikelihood * to_bits, s.bytes, -b.loglikelihood[order] * to_bits,
                                        b.bytes[order], settings)
        _put(record, "bpb_delta_base", ci)
        record["bpb_delta_base_sig"] = ci.excludes(0)
    record["bpb_documents"] = len(s.keys)


def minimum_detectable_difference(low: float, high: float) -> float:
    """The difference a two-sided 5% test detects with 80% power, given a 95% interval [low, high] of it."""
    return MDD_FACTOR * (high - low) / 2


def teacher_forced(fidelity: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per teacher-forced sequence of a fidelity result: KL sums, top-1 agreements and token counts."""
    tf = fidelity["teacher_forced"]
    return (np.array([r["kl_sum"] for r in tf], dtype=float), np.array([r["top1_agree"] for r in tf], dtype=float),
            np.array([r["tokens"] for r in tf], dtype=float))


def _fidelity(record: dict, row: Row, settings: BootstrapSettings) -> None:
    if not row.fid:
        return
    kl, top1, tokens = teacher_forced(row.fid)
    _put(record, "kl", ratio_ci(kl, tokens, settings))
    _put(record, "top1", ratio_ci(top1, tokens, settings), 100)
    _put(record, "greedy", mean_ci(np.array([g["agreement"] for g in row.fid["greedy_rows"]]), settings), 100)
    record["fidelity_sequences"] = len(tokens)
    record["fidelity_positions"] = int(tokens.sum())
    record["greedy_prompts"] = len(row.fid["greedy_rows"])


def build_table(table: str, rows: list[Row], tasks_by_model: dict[str, list[dict]],
                settings: BootstrapSettings = BootstrapSettings(), paper_dir: str | Path | None = None) -> pd.DataFrame:
    """One DataFrame row per evaluated row (in the given order)."""
    for r in rows:
        if not r.results:
            r.load()
    records = []
    for row in rows:
        tasks = [dict(t, label=task_label(t["name"])) for t in tasks_by_model[row.model]]
        base = next((r for r in rows if r.model == row.model and r.variant == "base" and r.kv_cache == "native"), None)
        rec = {"model": row.model, "variant": row.variant, "kv_cache": row.kv_cache,
               "label": row.spec.get("label", row.variant) + (" + FP8 KV" if row.kv_cache == "fp8" else ""),
               "skip_fraction": float(row.spec.get("skip_fraction") or 0)}
        per_task = []
        for t in tasks:
            s = task_scores(row.results, t["name"], t["metric"])
            per_task.append(s.values)
            _put(rec, t["label"], mean_ci(s.values, settings), 100)
            rec[f"{t['label']}_n"] = len(s.values)
        _put(rec, "average", macro_mean_ci(per_task, settings), 100)
        if base is not None and base is not row:
            _diff(rec, "delta_base", row, base, tasks, settings)
            rec["delta_base_mdd"] = minimum_detectable_difference(rec["delta_base_lo"], rec["delta_base_hi"])
        ref = reference_of(table, row, rows)
        if ref is not None:
            _diff(rec, "delta_ref", row, ref, tasks, settings)
        _bits_per_byte(rec, row, base, settings)
        _fidelity(rec, row, settings)
        kv = row.results.get("swiftkv", {}).get("kv_memory")
        if kv:
            rec["kv_reduction"] = 100 * kv["reduction"]
            rec["kv_reduction_with_scales"] = 100 * kv["reduction_with_scales"]
        rec.update(paper.paper_columns(table, row.model, row.variant, row.kv_cache, paper_dir))
        records.append(rec)
    return pd.DataFrame.from_records(records)


def task_label(name: str) -> str:
    """Short column name of an lm-eval task (``bb_physics_report`` -> ``physics``)."""
    label = name[3:] if name.startswith("bb_") else name
    for suffix in ("_report", "_selection"):
        if label.endswith(suffix):
            label = label[: -len(suffix)]
    return label


def _fmt(value, lo=None, hi=None, digits: int = 1, star: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = f"{value:.{digits}f}"
    if lo is not None and hi is not None and not (isinstance(lo, float) and math.isnan(lo)):
        text += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    return text + (" *" if star else "")


def _value(r: dict, key: str):
    """A table record's value, None where it is absent or NaN."""
    v = r.get(key)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _cell(r: dict, key: str, digits: int = 1, star: str | None = None) -> str:
    """A value with its interval (``<key>_lo``, ``<key>_hi``), starred where the record's ``star`` flag is set."""
    return _fmt(_value(r, key), _value(r, f"{key}_lo"), _value(r, f"{key}_hi"), digits,
                star=bool(star and _value(r, star)))


def to_markdown(df: pd.DataFrame, tasks: list[str], caption: str, task_notes: list[str] | None = None) -> str:
    """Scores with 95% intervals; * marks a difference against the base model (per task: paired on the same
    examples) whose interval excludes 0."""
    cols = ["row"] + tasks + ["average", "Δ vs base", "Δ vs ref", "ShareGPT bits/byte", "KL", "top-1 %", "greedy %",
                              "KV saved %", "paper avg", "paper Δ"]
    lines = [f"**{caption}**", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        r = r.to_dict()
        cells = [f"{r['model']}: {r['label']}"]
        for t in tasks:
            cells.append(_cell(r, t, star=f"{t}_delta_base_sig"))
        cells.append(_cell(r, "average"))
        cells.append(_cell(r, "delta_base", star="delta_base_sig"))
        ref = _cell(r, "delta_ref", star="delta_ref_sig")
        cells.append(f"{ref} (vs {r['delta_ref_row']})" if ref else "")
        cells.append(_cell(r, "bpb", 3, star="bpb_delta_base_sig"))
        cells.append(_cell(r, "kl", 4))
        cells.append(_cell(r, "top1"))
        cells.append(_cell(r, "greedy"))
        cells.append(_fmt(_value(r, "kv_reduction")))
        cells.append(_fmt(_value(r, "paper_average"), digits=2))
        pd_ = _value(r, "paper_delta_base")
        cells.append(_fmt(pd_, digits=2) + (f" ({r['paper_row']})" if _value(r, "paper_row") else ""))
        lines.append("| " + " | ".join(cells) + " |")
    if "skip_fraction" in df and (df.skip_fraction > 0).any():
        lines += ["", "One training run per distilled row (the profile's seed): the intervals are over examples only. "
                  "The seeds study (reports/seeds.csv, and the claims) pools several seeds per row where it has them; "
                  "the seed means can differ from these single runs by more than their intervals suggest."]
    lines += ["", "Scores in percent with 95% bootstrap intervals over examples; * = the paired difference against "
              "the base model (same examples) has a 95% interval that excludes 0 (Δ vs ref: against the row named). "
              "Paper columns: the paper's average for the corresponding row (its own tasks and models; see "
              "analysis/paper/) and its difference to the paper's base model."]
    mdd = df["delta_base_mdd"].dropna() if "delta_base_mdd" in df else pd.Series(dtype=float)
    if len(mdd):
        n = sum(df.iloc[0].get(f"{t}_n", 0) for t in tasks)
        spread = (f"{mdd.min():.1f} points" if f"{mdd.min():.1f}" == f"{mdd.max():.1f}"
                  else f"{mdd.min():.1f}–{mdd.max():.1f} points (median {mdd.median():.1f})")
        lines += ["", f"Minimum detectable difference of Δ vs base (two-sided 5% test, 80% power; from each row's "
                  f"interval, normal approximation) with {int(n)} examples per row: {spread}. A smaller true "
                  "difference is likely to read as no difference."]
    if "bpb_documents" in df and df["bpb_documents"].notna().any():
        lines += ["", f"ShareGPT bits/byte: held-out ShareGPT conversations ({int(df['bpb_documents'].max())} "
                  "documents), the rolling log-likelihood per UTF-8 byte in bits (lower is better; * = paired "
                  "difference to the base model excludes 0)."]
    if "fidelity_sequences" in df and df["fidelity_sequences"].notna().any():
        lines += ["", f"Fidelity to the base model (the teacher): KL (nats per token) and top-1 agreement on "
                  f"{int(df['fidelity_sequences'].max())} held-out ShareGPT sequences "
                  f"({int(df['fidelity_positions'].max()):,} positions), teacher-forced; greedy: agreement of "
                  f"greedy continuations on {int(df['greedy_prompts'].max())} held-out prompts."]
    if task_notes:
        lines += ["", "Tasks: " + "; ".join(task_notes) + "."]
    return "\n".join(lines) + "\n"


def summary_markdown(df: pd.DataFrame, seeds: pd.DataFrame | None = None) -> str:
    """The short form of an accuracy table (one row per table row: average, Δ vs base, KL to the teacher, each with
    its 95% interval), generated from the table's CSV so that no page carries typed numbers. ``seeds``
    (reports/seeds.csv): beside each single run, the seeds study's mean Δ vs base where it has the row."""
    pooled = {} if seeds is None else {(r["model"], r["variant"]): r for r in
                                       seeds[seeds.seed.astype(str) == "all"].to_dict("records")}
    cols = ["row", "average accuracy (%)", "Δ vs base (paired), one run", "KL to the teacher (nats/token)"]
    cols += ["Δ vs base, mean over seeds (seeds)"] if pooled else []
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.to_dict("records"):
        cells = [f"{r['model']}: {r['label']}", _cell(r, "average"), _cell(r, "delta_base"),
                 _cell(r, "kl", 2) if r.get("variant") != "base" else ""]
        if pooled:
            p = pooled.get((r["model"], r["variant"]))
            if p is None:
                cells.append("")
            else:
                n = "untrained" if p["seeds"] == "untrained" else f"{int(p['n_seeds'])} seeds"
                cells.append(f"{_cell(p, 'delta_base')} ({n})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table_from_raw(table: str, raw: str | Path, rows: list[dict], settings: BootstrapSettings
                   ) -> tuple[pd.DataFrame, str]:
    """A table (DataFrame, markdown) from its committed raw folder (``reports/raw/<table>``, ``analysis.raw``).

    ``rows``: one dict per table row (``model``, ``variant``, ``kv_cache``, ``spec``: its variants-sheet row), in
    table order; their evaluations are read where ``results/eval/<model>/<variant>/<kv_cache>/`` was collected."""
    from analysis.io import read_json
    from analysis.raw import eval_path, raw_path

    def at(model: str, *parts: str) -> Path:
        return raw_path(raw, eval_path(model, *parts))

    table_rows = [Row(r["model"], r["variant"], r["kv_cache"], r["spec"],
                      at(r["model"], r["variant"], r["kv_cache"], "lm_eval.json"),
                      at(r["model"], r["variant"], r["kv_cache"], "fidelity.json"),
                      at(r["model"], r["variant"], r["kv_cache"], "heldout.json")) for r in rows]
    tasks = {m: read_json(at(m, "tasks.json"))["tasks"] for m in dict.fromkeys(r["model"] for r in rows)}
    df = build_table(table, table_rows, tasks, settings)
    labels = list(dict.fromkeys(task_label(t["name"]) for ts in tasks.values() for t in ts))
    notes = [f"{model}: {task_label(t['name'])} ({t['metric'].split(',')[0]}, n={t.get('n', '?')}"
             + (f", chance {100 * t['chance']:.1f}%" if "chance" in t else "")
             + (f", {t['selected_by']}" if t.get("selected_by", "interval above chance") != "interval above chance"
                else "")
             + ")" for model, ts in tasks.items() for t in ts]
    return df, to_markdown(df, labels, CAPTIONS[table], notes)
