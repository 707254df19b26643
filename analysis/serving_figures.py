"""The serving figures: Fig. 3 (throughput against input length) and Fig. 4 (latency against request rate), each
measured source (engine x hardware x model) beside the paper's numbers; a source that could not run where the DAG ran
appears as "not measured here: <reason>". The tables and intervals they draw are ``analysis.serving``'s."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.io import save_figure  # noqa: E402
from analysis.serving import NOT_MEASURED, speedup_intervals  # noqa: E402

COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _not_measured(ax, sub: pd.DataFrame, title: str) -> bool:
    if (sub["status"] == "measured").any():
        return False
    reason = sub["reason"].dropna().iloc[0] if sub["reason"].notna().any() else ""
    ax.text(0.5, 0.5, f"{NOT_MEASURED}\n{reason}", ha="center", va="center", wrap=True, fontsize=8,
            transform=ax.transAxes)
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])
    return True


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _colors(sub: pd.DataFrame) -> dict:
    """One colour per variant, the same in every panel of a source."""
    return {v: COLORS[i % len(COLORS)] for i, v in enumerate(dict.fromkeys(sub["variant"]))}


def _short(source: str) -> str:
    return source.replace(" · ", "\n")


def figure3(measured: pd.DataFrame, paper: pd.DataFrame, path) -> None:
    """Combined throughput vs input length per source (top) and speedup, measured vs FLOPs-predicted (bottom)."""
    sources = list(dict.fromkeys(measured["source"])) if not measured.empty else []
    models = list(dict.fromkeys(paper["model"]))
    ncols = len(sources) + len(models)
    fig, axes = plt.subplots(2, ncols, figsize=(4.2 * ncols, 7), squeeze=False)
    for col, source in enumerate(sources):
        sub = measured[measured["source"] == source]
        top, bottom = axes[0, col], axes[1, col]
        if _not_measured(top, sub, _short(source)):
            bottom.axis("off")
            continue
        ok = speedup_intervals(sub[sub["status"] == "measured"])
        noise = ok.groupby("input_len")[["speedup_paired_noise_lo", "speedup_paired_noise_hi"]].first().dropna()
        if len(noise):  # what the reference's second copy measured against it: the machine's spread
            bottom.fill_between(noise.index, noise["speedup_paired_noise_lo"], noise["speedup_paired_noise_hi"],
                                color="grey", alpha=0.3, label="noise floor (base vs base)")
        ok = ok[ok["again_of"].isna()]
        colors = _colors(sub)
        for variant, g in ok.groupby("variant", sort=False):
            g = g.sort_values("input_len")
            err = None
            if {"throughput_q1_tok_s", "throughput_q3_tok_s"} <= set(g):
                err = [(g["throughput_tok_s"] - g["throughput_q1_tok_s"]).clip(lower=0),
                       (g["throughput_q3_tok_s"] - g["throughput_tok_s"]).clip(lower=0)]
            top.errorbar(g["input_len"], g["throughput_tok_s"], yerr=err, marker="o", capsize=3,
                         label=g["label"].iloc[0], color=colors[variant])
            if variant != "base":
                paired = g["speedup_paired"].notna() & g["speedup_paired_lo"].notna()
                y = g["speedup_paired"].where(paired, g["speedup"])
                yerr = [(y - g["speedup_paired_lo"]).where(paired, 0), (g["speedup_paired_hi"] - y).where(paired, 0)]
                bottom.errorbar(g["input_len"], y, yerr=yerr, marker="o", capsize=3, color=colors[variant],
                                label=f"{g['label'].iloc[0]} measured" + (" (95% CI over repeats)" if paired.any()
                                                                          else ""))
                if g["predicted_speedup"].notna().any():
                    bottom.plot(g["input_len"], g["predicted_speedup"], ls="--", color=colors[variant],
                                label=f"{g['label'].iloc[0]} predicted (FLOPs)")
        if not (ok["variant"] != "base").any():
            bottom.text(0.5, 0.5, "only the base model is served\nby this engine here", ha="center", va="center",
                        fontsize=8, transform=bottom.transAxes)
        skipped = sub[sub["status"] != "measured"]["label"].dropna().unique()
        title = _short(source) + (f"\n({', '.join(skipped)}: {NOT_MEASURED})" if len(skipped) else "")
        top.set_title(title, fontsize=8)
        top.set_ylabel("combined throughput (tokens/s)")
        out_len = ok["output_len"].dropna().unique()
        bottom.set_xlabel(f"input length (tokens), {', '.join(str(int(o)) for o in out_len)} output")
        bottom.set_ylabel("speedup over base")
        bottom.axhline(1.0, color="grey", lw=0.5)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            _legend(ax)
        bottom.set_xlim(top.get_xlim())
    for j, model in enumerate(models):
        col = len(sources) + j
        p = paper[paper["model"] == model]
        top, bottom = axes[0, col], axes[1, col]
        for variant, g in p.groupby("variant", sort=False):
            g = g.sort_values("input_len")
            mid = (g["throughput_low_tok_s"] + g["throughput_high_tok_s"]) / 2
            line = top.plot(g["input_len"], mid, marker="s", label=g["label"].iloc[0])
            top.fill_between(g["input_len"], g["throughput_low_tok_s"], g["throughput_high_tok_s"], alpha=0.25,
                             color=line[0].get_color())
            if g["speedup_low"].notna().any():
                bottom.fill_between(g["input_len"], g["speedup_low"], g["speedup_high"], alpha=0.4,
                                    label=f"{g['label'].iloc[0]} (paper)")
        top.set_title(f"paper: {model}\nvLLM, {p['hardware'].iloc[0]}, 256 output", fontsize=8)
        bottom.set_xlabel("input length (tokens)")
        bottom.axhline(1.0, color="grey", lw=0.5)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            _legend(ax)
    fig.suptitle("Fig. 3: combined (input + output) throughput vs input length — measured here beside the paper")
    fig.tight_layout()
    save_figure(fig, path, dpi=120, bbox_inches=None)
    plt.close(fig)


def figure4(measured: pd.DataFrame, paper: pd.DataFrame, path) -> None:
    """TTFT (top) and TPOT (bottom) vs request rate per source, beside the paper's key numbers."""
    sources = list(dict.fromkeys(measured["source"])) if not measured.empty else []
    fig, axes = plt.subplots(2, len(sources) + 1, figsize=(4.2 * (len(sources) + 1), 7), squeeze=False)
    for col, source in enumerate(sources):
        sub = measured[measured["source"] == source]
        top, bottom = axes[0, col], axes[1, col]
        if _not_measured(top, sub, _short(source)):
            bottom.axis("off")
            continue
        ok = sub[sub["status"] == "measured"]
        ok = ok[ok["again_of"].isna()]  # the noise-floor copy: in the claims' table
        colors = _colors(sub)
        for variant, g in ok.groupby("variant", sort=False):
            g = g.sort_values("request_rate")
            top.plot(g["request_rate"], g["median_ttft_ms"] / 1e3, marker="o", label=g["label"].iloc[0],
                     color=colors[variant])
            bottom.plot(g["request_rate"], g["median_tpot_ms"], marker="o", label=g["label"].iloc[0],
                        color=colors[variant])
        lens = ok[["input_len", "output_len"]].drop_duplicates().astype(int).values.tolist()
        top.set_title(_short(source) + "".join(f"\n{i} in / {o} out" for i, o in lens), fontsize=8)
        top.set_ylabel("median TTFT (s)")
        bottom.set_ylabel("median TPOT (ms)")
        bottom.set_xlabel("request rate (requests/s, Poisson)")
        for ax in (top, bottom):
            _legend(ax)
    top, bottom = axes[0, -1], axes[1, -1]
    for ax, metric, unit in ((top, "ttft", "s"), (bottom, "tpot", "ms")):
        p = paper[paper["metric"] == metric].copy()
        p["case"] = p["model"].str.replace("-instruct", "") + ", " + p["input_len"].astype(str) + " in,\n" + p["condition"]
        cases = list(dict.fromkeys(p["case"]))
        for k, variant in enumerate(("base", "swiftkv-50")):
            v = p[p["variant"] == variant].set_index("case").reindex(cases)
            mid = (v["low"] + v["high"]) / 2
            ax.bar([i + 0.4 * k for i in range(len(cases))], mid, width=0.4, yerr=[mid - v["low"], v["high"] - mid],
                   capsize=3, label="Base" if variant == "base" else "SwiftKV 50%")
        ax.set_xticks([i + 0.2 for i in range(len(cases))], cases, fontsize=6)
        ax.set_ylabel(f"{metric.upper()} ({unit})")
        ax.legend(fontsize=7)
    top.set_title("paper, key numbers:\nFig. 4 (70B, 4x H100), Fig. A.1 (8B, 1x H100)", fontsize=8)
    fig.suptitle("Fig. 4: latency vs request rate — measured here beside the paper")
    fig.tight_layout()
    save_figure(fig, path, dpi=120, bbox_inches=None)
    plt.close(fig)
