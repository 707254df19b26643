"""The cut-off advisor's page (issue 18, part 2): ``swiftkv advise`` results + the trained rows of Table 2 ->
``reports/table_advisor.csv`` (every candidate), ``reports/table_advisor_calibration.csv`` (per model and predictor:
does it rank the trained students?) and ``reports/figure_advisor.png`` (the Pareto plot and the calibration).

The trained rows are Table 2's students of the advised model trained with the tables' recipe (KL loss, partial
scope, the model's own KV heads): their held-out KL to the teacher (``kl``, nats/token, T = 1, with its interval)
is the same measure, on the same held-out conversations, as the advisor's untrained KL.
"""

from __future__ import annotations

import math

import pandas as pd

from swiftkv.measure.advisor import AdvisorSettings, TrainedPoint, advise, calibrate

RECIPE = {"loss": "kl", "scope": "partial", "train": "yes"}  # the tables' recipe: the rows the advisor predicts


def trained_points(table2: pd.DataFrame, rows: list[dict], model: str) -> list[TrainedPoint]:
    """Table 2's trained students of ``model`` with the tables' recipe and the model's own KV heads (``rows``: the
    variants sheet as dicts, None where a cell is empty): label, (l, g) and held-out KL with its interval."""
    measured = table2[(table2.model == model) & (table2.kv_cache == "native")].set_index("variant")
    out = []
    for r in rows:
        if (r["model"] != model or r["variant"] == "base" or r.get("kv_heads") is not None
                or any(str(r[k]) != v for k, v in RECIPE.items())):
            continue
        if r["variant"] not in measured.index or pd.isna(measured.loc[r["variant"], "kl"]):
            continue
        m = measured.loc[r["variant"]]
        out.append(TrainedPoint(r["label"], int(r["num_key_value_layers"]), int(r["key_value_group_size"]),
                                float(m["kl"]), float(m["kl_lo"]), float(m["kl_hi"])))
    return out


def advisor_tables(results: list[dict], table2: pd.DataFrame, rows: list[dict],
                   tolerance: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every candidate of every advised model, one calibration row per model and predictor)."""
    cand_rows, cal_rows = [], []
    for result in results:
        model = result["model"]
        settings = AdvisorSettings(**{k: tuple(v) if isinstance(v, list) else v
                                      for k, v in result["settings"].items()})
        trained = trained_points(table2, rows, model)
        cal = calibrate(result["rows"], trained, settings)
        advice = advise(result["rows"], tolerance, cal)
        by_cut = {(t.num_key_value_layers, t.key_value_group_size): t for t in trained}
        for r in advice["rows"]:
            t = by_cut.get((r["num_key_value_layers"], r["key_value_group_size"]))
            cand_rows.append({"model": model, **r, "trained": None if t is None else t.label,
                              "trained_kl": math.nan if t is None else t.kl,
                              "trained_kl_lo": math.nan if t is None else t.kl_lo,
                              "trained_kl_hi": math.nan if t is None else t.kl_hi,
                              "recommended": r["candidate"] == advice["recommended"]})
        for predictor in ("untrained_kl", "simscore"):
            rho, lo, hi = cal.rho.get(predictor, (math.nan,) * 3)
            cal_rows.append({"model": model, "predictor": predictor, "trained_points": cal.n,
                             "distinct_l": cal.distinct_l, "spearman": rho, "spearman_lo": lo, "spearman_hi": hi,
                             "slope": cal.slope if predictor == "untrained_kl" else math.nan,
                             "intercept": cal.intercept if predictor == "untrained_kl" else math.nan,
                             "residual_sd": cal.residual_sd if predictor == "untrained_kl" else math.nan,
                             "tolerance": tolerance, "recommended": advice["recommended"] or "",
                             "trust": advice["trust"]})
    return pd.DataFrame(cand_rows), pd.DataFrame(cal_rows)


def _sign(rho: float) -> str:
    """What the SimScore correlation's sign says against the paper's argument (a lower SimScore, a larger loss:
    negative)."""
    if pd.isna(rho) or rho == 0:
        return ""
    return (" (negative, as the paper's argument predicts)" if rho < 0
            else " (positive, where the paper's argument — a lower SimScore, a larger loss — predicts negative)")


def advisor_figure(candidates: pd.DataFrame, calibration: pd.DataFrame):
    """Per model: (left) untrained KL against prefill FLOPs saved, the Pareto front joined, trained students'
    KL beside their cut, the recommended cut ringed; (right) the calibration: trained KL against untrained KL (and
    SimScore), with the fitted line and Spearman's interval."""
    import matplotlib.pyplot as plt
    import numpy as np

    models = list(dict.fromkeys(candidates.model))
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 4.6 * len(models)), squeeze=False)
    for (left, right), model in zip(axes, models):
        g = candidates[candidates.model == model].sort_values("prefill_saved")
        x = 100 * g.prefill_saved
        err = [g.untrained_kl - g.untrained_kl_lo, g.untrained_kl_hi - g.untrained_kl]
        left.errorbar(x, g.untrained_kl, yerr=err, fmt="o", color="tab:blue", ms=5, capsize=3,
                      label="untrained student (reference init)")
        front = g[g.pareto]
        left.plot(100 * front.prefill_saved, front.untrained_kl, "-", color="tab:blue", lw=1, alpha=0.6,
                  label="Pareto front (saved FLOPs vs untrained KL)")
        for r in g.itertuples():
            left.annotate(r.candidate, (100 * r.prefill_saved, r.untrained_kl), textcoords="offset points",
                          xytext=(5, 4), fontsize=7)
        t = g[g.trained_kl.notna()]
        if len(t):
            left.errorbar(100 * t.prefill_saved, t.trained_kl, yerr=[t.trained_kl - t.trained_kl_lo,
                                                                      t.trained_kl_hi - t.trained_kl],
                          fmt="s", color="tab:orange", ms=5, capsize=3, label="trained (Table 2 rows)")
        pred = g[g.prediction_basis != "trained"]
        if len(pred):
            left.scatter(100 * pred.prefill_saved, pred.predicted_trained_kl, marker="s", s=30, facecolors="none",
                         edgecolors="tab:orange", label="trained KL predicted from the untrained KL")
        rec = g[g.recommended]
        cal = calibration[(calibration.model == model) & (calibration.predictor == "untrained_kl")].iloc[0]
        if len(rec):
            left.scatter(100 * rec.prefill_saved, rec.predicted_trained_kl, s=220, facecolors="none", edgecolors="k",
                         label=f"advice: {rec.candidate.iloc[0]} (the most saved within the tolerance)")
        left.axhline(cal.tolerance, color="grey", ls=":", lw=1, label=f"tolerance on trained KL ({cal.tolerance:g})")
        left.set_yscale("log")
        left.set_xlabel(f"prefill FLOPs saved (%, {int(g.num_layers.iloc[0])} layers)")
        left.set_ylabel("held-out KL(teacher || student), nats/token")
        left.set_title(f"{model}: where to cut", fontsize=10)
        left.legend(fontsize=7, loc="lower right")
        left.grid(alpha=0.3)
        if len(t) == 0:
            right.text(0.5, 0.5, "no trained rows of this model: uncalibrated", ha="center", va="center",
                       transform=right.transAxes)
            right.set_axis_off()
            continue
        right.errorbar(t.untrained_kl, t.trained_kl, yerr=[t.trained_kl - t.trained_kl_lo,
                                                           t.trained_kl_hi - t.trained_kl],
                       xerr=[t.untrained_kl - t.untrained_kl_lo, t.untrained_kl_hi - t.untrained_kl],
                       fmt="s", color="tab:orange", ms=5, capsize=3)
        for r in t.itertuples():
            right.annotate(r.trained, (r.untrained_kl, r.trained_kl), textcoords="offset points", xytext=(5, -10),
                           fontsize=7)
        if not math.isnan(cal.slope):
            xs = np.geomspace(g.untrained_kl.min(), g.untrained_kl.max(), 50)
            a, b = math.exp(cal.intercept), cal.slope
            right.plot(xs, a * xs ** b, "--", color="grey", lw=1, label=f"fit: trained KL = {a:.3g} x^{b:.2f}")
        lines = []
        for pred, name in (("untrained_kl", "untrained KL"), ("simscore", "SimScore")):
            c = calibration[(calibration.model == model) & (calibration.predictor == pred)].iloc[0]
            lines.append(f"Spearman({name}, trained KL) = {c.spearman:.2f} [{c.spearman_lo:.2f}, {c.spearman_hi:.2f}]"
                         f", {int(c.trained_points)} rows, {int(c.distinct_l)} distinct l")
        right.set_title("calibration on the trained rows\n" + "\n".join(lines), fontsize=8)
        right.set_xscale("log")
        right.set_yscale("log")
        right.set_xlabel("untrained KL (advisor)")
        right.set_ylabel("trained KL (Table 2)")
        right.grid(alpha=0.3, which="both")
        if not math.isnan(cal.slope):
            right.legend(fontsize=7)
    fig.tight_layout()
    return fig


def advisor_markdown(candidates: pd.DataFrame, calibration: pd.DataFrame) -> str:
    """The README's advisor table and calibration, per model (generated from the two CSVs, never typed)."""
    out = []
    for model, g in candidates.groupby("model", sort=False):
        lines = ["| cut | skipped | SimScore | untrained KL [95% CI] | untrained top-1 | prefill saved | KV saved "
                 "| trained KL (Table 2) | the advice reads |", "|---|---|---|---|---|---|---|---|---|"]
        for r in g.itertuples():
            trained = "" if pd.isna(r.trained_kl) else f"{r.trained_kl:.3f}"
            mark = " **(advice)**" if r.recommended else (" (Pareto)" if r.pareto else "")
            lines.append(f"| {r.candidate}{mark} | {r.skipped:.1%} | {r.simscore:.3f} | {r.untrained_kl:.3f} "
                         f"[{r.untrained_kl_lo:.3f}, {r.untrained_kl_hi:.3f}] | {r.untrained_top1:.3f} | "
                         f"{r.prefill_saved:.1%} | {r.kv_saved:.1%} | {trained} | {r.predicted_trained_kl:.3f} "
                         f"({r.prediction_basis}) |")
        cal = calibration[calibration.model == model].set_index("predictor")
        u, s = cal.loc["untrained_kl"], cal.loc["simscore"]
        pick = u.recommended or "no candidate"
        out.append(f"**{model}**\n\n" + "\n".join(lines) + "\n\n"
                   f"Calibration on {int(u.trained_points)} trained rows ({int(u.distinct_l)} distinct l): Spearman "
                   f"(untrained KL, trained KL) {u.spearman:.2f} [{u.spearman_lo:.2f}, {u.spearman_hi:.2f}]; "
                   f"Spearman (SimScore, trained KL) {s.spearman:.2f} [{s.spearman_lo:.2f}, {s.spearman_hi:.2f}]"
                   f"{_sign(s.spearman)}. "
                   f"Advice at a tolerance of {u.tolerance:g} nats/token: {pick}; {u.trust}.")
    return "\n\n".join(out)
