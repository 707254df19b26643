"""The README's measured numbers, generated from the committed results instead of typed.

Each block sits between two markers in README.md::

    <!-- generated: NAME (python -m analysis.readme README.md); do not edit -->
    ...
    <!-- end: NAME -->

``python -m analysis.readme README.md`` rewrites every block from ``reports/`` (``--check``: only say which blocks are
stale); tests/test_readme_blocks.py fails when a block differs from what the committed files give.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd


def _markers(name: str) -> tuple[str, str]:
    return (f"<!-- generated: {name} (python -m analysis.readme README.md); do not edit -->", f"<!-- end: {name} -->")


def replace_block(text: str, name: str, md: str) -> str:
    """``text`` with block ``name``'s contents replaced by ``md`` (ValueError: its markers are not there once each,
    in order)."""
    start, end = _markers(name)
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"the README must hold block {name!r}'s markers once each, in order: {start} … {end}")
    head, rest = text.split(start)
    return f"{head}{start}\n{md}\n{end}{rest.split(end, 1)[1]}"


def forward_time_markdown(df: pd.DataFrame) -> str:
    """Per model and prompt length: base's median prefill time and, per SwiftKV cut, its median time, the measured
    speedup (the median over repeats of the same repeat's base / SwiftKV ratio) and the FLOPs-predicted one.
    ``df``: ``analysis.io.read_prefill_time`` rows (with the benchmark's ``paired_speedup_median``)."""
    cuts = sorted({(int(r.num_key_value_layers), int(r.num_hidden_layers)) for r in df.itertuples()
                   if r.variant != "base"}, reverse=True)
    head = "| model | prompt tokens | base | " + " | ".join(f"l = {l} of {L}" for l, L in cuts) + " |"
    lines = [head, "|---|---:|---:|" + "---:|" * len(cuts)]
    for (model, tokens), g in df.groupby(["model", "prefill_tokens"], sort=False):
        by = {int(r.num_key_value_layers): r for r in g.itertuples()}
        base = g[g.variant == "base"].iloc[0]
        cells = []
        for l, _ in cuts:
            r = by.get(l)
            cells.append("–" if r is None else f"{r.median_s:.3g} s, {r.paired_speedup_median:.2f}x "
                         f"(FLOPs {1 / r.predicted_ratio:.2f}x)")
        lines.append(f"| {model} | {int(tokens)} | {base.median_s:.3g} s | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def simscore_markdown(crossings: pd.DataFrame) -> str:
    """Per model: the first layer from which each SimScore metric stays >= 0.5 (0-based, as the figure's x axis;
    the paper counts from 1) and its value at half depth with the 95% interval."""
    metrics = list(dict.fromkeys(crossings.metric))
    lines = ["| model | layers | " + " | ".join(f"{m}: stays >= 0.5 from layer | {m} at L/2" for m in metrics) + " |",
             "|---|---:|" + "---:|---:|" * len(metrics)]
    for model, g in crossings.groupby("model", sort=False):
        by = g.set_index("metric")
        cells = []
        for m in metrics:
            r = by.loc[m]
            first = "never" if pd.isna(r.crossing_layer) else f"{int(r.crossing_layer)}"
            cells += [first, f"{r.simscore_at_half:.3f} [{r.ci_low_at_half:.3f}, {r.ci_high_at_half:.3f}]"]
        lines.append(f"| {model} | {int(g.num_layers.iloc[0])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def distill_curve_markdown(runs: dict[str, pd.DataFrame]) -> str:
    """Per run (label -> ``analysis.distill.read_train_log``): held-out KL and top-1 agreement at its first, middle
    and last evaluation, with the tokens trained by then."""
    lines = ["| run | tokens | held-out KL | top-1 agreement |", "|---|---:|---:|---:|"]
    for label, log in runs.items():
        ev = log[log.event == "eval"].reset_index(drop=True)
        for i in dict.fromkeys([0, len(ev) // 2, len(ev) - 1]):
            r = ev.iloc[i]
            lines.append(f"| {label} | {int(r.tokens):,} | {r.heldout_kl:.3f} | {r.heldout_top1:.3f} |")
    return "\n".join(lines)


def _distill_curve(reports: Path) -> str:
    from analysis.distill import read_train_log
    from analysis.raw import MANIFEST, raw_path

    root = reports / "raw" / "distill_curve"
    runs = sorted({str(Path(m["source"]).parent) for m in json.loads((root / MANIFEST).read_text())["files"].values()})
    # the curve run (frequent evaluations, the longer budget) and the table's run of the same variant
    return distill_curve_markdown({("curve run" if "distill_curve" in run else "table run") + f" ({Path(run).name})":
                                   read_train_log(raw_path(root, run)) for run in runs})


def _forward_time(reports: Path) -> str:
    from analysis.io import read_prefill_time
    from analysis.raw import MANIFEST, raw_path

    root = reports / "raw" / "forward_time"
    sources = [meta["source"] for meta in json.loads((root / MANIFEST).read_text())["files"].values()]
    return forward_time_markdown(read_prefill_time([raw_path(root, s) for s in sources]))


def _serving(reports: Path) -> str:
    from analysis.serving import committed_summary

    return committed_summary(reports)


def _long_context(reports: Path) -> str:
    from analysis.longctx import long_context_markdown

    return long_context_markdown(pd.read_csv(reports / "table_long_context.csv"))


def _simscore(reports: Path) -> str:
    return simscore_markdown(pd.read_csv(reports / "simscore_crossings.csv"))


def _table2(reports: Path) -> str:
    from analysis.accuracy import summary_markdown

    seeds = reports / "seeds.csv"
    return summary_markdown(pd.read_csv(reports / "table2.csv"), pd.read_csv(seeds) if seeds.is_file() else None)


def _advisor(reports: Path) -> str:
    from analysis.advisor import advisor_markdown

    return advisor_markdown(*(pd.read_csv(reports / n) for n in ("table_advisor.csv", "table_advisor_calibration.csv")))


def _seeds(reports: Path) -> str:
    from analysis.seeds import seeds_markdown

    sheet = pd.read_csv(Path(__file__).resolve().parents[1] / "config" / "variants.tsv", sep="\t",
                        keep_default_na=False)
    frame = pd.read_csv(reports / "seeds.csv")
    rows = sheet[sheet.model == frame.model.iloc[0]]
    labels = dict(zip(rows.variant, rows.label))
    return seeds_markdown(frame, labels)


def _claim_counts(reports: Path) -> str:
    from analysis.claims import counts_text

    return counts_text(pd.read_csv(reports / "claims.csv"))


def _disagreements(reports: Path) -> str:
    from analysis import disagreements
    from analysis.claims import load_registry

    claims = pd.read_csv(reports / "claims.csv")
    return (disagreements.markdown(disagreements.rows(claims, load_registry(), reports)) + "\n"
            + disagreements.registration_summary(claims) + "\n")


# block name -> its markdown from a reports directory
BLOCKS: dict[str, Callable[[Path], str]] = {
    "disagreements": _disagreements,
    "table2": _table2,
    "claim-counts": _claim_counts,
    "seeds": _seeds,
    "advisor": _advisor,
    "simscore": _simscore,
    "forward-time": _forward_time,
    "serving": _serving,
    "long-context": _long_context,
    "distill-curve": _distill_curve,
}


def regenerate(text: str, reports: str | Path = "reports") -> str:
    """``text`` (the README) with every block regenerated from ``reports``."""
    for name, make in BLOCKS.items():
        text = replace_block(text, name, make(Path(reports)))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.readme",
                                     description="Regenerate the README's measured-number blocks (" +
                                     ", ".join(BLOCKS) + ") from the committed reports/ and its raw folders.")
    parser.add_argument("readme", help="the README to rewrite in place (between its block markers only)")
    parser.add_argument("--reports", default="reports", help="the reports directory to read (default: reports)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    args = parser.parse_args(argv)
    path = Path(args.readme)
    try:
        text = path.read_text()
        new = regenerate(text, args.reports)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"{path}: generated blocks are stale; run python -m analysis.readme {path}", file=sys.stderr)
            return 1
        return 0
    if new != text:
        path.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
