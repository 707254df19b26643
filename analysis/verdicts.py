"""The page's verdict per claim of the paper, from a run's artifacts (the HTML that shows them: analysis.report).

``claims(...)`` turns the run's artifacts into one verdict per claim of the paper. A verdict is one of:

- ``holds`` / ``does not hold``: the 95% interval (or, for deterministic quantities, the exact value) decides;
- ``cannot tell``: the interval includes both outcomes at this sample size;
- ``not measured here``: the artifact is absent from this profile (e.g. vLLM on GPUs, the paper's models).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from analysis.paper import paper_row, paper_table

HOLDS, FAILS, UNCLEAR, ABSENT = "holds", "does not hold", "cannot tell", "not measured here"


@dataclass
class Claim:
    claim: str
    paper: str
    measured: str
    verdict: str
    evidence: str


def _num(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value


def _ci(row, name: str, digits: int = 1, unit: str = "") -> str:
    v, lo, hi = _num(row.get(name)), _num(row.get(f"{name}_lo")), _num(row.get(f"{name}_hi"))
    if math.isnan(v):
        return "n/a"
    text = f"{v:+.{digits}f}{unit}" if name.startswith("delta") else f"{v:.{digits}f}{unit}"
    return text + (f" [{lo:.{digits}f}, {hi:.{digits}f}]" if not math.isnan(lo) else "")


def _sign(row, name: str) -> int:
    """+1 / -1 when the 95% interval of ``name`` lies above / below 0, else 0 (NaN: 0)."""
    lo, hi = _num(row.get(f"{name}_lo")), _num(row.get(f"{name}_hi"))
    return 1 if lo > 0 else -1 if hi < 0 else 0


def _read(path) -> pd.DataFrame | None:
    return pd.read_csv(path) if path and Path(path).is_file() else None


PAPER_MODEL = "llama-3.1-8b-instruct"  # the model of the paper's ablation tables (4a, 4b, B.1, B.2)


def _paper_average(table: str, variant: str, kv_cache: str = "native", model: str = PAPER_MODEL) -> float:
    """The paper's average for one row, read from ``analysis/paper/{table}.csv`` (never typed into a claim); NaN if
    the paper has no such row."""
    row = paper_row(table, model, variant, kv_cache)
    return float(row["average"]) if row and row.get("average") else math.nan


def _paper_avg(table: str, variant: str, kv_cache: str = "native") -> str:
    value = _paper_average(table, variant, kv_cache)
    return "n/a" if math.isnan(value) else f"{value:.2f}"


def _absent(claim: str, paper: str, evidence: str) -> Claim:
    return Claim(claim, paper, "—", ABSENT, evidence)


# -- deterministic claims ------------------------------------------------------------------------------------------


def claim_table1(path) -> Claim:
    name = "Prefill FLOPs per token fall as (L-l)/L of the layer work (Table 1)"
    ref = paper_table("table1", text=True)
    paper = (f"{ref['model'].iloc[0]}: " + " → ".join(ref["total"]) + " GFLOPs ("
             + ", ".join(ref["setting"]) + ")")
    t = _read(path)
    if t is None:
        return _absent(name, paper, "reports/table1.csv")
    t = t[t["paper_total"].notna()]
    if t.empty:
        return Claim(name, paper, "no row of the paper's model in this profile", ABSENT, "reports/table1.csv")
    ours = " → ".join(f"{v:.0f}" for v in t["total"])
    err = (t["total"] - t["paper_total"]).abs().max()
    return Claim(name, paper, f"{t['model'].iloc[0]}: {ours} GFLOPs (largest difference {err:.2f})",
                 HOLDS if err < 1.0 else FAILS, "reports/table1.csv")


def claim_kv_memory(path) -> Claim:
    name = "AcrossKV shrinks the KV cache (Llama-3.1-8B at 50%: 2/4/8/16-way)"
    ref = paper_table("kv_memory", text=True)
    fp8_ref = ref[ref["kv_cache_reduction_fp8"] != ""]
    paper = (" / ".join(f"{100 * float(v):g}" for v in ref["kv_cache_reduction"]) + " % saved; with FP8 "
             + ", ".join(f"{100 * float(r['kv_cache_reduction_fp8']):g} % ({r['key_value_group_size']}-way)"
                         for _, r in fp8_ref.iterrows()))
    t = _read(path)
    if t is None:
        return _absent(name, paper, "reports/table_kv_memory.csv")
    t = t[t["paper_kv_cache_reduction"].notna()]
    if t.empty:
        return Claim(name, paper, "no row of the paper's model in this profile", ABSENT, "reports/table_kv_memory.csv")
    ours = " / ".join(f"{v:g}" for v in t["kv_cache_reduction"].round(3))
    fp8 = " / ".join(f"{v:g}" for v in t["kv_cache_reduction_fp8"].round(3))
    err = max((t["kv_cache_reduction"] - t["paper_kv_cache_reduction"]).abs().max(),
              (t["kv_cache_reduction_fp8"] - t["paper_kv_cache_reduction_fp8"]).abs().max())
    return Claim(name, paper, f"{ours} %; with FP8 {fp8} %", HOLDS if err < 0.1 else FAILS,
                 "reports/table_kv_memory.csv")


# -- measured claims -----------------------------------------------------------------------------------------------


def claim_simscore(path) -> Claim:
    name = "Later layers' inputs are similar: SimScore ≥ 0.5 from about half depth (Fig. 2)"
    paper = "SimScore reaches 0.5 near L/2 for all six models (Qwen2.5-7B lowest, ≈ 0.45 at L/2)"
    t = _read(path)
    if t is None:
        return _absent(name, paper, "reports/simscore_crossings.csv")
    t = t[t["metric"] == "cosine"] if "cosine" in set(t["metric"]) else t
    parts, verdicts = [], []
    for r in t.to_dict("records"):
        depth = _num(r["crossing_depth"])
        parts.append(f"{r['model']}: ≥ 0.5 from layer {r['crossing_layer']}/{r['num_layers']}, "
                     f"{r['simscore_at_half']:.3f} [{r['ci_low_at_half']:.3f}, {r['ci_high_at_half']:.3f}] at L/2")
        if _num(r["ci_low_at_half"]) >= 0.5 and depth <= 0.5:
            verdicts.append(HOLDS)
        elif _num(r["ci_high_at_half"]) < 0.5:
            verdicts.append(FAILS)
        else:
            verdicts.append(UNCLEAR)
    verdict = verdicts[0] if len(set(verdicts)) == 1 else UNCLEAR
    return Claim(name, paper, "; ".join(parts), verdict, "reports/figure2_simscore.png, reports/simscore_crossings.csv")


def claim_prefill_time(df: pd.DataFrame | None) -> Claim:
    name = "Skipping half the layers for prompt tokens cuts prefill time about in half (Fig. 2 right)"
    paper = ("Llama-3.1-8B, 128–2048 tokens: ~40–45% less forward time at 50% SwiftKV, ~65% at 75%, "
             "as the FLOPs predict")
    if df is None or df.empty:
        return _absent(name, paper, "reports/figure2_forward_time.png")
    parts, ok = [], []
    for model, g in df.groupby("model", sort=False):
        L = int(g["num_hidden_layers"].iloc[0])
        half = g[g["num_key_value_layers"] == L // 2]
        if half.empty:
            continue
        r = half.sort_values("prefill_tokens").iloc[-1]
        base = g[(g["variant"] == "base") & (g["prefill_tokens"] == r["prefill_tokens"])].iloc[0]
        ratio, worst = r["median_s"] / base["median_s"], r["q3_s"] / base["q1_s"]
        parts.append(f"{model}, {int(r['prefill_tokens'])} tokens, l={L // 2}: time ratio {ratio:.2f} "
                     f"(worst quartile pair {worst:.2f}) vs {r.get('predicted_ratio', math.nan):.2f} from FLOPs, "
                     f"{base['median_s'] / r['median_s']:.2f}× faster")
        ok.append(HOLDS if worst <= 1.1 * r.get("predicted_ratio", 0.5) else UNCLEAR if ratio < 0.8 else FAILS)
    if not parts:
        return _absent(name, paper, "reports/figure2_forward_time.png")
    verdict = ok[0] if len(set(ok)) == 1 else UNCLEAR
    return Claim(name, paper, "; ".join(parts) + " (holds: measured within 10% of the FLOPs ratio)", verdict,
                 "reports/figure2_forward_time.png")


def _row(t: pd.DataFrame, variant: str, kv_cache: str = "native"):
    hit = t[(t["variant"] == variant) & (t["kv_cache"] == kv_cache)]
    return hit.iloc[0].to_dict() if len(hit) else None


def _pairwise(name: str, paper: str, path, variant: str, better_is_ref: bool, evidence: str,
              kv_cache: str = "native") -> Claim:
    """A claim "the reference row beats ``variant``" decided by ``delta_ref`` (variant minus reference, accuracy
    points, paired bootstrap), with teacher-fidelity KL as the second measure."""
    t = _read(path)
    row = None if t is None else _row(t, variant, kv_cache)
    if row is None or "delta_ref" not in row or math.isnan(_num(row.get("delta_ref"))):
        return _absent(name, paper, evidence)
    ref = str(row.get("delta_ref_row", "reference")).replace(" (native KV)", "")
    ref_row = _row(t, ref.split(" (")[0])
    ref_label = ref_row["label"] if ref_row and isinstance(ref_row.get("label"), str) else ref
    text = f"{row['label']} − {ref_label}: {_ci(row, 'delta_ref', unit=' points')} average accuracy"
    sign = _sign(row, "delta_ref")
    verdict = UNCLEAR if sign == 0 else (HOLDS if (sign < 0) == better_is_ref else FAILS)
    if ref_row and not math.isnan(_num(row.get("kl"))) and not math.isnan(_num(ref_row.get("kl"))):
        text += f"; KL to teacher {_ci(row, 'kl', 3)} vs {_ci(ref_row, 'kl', 3)} nats/token"
        if verdict == UNCLEAR:
            kl_sign = (1 if _num(row["kl_lo"]) > _num(ref_row["kl_hi"]) else
                       -1 if _num(row["kl_hi"]) < _num(ref_row["kl_lo"]) else 0)
            if kl_sign:
                holds = (kl_sign > 0) == better_is_ref
                verdict = f"{HOLDS if holds else FAILS} on teacher fidelity; accuracy {UNCLEAR}"
    return Claim(name, paper, text, verdict, evidence)


def claim_degradation(path) -> Claim:
    name = "Quality degrades as more layers are skipped (Table 2)"
    paper = ("Llama-3.1-8B average " + " → ".join(f"{_paper_avg('table2', v)} ({label})" for v, label in
                                                  (("base", "base"), ("swiftkv-25", "25%"), ("swiftkv-50", "50%"),
                                                   ("swiftkv-62", "62.5%"))))
    t = _read(path)
    if t is None:
        return _absent(name, paper, "reports/table2.csv")
    t = t[(t["kv_cache"] == "native") & ~t["variant"].str.contains("acrosskv") & (t["variant"] != "base")]
    t = t.sort_values("skip_fraction")
    if len(t) < 2:
        return _absent(name, paper, "reports/table2.csv")
    first, last = t.iloc[0].to_dict(), t.iloc[-1].to_dict()
    acc = ", ".join(f"{100 * r['skip_fraction']:g}%: {_ci(r, 'delta_base', unit='')}" for r in t.to_dict("records"))
    kl = ", ".join(f"{_ci(r, 'kl', 3)}" for r in t.to_dict("records"))
    text = f"Δ accuracy vs base (points) {acc}; KL to teacher {kl} nats/token"
    if _num(last.get("kl_lo")) > _num(first.get("kl_hi")) and _num(last["delta_base"]) <= _num(first["delta_base"]):
        verdict = HOLDS if _sign(last, "delta_base") < 0 else f"{HOLDS} on teacher fidelity; accuracy {UNCLEAR}"
    elif _num(last.get("kl_hi")) < _num(first.get("kl_lo")):
        verdict = FAILS
    else:
        verdict = UNCLEAR
    return Claim(name, paper, text, verdict, "reports/table2.csv")


def claim_fp8(path) -> Claim:
    name = "FP8 KV-cache quantisation after training costs little accuracy (Table B.1)"
    paper = "Llama-3.1-8B, FP8 − native average: " + ", ".join(
        f"{_paper_average('tableB1', v, 'fp8') - _paper_average('tableB1', v):+.2f} ({label})"
        for v, label in (("swiftkv-50", "SwiftKV 50%"), ("swiftkv-50-acrosskv-2", "+ 2-way AcrossKV"),
                         ("swiftkv-50-acrosskv-4", "+ 4-way AcrossKV")))
    t = _read(path)
    if t is None:
        return _absent(name, paper, "reports/tableB1.csv")
    rows = [r for r in t[t["kv_cache"] == "fp8"].to_dict("records") if not math.isnan(_num(r.get("delta_ref")))]
    if not rows:
        return _absent(name, paper, "reports/tableB1.csv")
    parts, verdicts = [], []
    for r in rows:
        lo, hi = _num(r["delta_ref_lo"]), _num(r["delta_ref_hi"])
        parts.append(f"{r['label']} − native: {_ci(r, 'delta_ref', unit=' points')}")
        verdicts.append(HOLDS if lo >= -1 and hi <= 1 else FAILS if hi < -1 else UNCLEAR)
    verdict = verdicts[0] if len(set(verdicts)) == 1 else UNCLEAR
    return Claim(name, paper, "; ".join(parts) + " (holds: the interval lies within ±1 point)", verdict,
                 "reports/tableB1.csv")


# Serving studies run each point once with a handful of requests: no bootstrap interval, so these verdicts ask for
# an effect well beyond run-to-run noise (~5% on these machines) and, for latencies, for SwiftKV's 90th percentile to
# lie below the base model's median.
NOISE_NOTE = "one run per point, no interval"


def _measured(serve: pd.DataFrame | None, study: str) -> pd.DataFrame:
    if serve is None or serve.empty or "study" not in serve:
        return pd.DataFrame()
    return serve[(serve["study"] == study) & (serve["status"] == "measured")]


def claim_throughput(serve: pd.DataFrame | None) -> Claim:
    name = "SwiftKV at 50% raises prefill-heavy serving throughput (Fig. 3)"
    paper = "up to 2× combined throughput (Llama-3.1-8B, vLLM, long inputs)"
    t = _measured(serve, "throughput")
    t = t[t["variant"] == "swiftkv-50"] if not t.empty else t
    if t.empty:
        return _absent(name, paper, "reports/figure3_throughput.png")
    parts, verdicts = [], []
    for (engine, hw), g in t.groupby(["engine_label", "hardware"], sort=False):
        r = g.sort_values("input_len").iloc[-1]
        paired = _num(r.get("paired_speedup"))
        parts.append(f"{engine} on {hw}: {r['speedup']:.2f}× at {int(r['input_len'])} in / {int(r['output_len'])} out"
                     + (f" (paired {paired:.2f}×)" if not math.isnan(paired) else "")
                     + (f", FLOPs predict {r['predicted_speedup']:.2f}×"
                        if not math.isnan(_num(r.get("predicted_speedup"))) else ""))
        verdicts.append(HOLDS if r["speedup"] >= 1.5 else FAILS if r["speedup"] < 1.1 else UNCLEAR)
    verdict = HOLDS if HOLDS in verdicts else verdicts[0]
    return Claim(name, paper, "; ".join(parts) + " (holds: ≥ 1.5× on some engine)", verdict,
                 "reports/figure3_throughput.png")


def _engine_name(t: pd.DataFrame) -> pd.Series:
    """The engine part of a serving table's ``source`` ("vLLM 0.32.0 · hardware · model" → "vLLM 0.32.0")."""
    return t["source"].str.split(" · ").str[0]


def _latency_claim(name: str, paper: str, latency: pd.DataFrame | None, metric: str, unit: str, pick: str) -> Claim:
    """Base vs SwiftKV 50% on one latency metric (``ttft`` / ``tpot``, shown in ``unit`` ``s`` or ``ms``); ``pick`` =
    ``lowest`` rate, or the rate with the ``largest`` reduction (the paper reports TPOT "up to" a reduction, under
    load)."""
    scale, digits = (1000.0, 3) if unit == "s" else (1.0, 0)
    evidence = "reports/figure4_latency.png"
    t = _measured(latency, "latency")
    if t.empty:
        return _absent(name, paper, evidence)
    parts, verdicts = [], []
    for (engine, hw), g in t.groupby(["engine_label", "hardware"], sort=False):
        base = g[g["variant"] == "base"].set_index("request_rate")
        swift = g[g["variant"] == "swiftkv-50"].set_index("request_rate")
        rates = sorted(set(base.index) & set(swift.index))
        if not rates:
            continue
        cut = {r: 1 - swift.at[r, f"median_{metric}_ms"] / base.at[r, f"median_{metric}_ms"] for r in rates}
        rate = rates[0] if pick == "lowest" else max(rates, key=cut.get)
        b, s = base.loc[rate], swift.loc[rate]

        def value(row, stat):
            return f"{row[f'{stat}_{metric}_ms'] / scale:.{digits}f}"

        parts.append(f"{engine} on {hw}, {int(s['input_len'])} in, {rate:g} req/s: median {value(b, 'median')} → "
                     f"{value(s, 'median')} {unit} ({cut[rate]:.0%} lower; SwiftKV p90 {value(s, 'p90')})")
        clear = s[f"p90_{metric}_ms"] < b[f"median_{metric}_ms"]
        verdicts.append(HOLDS if cut[rate] >= 0.3 and clear else FAILS if cut[rate] < 0.1 else UNCLEAR)
    if not parts:
        return _absent(name, paper, evidence)
    verdict = HOLDS if HOLDS in verdicts else verdicts[0]
    rule = f"holds: ≥ 30% lower with SwiftKV's p90 below base's median on some engine; {NOISE_NOTE}"
    return Claim(name, paper, "; ".join(parts) + f" ({rule})", verdict, evidence)


def claim_ttft(latency: pd.DataFrame | None) -> Claim:
    return _latency_claim("SwiftKV cuts time to first token at low arrival rates (Fig. 4)",
                          "up to 50% lower: 0.5–0.7 s → 0.25–0.35 s (Llama-3.1-70B, 2K inputs)",
                          latency, "ttft", "s", "lowest")


def claim_tpot(latency: pd.DataFrame | None) -> Claim:
    return _latency_claim("SwiftKV cuts time per output token under load (Fig. 4)",
                          "up to 60% lower: 20–25 → 10–12 ms (Llama-3.1-70B, 2K inputs, 4 req/s)",
                          latency, "tpot", "ms", "largest")


def _per_engine_claim(name: str, paper: str, path, evidence: str, judge, rule: str) -> Claim:
    """A claim over a serving table's measured rows: ``judge(rows of one engine)`` gives ``(text, verdict)`` or None;
    the claim's verdict is the engines' common one, else "cannot tell"."""
    t = _read(path)
    if t is None or "status" not in t:
        return _absent(name, paper, evidence)
    t = t[t["status"] == "measured"]
    found = []
    for engine, g in t.groupby(_engine_name(t), sort=False):
        item = judge(g)
        if item:
            found.append((f"{engine}: {item[0]}", item[1]))
    if not found:
        return _absent(name, paper, evidence)
    verdicts = {verdict for _, verdict in found}
    return Claim(name, paper, "; ".join(text for text, _ in found) + f" ({rule}; {NOISE_NOTE})",
                 verdicts.pop() if len(verdicts) == 1 else UNCLEAR, evidence)


def _ratio_trend(g: pd.DataFrame):
    g = g[g["variant"] == "swiftkv-50"].sort_values("mean_ratio")
    if len(g) < 2:
        return None
    first, last = g.iloc[0], g.iloc[-1]
    steps = " → ".join(f"{v:.2f}×" for v in g["speedup"])
    gain = last["speedup"] - first["speedup"]
    return (f"{steps} over ratios {first['mean_ratio']:.1f} … {last['mean_ratio']:.1f}",
            HOLDS if gain >= 0.2 else FAILS if gain <= 0 else UNCLEAR)


def claim_sharegpt_ratio(path) -> Claim:
    return _per_engine_claim("The throughput gain grows with the input/output ratio on real prompts (Table A.3)",
                             "Llama-3.1-8B on ShareGPT: 1.16× at ratio 1.5 → 1.65× at ratio 150", path,
                             "reports/tableA3.csv", _ratio_trend,
                             "holds: ≥ 0.2× more at the highest ratio than at the lowest on every engine")


def _acrosskv_gain(g: pd.DataFrame):
    swift = g[g["variant"] == "swiftkv-50"]
    across = g[g["variant"].str.startswith("swiftkv-50-acrosskv")]
    both = swift.merge(across, on="kv_limit", suffixes=("", "_a"))
    if len(both) < 2:
        return None
    both["ratio"] = both["throughput_tok_s_a"] / both["throughput_tok_s"]
    both["mib"] = both["kv_limit"].str.extract(r"([\d.]+)")[0].astype(float)
    both = both.sort_values("mib")
    best, plenty = both["ratio"].iloc[:-1].max(), both["ratio"].iloc[-1]
    text = "AcrossKV / SwiftKV " + ", ".join(f"{r['ratio']:.2f}× at {r['kv_limit'].replace(' KV cache', '')}"
                                             for _, r in both.iterrows())
    return text, HOLDS if best >= 1.1 and plenty < 1.05 else FAILS if best < 1.05 else UNCLEAR


def claim_kv_limit(path) -> Claim:
    return _per_engine_claim(
        "AcrossKV adds throughput on top of SwiftKV where KV memory is scarce, not where it is plentiful (Table 3)",
        "20 GB: SwiftKV 50% 12.2K → + 4× AcrossKV 18.0K tok/s; at 80 GB SwiftKV alone is the gain (1.35×)", path,
        "reports/table3.csv", _acrosskv_gain, "holds: ≥ 1.1× at some smaller limit and < 1.05× at the largest")


def claims(paths: dict, prefill: pd.DataFrame | None = None, serve: pd.DataFrame | None = None,
           latency: pd.DataFrame | None = None) -> list[Claim]:
    """All claims, in the paper's order; ``paths`` maps artifact names (``table1``, ``table2``, ...) to files."""
    p = paths.get
    return [
        claim_simscore(p("simscore_crossings")),
        claim_table1(p("table1")),
        claim_kv_memory(p("table_kv_memory")),
        claim_prefill_time(prefill),
        claim_degradation(p("table2")),
        _pairwise("Distillation recovers quality (Table 4a)",
                  f"W/o Distill {_paper_avg('table4a', 'swiftkv-50-lm')} vs KL {_paper_avg('table4a', 'swiftkv-50')} "
                  "(Llama-3.1-8B, 50%; the summary reads that row once as no fine-tuning, once as the LM loss)",
                  p("table4a"), "swiftkv-50-nodistill", True, "reports/table4a.csv"),
        _pairwise("KL to the teacher beats the LM loss (Table 4a)",
                  f"LM loss {_paper_avg('table4a', 'swiftkv-50-lm')} vs KL {_paper_avg('table4a', 'swiftkv-50')} "
                  "(Llama-3.1-8B, 50%)", p("table4a"), "swiftkv-50-lm", True, "reports/table4a.csv"),
        _pairwise("Training only W_QKV of later layers beats training them fully (Table 4b)",
                  f"full {_paper_avg('table4b', 'swiftkv-50-full')} vs partial {_paper_avg('table4b', 'swiftkv-50')} "
                  "(Llama-3.1-8B, 50%)", p("table4b"), "swiftkv-50-full", True, "reports/table4b.csv"),
        _pairwise("AcrossKV beats MQA at an equal KV budget (Table B.2)",
                  f"MQA {_paper_avg('tableB2', 'swiftkv-50-mqa-2')} vs 4-way AcrossKV "
                  f"{_paper_avg('tableB2', 'swiftkv-50-acrosskv-4')} (Llama-3.1-8B, 50%, 37.5% KV saved)",
                  p("tableB2"), "swiftkv-50-mqa-1", True, "reports/tableB2.csv"),
        claim_fp8(p("tableB1")),
        claim_throughput(serve),
        claim_ttft(latency),
        claim_tpot(latency),
        claim_kv_limit(p("table3")),
        claim_sharegpt_ratio(p("tableA3")),
    ]


def claims_frame(items: list[Claim]) -> pd.DataFrame:
    return pd.DataFrame([asdict(c) for c in items])
