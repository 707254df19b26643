"""Where the reproduction disagrees with the paper: every registered claim that does not hold here or cannot be
told, the paper's numbers beside ours, and the differences of setting that may explain it — with the numbers of that
setting read from the committed evidence (training tokens from the students' own summaries, the report suite's size
and resolution from Table 2, the seeds, the hardware of the timings) and the paper's from ``analysis/paper/recipe.csv``.

A claim names its likely reasons in the registry (``context:`` keys of ``FACTORS``); the sentences say what differs,
never that it is the cause.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from analysis.claims import RegisteredClaim
from analysis.paper import paper_table
from analysis.rules import HOLDS


def setting(reports: str | Path) -> dict:
    """The numbers of this reproduction's setting that the reasons quote, read from ``reports`` (missing: absent)."""
    reports, out = Path(reports), {}
    # the tables' students, as the seeds study committed their summaries (the budget-scaling study trains more)
    tokens = {json.loads(p.read_text()).get("train_tokens") for p in (reports / "raw" / "seeds").rglob("distill.json")}
    tokens.discard(None)
    if tokens:
        out["train_tokens"] = sorted(tokens)
    table2 = reports / "table2.csv"
    if table2.is_file():
        df = pd.read_csv(table2)
        base = df[df.variant == "base"].iloc[0]
        counts = [c for c in df.columns if c.endswith("_n") and not c.startswith(("bpb", "fidelity"))]
        out["examples"] = int(sum(base[c] for c in counts))
        out["tasks"] = len(counts)
        out["mdd"] = float(df["delta_base_mdd"].max())
        out["model"] = str(base["model"])
    seeds = reports / "seeds.csv"
    if seeds.is_file():
        out["seeds"] = int(pd.read_csv(seeds).query("seed == 'all'").n_seeds.max())
    for path in sorted((reports / "raw" / "forward_time").rglob("*.json*")):
        if path.name == "manifest.json":
            continue
        from analysis.io import read_json

        data = read_json(path.with_suffix("") if path.suffix == ".gz" else path)
        hw = data.get("hardware", {})
        out["hardware"] = f"{hw.get('cpu', 'a CPU')}, {hw.get('cpu_count', '?')} cores, {data.get('dtype', '')}"
        out["layers"] = data.get("num_hidden_layers")
        break
    recipe = paper_table("recipe")
    if recipe is not None:
        out["paper"] = dict(zip(recipe.quantity, recipe.value))
    return out


def _budget(s: dict) -> str:
    if "train_tokens" not in s or "paper" not in s:
        return ""
    ours, paper = max(s["train_tokens"]), float(s["paper"]["training_tokens"])
    epochs = int(float(s["paper"]["epochs"]))
    return (f"Training budget: each student here was distilled on {ours:,} tokens; the paper's on ~{paper / 1e6:,.0f}M "
            f"tokens for {epochs} epochs, {paper / ours:,.0f}x as many distinct tokens and {paper * epochs / ours:,.0f}x "
            "as many seen.")


def _model(s: dict) -> str:
    if "model" not in s:
        return ""
    layers = f" ({s['layers']} layers)" if s.get("layers") else ""
    paper = s.get("paper", {}).get("models", "the paper's Llama-3.1 models")
    return f"Model: {s['model']}{layers} here; {paper} in the paper."


def _suite(s: dict) -> str:
    if "examples" not in s:
        return ""
    return (f"Evaluation: {s['examples']:,} report examples over {s['tasks']} BIG-bench tasks, which cannot resolve a "
            f"difference from the base model under ~{s['mdd']:.1f} points (Table 2's largest minimum detectable "
            "difference); the paper's claims are about 1-2 points.")


def _seeds(s: dict) -> str:
    if "seeds" not in s:
        return ""
    return (f"Seeds: {s['seeds']} training seeds per compared row (the seed-level part of each interval uses t with "
            f"{s['seeds'] - 1} degrees of freedom).")


def _hardware(s: dict) -> str:
    if "hardware" not in s:
        return ""
    paper = s.get("paper", {}).get("hardware", "GPUs")
    return (f"Hardware: {s['hardware']} here; {paper} in the paper. The FLOPs prediction counts arithmetic only; at "
            "short prompts a small model's fixed costs per forward pass on a CPU (framework overhead, memory traffic) "
            "are a larger share of its time.")


def _serving(s: dict) -> str:
    hardware = s.get("hardware", "a CPU")
    return (f"Serving: transformers' generate() and vLLM's CPU build on {hardware}, with a "
            f"{s.get('model', 'small')} model; the paper served Llama-3.1 models with vLLM on "
            f"{s.get('paper', {}).get('hardware', 'GPUs')}.")


def _grid(s: dict) -> str:
    return "Design: the serving grid was trimmed to fit the machine's time; its amendments say which points went."


FACTORS = {"budget": _budget, "model": _model, "suite": _suite, "seeds": _seeds, "hardware": _hardware,
           "serving": _serving, "grid": _grid}


def _ours(r) -> str:
    if pd.isna(r.estimate):
        return "not measured"
    interval = "" if pd.isna(r.lo) else f" [{r.lo:.3g}, {r.hi:.3g}]"
    return f"{r.estimate:.3g}{interval} ({r.deciding_point})"


def rows(frame: pd.DataFrame, registry: list[RegisteredClaim], reports: str | Path) -> list[dict]:
    """One row per claim that does not hold or cannot be told, or whose extended-suite verdict differs from its first
    (``frame``: reports/claims.csv), failing claims first:
    the claim with the paper's numbers, ours at the deciding point, the verdict and status, and the reasons."""
    s = setting(reports)
    context = {c.id: c.extra.get("context", []) for c in registry}
    out = []
    for r in frame.itertuples():
        if r.verdict == HOLDS and not suites_disagree(r):
            continue
        why = [FACTORS[k](s) for k in context.get(r.id, []) if k in FACTORS]
        if r.id == "simscore-predicts-loss" and not pd.isna(r.estimate):
            why.insert(0, f"Sign: the measured rank correlation is {r.estimate:+.2f}, positive where the paper's "
                       "argument (a lower SimScore, a larger loss) predicts a negative one.")
        if isinstance(r.why, str) and r.why:
            why.append(f"Status: {r.why}.")
        out.append({"id": r.id, "claim": r.statement, "ours": _ours(r), "verdict": r.verdict, "status": r.status,
                    "measures": measures_text(r), "why": [w for w in why if w]})
    order = {"does not hold": 0, "measures disagree": 1, "cannot tell": 1}
    return sorted(out, key=lambda d: order.get(d["verdict"], 2))


def _accuracy_verdict(r) -> str:
    kl = getattr(r, "verdict_kl", "")
    return r.verdict_accuracy if isinstance(kl, str) and kl else r.verdict


def suites_disagree(r) -> bool:
    """A row of reports/claims.csv whose extended-suite verdict (analysis/claims.yaml, extended_suite) differs from
    its accuracy verdict on the power run's suite."""
    ext = getattr(r, "extended_verdict", "")
    return isinstance(ext, str) and bool(ext) and getattr(r, "extended_status", "") != "awaiting" \
        and ext != _accuracy_verdict(r)


def measures_text(r) -> str:
    """For a claim judged on co-primary measures (a row of reports/claims.csv with ``verdict_kl``): each measure's
    verdict, the held-out KL's with its deciding point; and where the extended suite has read the claim again, that
    verdict with its deciding point, beside (never replacing) the first; "" for any other claim."""
    parts = []
    kl = getattr(r, "verdict_kl", "")
    if isinstance(kl, str) and kl:
        where = ""
        if not pd.isna(r.kl_estimate):
            where = f" at {r.kl_estimate:.3g} [{r.kl_lo:.3g}, {r.kl_hi:.3g}] nats/token"
        parts.append(f"accuracy {r.verdict_accuracy}, held-out KL {kl}{where}")
    ext = getattr(r, "extended_verdict", "")
    if isinstance(ext, str) and ext:
        at = "" if pd.isna(r.extended_estimate) else \
            f" at {r.extended_estimate:.3g} [{r.extended_lo:.3g}, {r.extended_hi:.3g}]"
        differ = (f"; the suites disagree: {_accuracy_verdict(r)} on the power run's suite, {ext} on the extended one"
                  if suites_disagree(r) else "")
        parts.append(f"extended suite (MMLU + OLMES, over benchmarks): {ext} ({r.extended_status}){at}{differ}")
    return "; ".join(parts)


def markdown(items: list[dict]) -> str:
    lines = ["| claim (the paper's numbers) | here (deciding point, 95% interval) | verdict | what differs |",
             "|---|---|---|---|"]
    for d in items:
        measures = f"; {d['measures']}" if d.get("measures") else ""
        cells = [d["claim"], d["ours"], f"**{d['verdict']}** ({d['status']}{measures})", " ".join(d["why"])]
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def html_table(items: list[dict]) -> str:
    def row(d) -> str:
        cls = "v-fails" if d["verdict"] == "does not hold" else "v-unclear"
        why = "".join(f"<li>{html.escape(w)}</li>" for w in d["why"])
        return (f"<tr class='{cls}'><td><code>{html.escape(d['id'])}</code><br>{html.escape(d['claim'])}</td>"
                f"<td>{html.escape(d['ours'])}</td><td><b>{html.escape(d['verdict'])}</b><br>{html.escape(d['status'])}"
                + (f"<br><span class='cap'>{html.escape(d['measures'])}</span>" if d.get("measures") else "")
                + f"</td><td><ul>{why}</ul></td></tr>")

    return ("<table class='claims'><tr><th>claim (the paper's numbers)</th><th>here (deciding point, 95% interval)"
            "</th><th>verdict</th><th>what differs</th></tr>" + "".join(row(d) for d in items) + "</table>")


def registration_summary(frame: pd.DataFrame) -> str:
    """How the rules were written, from reports/claims.csv: when each group was registered and whether its data had
    been seen, and the amendments since (with how many were made with the outcome visible)."""
    parts = []
    for (date, commit), g in frame.groupby(["registered", "registered_commit"], sort=True):
        seen = g.data_seen.astype(str)
        before = int(seen.str.startswith("none").sum())
        after = len(g) - before
        what = []
        if after:
            what.append(f"{after} with data of theirs already measured")
        if before:
            what.append(f"{before} before any of their data existed")
        parts.append(f"{len(g)} on {date} ({commit}): {', '.join(what)}")
    n = int(frame.n_amendments.sum())
    visible = int(frame.amendments_outcome_visible.sum())
    return (f"How the rules were written: {len(frame)} registered claims — " + "; ".join(parts)
            + f". {n} amendments since, {visible} of them made with the outcome (partly) visible; each claim's row "
            "below lists what had been measured when its rule was written, and its amendments.")
