"""Serving benchmarks: result JSONs of ``swiftkv bench serve`` -> tidy tables, intervals and the page's summary (the
Fig. 3 / Fig. 4 figures are ``analysis.serving_figures``).

Each measured source (engine x hardware x model) is drawn beside the paper's numbers (``analysis/paper/*.csv``);
a source that could not run where the DAG ran (no GPU, no vLLM) appears as "not measured here: <reason>".
pandas only.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.io import read_json
from analysis.stats import BootstrapSettings, Interval, median_ci, paired_median_ratio_ci

ENGINE_NAMES = {"hf": "{version} generate()", "vllm": "vLLM {version}"}
NOT_MEASURED = "not measured here"


def load_raw(raw: str | Path, sources: list[str]) -> pd.DataFrame:
    """``load_results`` of the serving results ``sources`` (``results/bench/serve/...`` paths) as collected in the
    raw folder ``raw`` (``reports/raw/serving/<study>``, analysis.raw)."""
    from analysis.raw import raw_path

    return load_results([raw_path(raw, s) for s in sources])


def load_results(paths) -> pd.DataFrame:
    """One row per (result row) of every JSON, with the run's engine, hardware and status as columns."""
    frames = []
    for path in paths:
        data = read_json(path)
        hw = data.get("hardware", {})
        version = data.get("engine_version") or data["engine"]
        engine = ENGINE_NAMES.get(data["engine"], "{version}").format(version=version.replace("vllm ", ""))
        measured = data.get("status", "measured") == "measured"
        run = {
            "engine": data["engine"],
            "engine_label": engine,
            # a run that could not start names the device it asked for, not the machine that lacked it
            "hardware": hw.get("label", "unknown hardware") if measured else str(data.get("device", "?")),
            "model": Path(str(data["model"])).stem if str(data["model"]).endswith(".json") else data["model"],
            "study": data["study"],
            "dtype": data.get("dtype"),
            "run_status": data.get("status", "measured"),
            "run_reason": data.get("reason"),
            "file": str(path),
        }
        rows = data.get("results") or [{"variant": "-", "status": "not_measured", "reason": data.get("reason")}]
        frame = pd.DataFrame(rows)
        for key, value in run.items():
            frame[key] = value
        again = {v["id"]: v.get("again_of") for v in data.get("variants", [])}  # noise-floor copies (--noise-floor)
        frame["again_of"] = frame["variant"].map(again)
        frames.append(frame)
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    if "status" not in df:
        df["status"] = "measured"
    df["status"] = df["status"].fillna("measured")
    df.loc[df["run_status"] == "not_measured", "status"] = "not_measured"
    if "reason" not in df:
        df["reason"] = None
    df["reason"] = df["reason"].fillna(df["run_reason"])
    df["source"] = df["engine_label"] + " · " + df["hardware"] + " · " + df["model"]
    return df


def _status_text(row) -> str:
    if row.get("status", "measured") == "measured":
        return "measured"
    if row.get("status") == "not_measured":
        return f"{NOT_MEASURED}: {row.get('reason')}" if row.get("reason") else NOT_MEASURED
    return f"{row.get('status')}: {row.get('reason')}"


# -- intervals: every ratio with its interval, beside the measured noise floor --------------------------------
#
# A throughput point's repeats run interleaved (round i runs every variant once), so the speedup estimator is the
# median over rounds of the same round's ratio to the reference, with a bootstrap interval over rounds. A latency
# point replays the same requests (prompts, arrivals) for every variant, so a TTFT or TPOT ratio is the ratio of
# medians with an interval from resampling requests (paired). The noise floor of a point is the same estimate for
# the reference's second copy (variant "<reference>-again", swiftkv bench serve --noise-floor) against the
# reference: what the machine alone gives.

POINT_KEY = {"throughput": "input_len", "kv-limit": "kv_limit_bytes", "sharegpt": "min_ratio",
             "latency": "request_rate"}
NAN_INTERVAL = Interval(float("nan"), float("nan"), float("nan"))
INTERVAL_COLUMNS = ("speedup_paired", "speedup_paired_lo", "speedup_paired_hi", "n_repeats", "speedup_paired_noise_lo",
                    "speedup_paired_noise_hi")  # speedup_intervals' columns, as Tables 3 and A.3 show them


def _reference(g: pd.DataFrame) -> str:
    """The variant a point's ratios are relative to: the one its noise-floor copy repeats, else base, else the first."""
    again = g["again_of"].dropna()
    if len(again):
        return again.iloc[0]
    return "base" if (g["variant"] == "base").any() else g["variant"].iloc[0]


def _values(row, column: str) -> list | None:
    value = row.get(column)
    return list(value) if isinstance(value, list) and value else None


def round_ratios(runs: list | None, ref: list | None) -> list[float] | None:
    """runs[i] / ref[i] for every round i (both ran in it); None without per-round numbers for both."""
    if not isinstance(runs, list) or not isinstance(ref, list) or not runs or len(runs) != len(ref):
        return None
    return [a / b for a, b in zip(runs, ref)]


def repeat_ratio(runs: list | None, ref: list | None, settings: BootstrapSettings = BootstrapSettings()) -> Interval:
    """Median over rounds of runs[i] / ref[i] with its interval; nan without per-round numbers for both."""
    ratios = round_ratios(runs, ref)
    return NAN_INTERVAL if ratios is None else median_ci(ratios, settings)


def request_ratio(values: list | None, ref: list | None, settings: BootstrapSettings = BootstrapSettings()) -> Interval:
    """median(values) / median(ref) over the requests both have (paired by position), with its interval."""
    if values is None or ref is None or len(values) != len(ref):
        return NAN_INTERVAL
    pairs = [(a, b) for a, b in zip(values, ref) if a is not None and b is not None]
    if not pairs:
        return NAN_INTERVAL
    return paired_median_ratio_ci([a for a, _ in pairs], [b for _, b in pairs], settings)


def _with_intervals(measured: pd.DataFrame, metrics: dict[str, tuple[str, callable]],
                    settings: BootstrapSettings) -> pd.DataFrame:
    """``measured`` plus, for each metric name -> (per-row list column, estimator): <name>, <name>_lo, <name>_hi and
    the point's noise floor <name>_noise_lo / _noise_hi (nan where the point has no noise-floor copy)."""
    out = measured.copy().reset_index(drop=True)
    cols = [f"{m}{suffix}" for m in metrics for suffix in ("", "_lo", "_hi", "_noise_lo", "_noise_hi")]
    for col in cols:
        out[col] = float("nan")
    if out.empty or "study" not in out:
        return out
    point = out.apply(lambda r: (r["source"], r["study"], r.get(POINT_KEY.get(r["study"], "study"))), axis=1)
    for _, g in out.groupby(point, sort=False):
        ref_name = _reference(g)
        ref = g[g["variant"] == ref_name]
        if ref.empty:
            continue
        ref = ref.iloc[0]
        again = g[g["again_of"] == ref_name]
        for name, (column, estimator) in metrics.items():
            noise = estimator(_values(again.iloc[0], column), _values(ref, column), settings) if len(again) \
                else NAN_INTERVAL
            for i, row in g.iterrows():
                est = estimator(_values(row, column), _values(ref, column), settings)
                out.loc[i, [name, f"{name}_lo", f"{name}_hi", f"{name}_noise_lo", f"{name}_noise_hi"]] = [
                    est.value, est.low, est.high, noise.low, noise.high]
    return out


def speedup_intervals(measured: pd.DataFrame, settings: BootstrapSettings = BootstrapSettings()) -> pd.DataFrame:
    """Throughput, kv-limit and sharegpt rows with ``speedup_paired`` (the median over rounds of the round's ratio to
    the reference), its 95% interval ``speedup_paired_lo``/``_hi``, the point's noise floor
    ``speedup_paired_noise_lo``/``_hi``, and ``n_repeats``."""
    out = _with_intervals(measured, {"speedup_paired": ("throughput_runs_tok_s", repeat_ratio)}, settings)
    out["n_repeats"] = out.get("throughput_runs_tok_s", pd.Series(index=out.index, dtype=object)).map(
        lambda v: len(v) if isinstance(v, list) else float("nan"))
    return out


def latency_intervals(measured: pd.DataFrame, settings: BootstrapSettings = BootstrapSettings()) -> pd.DataFrame:
    """Latency rows with ``ttft_ratio`` and ``tpot_ratio`` (this variant's median over the reference's, on the same
    requests), their 95% intervals and the rate's noise floor, and ``n_requests_timed``."""
    metrics = {"ttft_ratio": ("ttft_ms", request_ratio), "tpot_ratio": ("tpot_ms", request_ratio)}
    out = _with_intervals(measured, metrics, settings)
    out["n_requests_timed"] = out.get("ttft_ms", pd.Series(index=out.index, dtype=object)).map(
        lambda v: len(v) if isinstance(v, list) else float("nan"))
    return out


# -- tables ---------------------------------------------------------------------------------------------------


def table3(measured: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """Throughput under KV-cache limits: measured rows (every source), then the paper's (memory limits on H100)."""
    cols = ["source", "engine", "hardware", "model", "kv_limit", "variant", "label", "input_len", "output_len",
            "num_requests", "batch_size", "concurrency", "throughput_tok_s", "speedup", *INTERVAL_COLUMNS,
            "predicted_speedup", "kv_cache_bytes", "kv_cache_tokens", "status"]
    out = []
    if not measured.empty:
        m = speedup_intervals(measured)
        m["concurrency"] = concurrency(m)
        m["kv_limit"] = (m["kv_limit_bytes"] / 2**20).map(lambda v: f"{v:g} MiB KV cache") if "kv_limit_bytes" in m \
            else None
        m["status"] = m.apply(_status_text, axis=1)
        out.append(m.reindex(columns=cols))
    p = paper.copy()
    p["source"] = "paper"
    p["engine"] = "vLLM (paper)"
    p["kv_limit"] = p["memory_gb"].map(lambda v: f"{v:g} GB GPU memory")
    base = p[p["variant"] == "base"].set_index("memory_gb")["throughput_tok_s"]
    p["speedup"] = p["throughput_tok_s"] / p["memory_gb"].map(base)
    p["status"] = p["note"].fillna("paper").replace("OOM", "paper: out of memory")
    out.append(p.reindex(columns=cols))
    return pd.concat(out, ignore_index=True)


def concurrency(rows: pd.DataFrame) -> pd.Series:
    """Requests each row's engine ran at once: as the run recorded it (``concurrency``: the hf engine's batch, vLLM's
    peak of ``vllm:num_requests_running`` per round, median over rounds); for hf runs from before it was recorded,
    the batch (the hf engine runs one batch at a time); else unknown (NaN)."""
    recorded = rows["concurrency"] if "concurrency" in rows else pd.Series(float("nan"), index=rows.index)
    batch = rows["batch_size"] if "batch_size" in rows else pd.Series(float("nan"), index=rows.index)
    return recorded.astype(float).fillna(batch.where(rows["engine"] == "hf").astype(float))


def table_a3(measured: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """ShareGPT by minimum input/output ratio: mean ratio and throughput per filter, measured then paper."""
    cols = ["source", "engine", "hardware", "model", "min_ratio", "mean_ratio", "mean_ratio_per_request",
            "num_requests", "mean_input_len", "mean_output_len", "variant", "label", "throughput_tok_s", "speedup",
            *INTERVAL_COLUMNS, "predicted_speedup", "status"]
    out = []
    if not measured.empty:
        m = speedup_intervals(measured).rename(columns={"ratio_of_sums": "mean_ratio",
                                                        "mean_ratio": "mean_ratio_per_request"})
        m["status"] = m.apply(_status_text, axis=1)
        out.append(m.reindex(columns=cols))
    p = paper.copy()
    p["source"] = "paper"
    p["engine"] = "vLLM (paper)"
    p["status"] = p["note"].fillna("paper")
    out.append(p.reindex(columns=cols))
    return pd.concat(out, ignore_index=True)


# -- figures --------------------------------------------------------------------------------------------------


def serving_fidelity_table(results: list[dict]) -> pd.DataFrame:
    """One row per (model, served configuration) of ``swiftkv bench served-fidelity`` results: the measures over
    every prompt, the tolerance they are held to, and whether they are within it (issue 18, part 3)."""
    rows = []
    for result in results:
        tol = result["tolerance"]
        for name, c in result["configs"].items():
            rows.append({"model": result["model"], "config": name, "num_key_value_layers": result["num_key_value_layers"],
                         "key_value_group_size": c["key_value_group_size"], "prefill_skip": c["prefill_skip"],
                         "prompts": c["prompts"], "generated_tokens": c["generated_tokens"],
                         "greedy_mean": c["greedy_mean"], "greedy_identical": c["greedy_identical"],
                         "logprob_max_abs": c["logprob_max_abs"], "logprob_mean_abs": c["logprob_mean_abs"],
                         "topk_mean": c["topk_mean"], "top_k": result["settings"]["top_k"],
                         **{f"tolerance_{k}": v for k, v in tol.items()},
                         "within_tolerance": c["within_tolerance"], "outside": " ".join(c["outside"])})
    return pd.DataFrame(rows)


def serving_fidelity_markdown(table: pd.DataFrame) -> str:
    """The README's served-fidelity table (generated from reports/table_serving_fidelity.csv, never typed)."""
    lines = ["| model | served as | prompts | greedy agreement (identical) | max \\|Δ log p\\| | mean \\|Δ log p\\| "
             "| top-k overlap | within tolerance |", "|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.model} | l={r.num_key_value_layers}, g={r.key_value_group_size}, prefill skip "
                     f"{'on' if r.prefill_skip else 'off'} | {r.prompts} | {r.greedy_mean:.3f} ({r.greedy_identical:.0%}) "
                     f"| {r.logprob_max_abs:.2e} | {r.logprob_mean_abs:.2e} | {r.topk_mean:.3f} (k={r.top_k}) | "
                     f"{'yes' if r.within_tolerance else 'no: ' + r.outside} |")
    t = table.iloc[0]
    lines.append(f"\nTolerance (fp32 both sides, set before any measurement): greedy agreement >= "
                 f"{t.tolerance_greedy_mean:g}, max |Δ log p| <= {t.tolerance_logprob_max_abs:g}, mean <= "
                 f"{t.tolerance_logprob_mean_abs:g}, top-k overlap >= {t.tolerance_topk_mean:g}.")
    return "\n".join(lines)


# -- the README's serving summary (generated from reports/raw/serving/<study>, never typed) ---------------------


def load_study(raw: str | Path) -> pd.DataFrame:
    """The measured rows of one serving study's raw folder (every result file its manifest lists); empty without
    the folder."""
    from analysis.raw import MANIFEST

    manifest = Path(raw) / MANIFEST
    if not manifest.is_file():
        return pd.DataFrame()
    sources = [f["source"] for f in read_json(manifest)["files"].values()]
    df = load_raw(raw, sources)
    return df[df["status"] == "measured"] if not df.empty else df


def _cell(row, name: str) -> str:
    value, lo, hi = (row.get(f"{name}{s}") for s in ("", "_lo", "_hi"))
    if value is None or pd.isna(value):
        return "–"
    return f"{value:.2f} [{lo:.2f}, {hi:.2f}]" if pd.notna(lo) else f"{value:.2f}"


def _noise_cell(row, name: str) -> str:
    lo, hi = row.get(f"{name}_noise_lo"), row.get(f"{name}_noise_hi")
    return "–" if lo is None or pd.isna(lo) else f"[{lo:.2f}, {hi:.2f}]"


SUMMARY_VARIANTS = ("swiftkv-50", "swiftkv-50-acrosskv-3")  # the two rows every serving study compares to base


def _point_label(study: str, row) -> str:
    if study == "throughput":
        out = row.get("output_len")
        return f"{row['input_len']:g} in" + (f" / {out:g} out" if pd.notna(out) else "")
    if study == "kv-limit":
        return f"{row['kv_limit_bytes'] / 2**20:g} MiB"
    if study == "sharegpt":
        ratio = row.get("ratio_of_sums")
        return f"ratio ≥ {row['min_ratio']:g}" + (f" (ratio of sums {ratio:.1f})" if pd.notna(ratio) else "")
    return f"{row['request_rate']:g} req/s"


def serving_markdown(studies: dict[str, pd.DataFrame]) -> str:
    """The README's serving numbers: per study, point and engine, each variant's ratio to base with its 95%
    interval (analysis.serving's estimators, the ones the claims read) beside the base-vs-base interval of the same
    point. ``studies``: study -> ``load_study`` of its raw folder."""
    out = []
    speed = [(s, speedup_intervals(studies[s])) for s in ("throughput", "kv-limit", "sharegpt")
             if s in studies and not studies[s].empty]
    if speed:
        out += ["| study | point | engine | rounds | SwiftKV 50 % | + 3-way AcrossKV | base again (noise) |",
                "|---|---|---|---|---|---|---|"]
        for study, frame in speed:
            key = POINT_KEY[study]
            for (engine, _), g in frame.groupby(["engine_label", key], sort=False):
                by = g.set_index("variant")
                first = by.loc[SUMMARY_VARIANTS[0]] if SUMMARY_VARIANTS[0] in by.index else g.iloc[0]
                cells = [_cell(by.loc[v], "speedup_paired") if v in by.index else "–" for v in SUMMARY_VARIANTS]
                out.append(f"| {study} | {_point_label(study, first)} | {engine} | {first['n_repeats']:.0f} | "
                           f"{cells[0]} | {cells[1]} | {_noise_cell(first, 'speedup_paired')} |")
        out.append("\nThroughput ratio to base: the median over interleaved rounds of the same round's ratio, with a "
                   "bootstrap interval over rounds; the noise column is the same estimate for base measured again.")
    if "latency" in studies and not studies["latency"].empty:
        frame = latency_intervals(studies["latency"])
        out += ["", "| rate | engine | requests | TTFT SwiftKV 50 % | TTFT + AcrossKV | TTFT noise | TPOT SwiftKV 50 % "
                "| TPOT + AcrossKV | TPOT noise |", "|---|---|---|---|---|---|---|---|---|"]
        for (engine, _), g in frame.groupby(["engine_label", "request_rate"], sort=False):
            by = g.set_index("variant")
            first = by.loc[SUMMARY_VARIANTS[0]] if SUMMARY_VARIANTS[0] in by.index else g.iloc[0]
            cells = [_cell(by.loc[v], m) if v in by.index else "–" for m in ("ttft_ratio", "tpot_ratio")
                     for v in SUMMARY_VARIANTS]
            out.append(f"| {_point_label('latency', first)} | {engine} | {first['n_requests_timed']:.0f} | "
                       f"{cells[0]} | {cells[1]} | {_noise_cell(first, 'ttft_ratio')} | {cells[2]} | {cells[3]} | "
                       f"{_noise_cell(first, 'tpot_ratio')} |")
        out.append("\nTTFT and TPOT: the variant's median over base's on the same requests (same prompts and "
                   "arrival times), with a paired bootstrap interval over requests; below 1 is faster.")
    return "\n".join(out).lstrip("\n")


def committed_summary(reports: str | Path = "reports") -> str:
    """``serving_markdown`` of the four committed raw serving folders under ``reports`` (the README's serving block,
    ``analysis.readme``)."""
    from analysis.raw import serving_raw

    return serving_markdown({s: load_study(serving_raw(s, reports))
                             for s in ("throughput", "kv-limit", "sharegpt", "latency")})
