"""Quality against prompt length (issue 18, part 1): ``swiftkv long-context`` results of a base model and its SwiftKV
students -> ``reports/table_long_context.csv`` and ``reports/figure_long_context.png``.

Rows of the table (``kind``):

- ``passkey``: per (variant, prompt length, depth; depth ``all`` pools the depths) the share of exact key readings
  with a bootstrap interval over prompts, and the paired difference to the base model on the same prompts;
- ``context``: per (variant, context length) the mean NLL (nats/token) of the same scored tokens, interval over
  conversations, and the paired difference to the base model (``delta``);
- ``growth``: per SwiftKV variant, how much its loss gap to the base grows from the shortest to the longest
  context: delta(longest) - delta(shortest), paired per conversation (the registered claim reads it).
"""

from __future__ import annotations

import pandas as pd

from analysis.stats import BootstrapSettings, mean_ci


def _passkey(result: dict) -> pd.DataFrame:
    return pd.DataFrame(result["passkey"])


def _context(result: dict) -> pd.DataFrame:
    df = pd.DataFrame(result["context"])
    df["nll"] = df.nll_sum / df.tokens
    return df


def long_context_table(results: dict[str, dict], labels: dict[str, str], reference: str = "base",
                       settings: BootstrapSettings = BootstrapSettings()) -> pd.DataFrame:
    """``results``: variant -> result JSON of one model (``reference`` among them)."""
    if reference not in results:
        raise ValueError(f"the long-context results have no {reference!r} row to compare with")
    model = results[reference]["model"]
    ref_pk, ref_ctx = _passkey(results[reference]), _context(results[reference])
    rows = []
    for variant, result in results.items():
        pk, ctx = _passkey(result), _context(result)
        base = {"model": model, "variant": variant, "label": labels.get(variant, variant)}
        for length in sorted(pk.length.unique()):
            for depth in [*sorted(pk.depth.unique()), "all"]:
                sel = (pk.length == length) & ((pk.depth == depth) if depth != "all" else True)
                ref_sel = (ref_pk.length == length) & ((ref_pk.depth == depth) if depth != "all" else True)
                mine = pk[sel].set_index(["depth", "sample"]).exact.astype(float)
                theirs = ref_pk[ref_sel].set_index(["depth", "sample"]).exact.astype(float).reindex(mine.index)
                acc, diff = mean_ci(mine.to_numpy(), settings), mean_ci((mine - theirs).to_numpy(), settings)
                rows.append({**base, "kind": "passkey", "length": int(length), "depth": str(depth), "n": len(mine),
                             "estimate": acc.value, "lo": acc.low, "hi": acc.high, "delta": diff.value,
                             "delta_lo": diff.low, "delta_hi": diff.high,
                             "key_logprob": float(pk[sel].key_logprob.mean())})
        wide = ctx.pivot(index="conversation", columns="context", values="nll")
        ref_wide = ref_ctx.pivot(index="conversation", columns="context", values="nll").reindex(wide.index)
        gap = wide - ref_wide
        for c in wide.columns:
            m, d = mean_ci(wide[c].to_numpy(), settings), mean_ci(gap[c].to_numpy(), settings)
            rows.append({**base, "kind": "context", "context": int(c), "n": len(wide), "estimate": m.value,
                         "lo": m.low, "hi": m.high, "delta": d.value, "delta_lo": d.low, "delta_hi": d.high})
        if variant != reference:
            first, last = min(wide.columns), max(wide.columns)
            g = mean_ci((gap[last] - gap[first]).to_numpy(), settings)
            rows.append({**base, "kind": "growth", "context": int(last), "from_context": int(first), "n": len(wide),
                         "estimate": g.value, "lo": g.low, "hi": g.high})
    cols = ["model", "variant", "label", "kind", "length", "depth", "context", "from_context", "n", "estimate", "lo",
            "hi", "delta", "delta_lo", "delta_hi", "key_logprob"]
    return pd.DataFrame(rows).reindex(columns=cols)


def long_context_figure(table: pd.DataFrame):
    """(a) passkey accuracy against prompt length (depths pooled), (b) the loss gap to the base model against the
    context before the scored tokens; 95% intervals."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.4))
    for i, (variant, g) in enumerate(table.groupby("variant", sort=False)):
        color = plt.get_cmap("tab10")(i % 10)
        label = g.label.iloc[0]
        pk = g[(g.kind == "passkey") & (g.depth == "all")].sort_values("length")
        a.errorbar(pk.length, 100 * pk.estimate, yerr=[100 * (pk.estimate - pk.lo), 100 * (pk.hi - pk.estimate)],
                   fmt="o-", color=color, capsize=3, ms=4, label=label)
        ctx = g[g.kind == "context"].sort_values("context")
        if variant != "base" and len(ctx):
            b.errorbar(ctx.context, ctx.delta, yerr=[ctx.delta - ctx.delta_lo, ctx.delta_hi - ctx.delta], fmt="o-",
                       color=color, capsize=3, ms=4, label=label)
    b.axhline(0, color="grey", lw=1)
    for ax, xlabel, ylabel, title in (
            (a, "prompt length (tokens)", "pass key read exactly (%)", "(a) passkey retrieval, depths pooled"),
            (b, "context before the scored tokens (tokens)", "NLL(student) - NLL(base), nats/token",
             "(b) loss gap to the base model on the same tokens")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def long_context_markdown(table: pd.DataFrame) -> str:
    """The README's summary: passkey accuracy per length (depths pooled) and the loss gap's growth per variant."""
    pk = table[(table.kind == "passkey") & (table.depth == "all")]
    lengths = sorted(pk.length.dropna().astype(int).unique())
    lines = ["| variant | " + " | ".join(f"passkey @ {n}" for n in lengths) + " | loss gap growth, nats/token |",
             "|---|" + "---|" * len(lengths) + "---|"]
    for variant, g in table.groupby("variant", sort=False):
        cells = []
        for n in lengths:
            r = g[(g.kind == "passkey") & (g.depth == "all") & (g.length == n)].iloc[0]
            cells.append(f"{100 * r.estimate:.0f}% [{100 * r.lo:.0f}, {100 * r.hi:.0f}]")
        growth = g[g.kind == "growth"]
        if len(growth):
            r = growth.iloc[0]
            grow = f"{r.estimate:+.3f} [{r.lo:+.3f}, {r.hi:+.3f}] ({int(r.from_context)} -> {int(r.context)})"
        else:
            grow = "(reference)"
        lines.append(f"| {g.label.iloc[0]} | " + " | ".join(cells) + f" | {grow} |")
    return "\n".join(lines)

