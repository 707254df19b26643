"""Figures (matplotlib only): SimScore by depth (paper Fig. 2 left/middle), forward time vs prefill tokens (right)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis.tables import crossing_layer

METRIC_PANELS = {
    "cosine": ("(a) SimScore, paper Eq. 1 (plain cosine)",
               "The paper's measure: where it stays >= 0.5 is the paper's\ncriterion for how many layers SwiftKV can skip."),
    "centred": ("(b) diagnostic: centred cosine",
                "Per-layer token mean removed: similarity of the token-specific\ncontent that later layers' K/V must carry."),
    "no_outliers": ("(c) diagnostic: top outlier dims removed",
                    "Cosine without the few dims that carry most of the norm:\nwhether (a) is carried by those dims alone."),
}


def _colors(n: int):
    cmap = plt.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def simscore_figure(df: pd.DataFrame, threshold: float = 0.5, subtitle: str = ""):
    """One panel per metric (paper's SimScore first): curve per model vs depth l/L with its CI band and 0.5 crossing."""
    metrics = [m for m in METRIC_PANELS if m in set(df.metric)]
    models = list(dict.fromkeys(df.model))
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.6), sharey=True, squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        title, claim = METRIC_PANELS[metric]
        for i, (color, model) in enumerate(zip(_colors(len(models)), models)):
            g = df[(df.model == model) & (df.metric == metric)].sort_values("layer")
            if g.empty:
                continue
            L = int(g.num_layers.iloc[0])
            x = g.layer.to_numpy() / L
            ax.plot(x, g.simscore, color=color, lw=1.6, marker=".", ms=4, label=f"{model} (L={L})")
            ax.fill_between(x, g.ci_low, g.ci_high, color=color, alpha=0.25, lw=0)
            l = crossing_layer(g.simscore, threshold)
            if l is not None:
                y = float(g[g.layer == l].simscore.iloc[0])
                ax.plot([l / L], [y], marker="o", ms=8, mfc="none", mec=color, mew=1.8)
                # labels stacked in rows under the 0.5 line (one row per model) so that close crossings stay legible
                ax.annotate(f"l={l}/{L}", (l / L, y), xytext=(l / L + 0.015, threshold - 0.07 * (i + 1)),
                            textcoords="data", ha="left", va="center", fontsize=8, color=color, fontweight="bold")
        ax.axhline(threshold, color="0.3", ls="--", lw=1)
        ax.axvline(0.5, color="0.6", ls=":", lw=1)  # half depth: where the paper finds the 0.5 crossing
        ax.set_title(f"{title}\n{claim}", fontsize=8.5, loc="left")
        ax.set_xlabel("depth l / L  (input of layer l; SwiftKV keeps l layers)")
        ax.set_xlim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("SimScore (mean similarity to every later layer's input)")
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle("SimScore by depth" + (f" — {subtitle}" if subtitle else "")
                 + f"; circles: layer from which the curve stays >= {threshold}; bands: 95% bootstrap CI over sequences",
                 fontsize=9.5)
    fig.tight_layout()
    return fig


def _variant_label(row) -> str:
    L, l = int(row.num_hidden_layers), int(row.num_key_value_layers)
    return f"base (l=L={L})" if row.variant == "base" else f"SwiftKV l={l} ({100 * (1 - l / L):.0f}% skipped)"


def forward_time_figure(df: pd.DataFrame, title: str = ""):
    """(a) median prefill forward time vs prefill tokens per l (IQR bars); (b) time ratio vs base, measured vs FLOPs."""
    df = df.copy()
    df["label"] = df.apply(_variant_label, axis=1)
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(11, 4.4))
    variants = list(dict.fromkeys(df.sort_values("num_key_value_layers", ascending=False).label))
    colors = dict(zip(variants, _colors(len(variants))))
    for model, dm in df.groupby("model", sort=False):
        for label in variants:
            g = dm[dm.label == label].sort_values("prefill_tokens")
            if g.empty:
                continue
            c = colors[label]
            x = g.prefill_tokens.to_numpy()
            med = 1e3 * g.median_s.to_numpy()
            err = np.vstack([med - 1e3 * g.q1_s.to_numpy(), 1e3 * g.q3_s.to_numpy() - med])
            ax_t.errorbar(x, med, yerr=err, color=c, marker="o", ms=4, capsize=3, label=label)
            base = dm[dm.variant == "base"].set_index("prefill_tokens").loc[x]
            ratio = g.median_s.to_numpy() / base.median_s.to_numpy()
            spread = np.vstack([ratio - g.q1_s.to_numpy() / base.median_s.to_numpy(),
                                g.q3_s.to_numpy() / base.median_s.to_numpy() - ratio])
            ax_r.errorbar(x, ratio, yerr=np.clip(spread, 0, None), color=c, marker="o", ms=4, capsize=3)
            if "predicted_ratio" in g:
                ax_r.plot(x, g.predicted_ratio, color=c, ls="--", lw=1.4)
                for xi, m, p in zip(x[-1:], ratio[-1:], g.predicted_ratio.to_numpy()[-1:]):
                    ax_r.annotate(f"{m:.2f} vs {p:.2f}", (xi, m), xytext=(6, 0), textcoords="offset points",
                                  fontsize=7.5, color=c, va="center")
    ticks = sorted(df.prefill_tokens.unique())
    for ax in (ax_t, ax_r):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("prefill tokens (one prompt)")
        ax.grid(alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("forward time, median [ms] (bars: IQR)")
    ax_t.set_title("(a) prefill forward time", fontsize=10)
    ax_t.legend(fontsize=8)
    ax_r.set_ylabel("time / base time")
    ax_r.set_ylim(0, 1.15)
    ax_r.set_title("(b) time / base time: measured (solid, IQR) vs FLOPs ratio (dashed)", fontsize=10)
    ax_r.legend(handles=[plt.Line2D([], [], color="0.2", marker="o", label="measured (median, IQR)"),
                         plt.Line2D([], [], color="0.2", ls="--", label="predicted: FLOPs ratio of the same forward")],
                fontsize=8, loc="lower left")
    ax_r.set_xlim(right=ax_r.get_xlim()[1] * 1.6)  # room for the end labels "measured vs predicted"
    if title:
        fig.suptitle(title, fontsize=9.5)
    fig.tight_layout()
    return fig


def simscore_subtitle(meta: dict[str, dict]) -> str:
    """Sample sizes from the runs' metadata (same sample settings for every model in a profile)."""
    if not meta:
        return ""
    m = next(iter(meta.values()))
    n = sorted({v["num_sequences"] for v in meta.values()})
    plain = [k for k, v in meta.items() if not v.get("chat_template", True)]
    text = (f"{'/'.join(map(str, n))} held-out ShareGPT conversations, <= {m['settings']['max_tokens']} tokens each, "
            "chat template")
    if plain:
        text += f" (plain 'User:/Assistant:' text for {', '.join(plain)}: no template)"
    return text


def forward_time_title(df: pd.DataFrame) -> str:
    row = df.iloc[0]
    return (f"{', '.join(dict.fromkeys(df.model))}: one prompt per forward, {row['dtype']}, {row['torch_threads']} torch "
            f"threads, median of {row['repeats']} interleaved repeats after warm-up; {row['cpu']}")
