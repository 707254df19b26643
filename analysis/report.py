"""The report page: every table and figure of a run beside the paper's numbers, the verdicts, provenance.

``render_html(...)`` writes one self-contained HTML file (figures embedded as data URIs, tables inline, no external
requests); the verdicts it shows are the claims registry's (reports/claims.csv, ``analysis.claims``), opened by where
the reproduction disagrees with the paper (``analysis.disagreements``).
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.rules import FAILS, HOLDS

ABSENT = "not measured here"  # an artifact this profile does not build

# -- HTML ----------------------------------------------------------------------------------------------------------

CSS = """
body{font:15px/1.45 system-ui,sans-serif;max-width:1200px;margin:0 auto;padding:1em 2em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:12.5px;margin:.6em 0;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right;vertical-align:top}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
table.wide td{white-space:nowrap}table.wide td:first-child{white-space:normal;min-width:16em}
img{max-width:100%;border:1px solid #eee}.cap{color:#555;font-size:13px}
.v-holds{background:#e6f4e6}.v-fails{background:#fbe3e3}.v-unclear{background:#fff6d6}.v-absent{background:#eee}
table.claims td,table.claims th{text-align:left}.note{background:#fff6d6;padding:.5em 1em;border-left:4px solid #e0b000}nav a{margin-right:1em}code{background:#f4f4f4;padding:0 3px}
"""


def _verdict_class(verdict: str) -> str:
    if verdict.startswith(FAILS):
        return "v-fails"
    if verdict.startswith(HOLDS):
        return "v-holds"
    return "v-absent" if verdict == ABSENT else "v-unclear"


def registry_html(frame: pd.DataFrame) -> str:
    """The registered claims (reports/claims.csv): rule, deciding point, verdict over every point, status."""
    from analysis.disagreements import measures_text

    def row(r) -> str:
        verdict = "not measured yet" if r.status == "awaiting" else r.verdict
        cls = "v-absent" if r.status == "awaiting" else _verdict_class(r.verdict)
        est = "" if pd.isna(r.estimate) else (f"{r.estimate:.4g}" + ("" if pd.isna(r.lo) else
                                                                    f" [{r.lo:.4g}, {r.hi:.4g}]"))
        where = f"<br><span class='cap'>{html.escape(str(r.deciding_point))}</span>" if est else ""
        kl_points = getattr(r, "kl_points", "")
        kl_points = f"<br>held-out KL: {html.escape(kl_points)}" if isinstance(kl_points, str) and kl_points else ""
        points = (f"<details><summary>{int(r.n_points)} point(s)</summary>{html.escape(str(r.points))}{kl_points}"
                  "</details>" if r.n_points else "")
        why = html.escape(str(r.why)) if isinstance(r.why, str) else ""
        measures = measures_text(r)
        if measures:
            verdict_cell = f"<b>{html.escape(verdict)}</b><br><span class='cap'>{html.escape(measures)}</span>"
        else:
            verdict_cell = f"<b>{html.escape(verdict)}</b>"
        history = f"{html.escape(str(r.registered))} ({html.escape(str(r.registered_commit))})"
        history += f"<br><span class='cap'>data seen then: {html.escape(str(r.data_seen))}</span>"
        if r.n_amendments:
            items = "".join(f"<li>{html.escape(a)}</li>" for a in str(r.amendments).split(" | "))
            history += (f"<details><summary>{int(r.n_amendments)} amendment(s), {int(r.amendments_outcome_visible)} "
                        f"with the outcome visible</summary><ul>{items}</ul></details>")
        return (f"<tr class='{cls}'><td><code>{html.escape(r.id)}</code><br>{html.escape(r.statement)}</td>"
                f"<td>{html.escape(r.rule)}</td><td>{est}{where}{points}</td><td>{verdict_cell}</td>"
                f"<td>{html.escape(r.status)}<br><span class='cap'>{why}</span></td><td>{history}</td></tr>")

    return ("<table class='claims'><tr><th>claim (analysis/claims.yaml)</th><th>rule</th>"
            "<th>deciding point (95% interval)</th><th>verdict over every point</th><th>status</th>"
            "<th>registered (commit), and amended</th></tr>"
            + "".join(row(r) for r in frame.itertuples()) + "</table>")


def registry_summary(frame: pd.DataFrame) -> str:
    decided = frame[frame.status == "decided"].verdict.value_counts()
    provisional = frame[frame.status == "provisional"].verdict.value_counts()
    def part(counts: pd.Series) -> str:
        return ", ".join(f"{n} {v}" for v, n in counts.items()) or "none"

    return (f"{len(frame)} registered claims: {int((frame.status == 'decided').sum())} decided by this run "
            f"({part(decided)}); {int((frame.status == 'provisional').sum())} provisional, from single runs, until "
            f"their registered run ({part(provisional)}); {int((frame.status == 'awaiting').sum())} await their run.")


def _inline(text: str) -> str:
    text = html.escape(text.replace("``", "`"))
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


WIDE = 10  # a table with more columns scrolls sideways: its key columns go first and its cells stay on one line
SUMMARY_FIRST = ("average", "paper avg", "Δ vs base", "paper Δ", "Δ vs ref")


def _summary_first(cells: list[list[str]]) -> list[list[str]]:
    """An accuracy table with its summary columns first: the row label, our average beside the paper's, the deltas,
    then the other summary columns (fidelity, KV), then the per-task scores, so that a reader sees the comparison
    without scrolling past every task."""
    head = cells[0]
    if "average" not in head or head.index("average") <= 1:
        return cells
    k = head.index("average")
    order = [0] + [head.index(c) for c in SUMMARY_FIRST if c in head]
    order += [i for i in range(k, len(head)) if i not in order] + list(range(1, k))
    return [[row[i] for i in order] for row in cells]


def markdown_html(text: str) -> str:
    """The Markdown our table writers emit (pipe tables, bold, code, paragraphs, '-' lists) as HTML."""
    out, table, items = [], [], []

    def flush():
        if table:
            cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table
                     if not re.fullmatch(r"\|?[\s:|-]+\|?", line.strip())]
            head, *body = _summary_first(cells)
            out.append(f"<table{' class=wide' if len(head) > WIDE else ''}><tr>"
                       + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
                       + "</table>")
            table.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for line in text.splitlines():
        if line.strip().startswith("|"):
            table.append(line)
            continue
        if line.strip().startswith("- "):
            items.append(line.strip()[2:])
            continue
        flush()
        if line.strip():
            out.append(f"<p>{_inline(line.strip())}</p>")
    flush()
    return "\n".join(out)


# Columns a page reader does not need twice: `source` already names engine, hardware and model; `label` names the
# variant. The CSV keeps them all (the page says so).
REDUNDANT_COLUMNS = {"source": ("engine", "hardware", "model"), "label": ("variant",)}


def display_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The columns of a results CSV worth showing on the page: without ones another column already spells out and
    without ones empty in every row."""
    drop = [c for key, cols in REDUNDANT_COLUMNS.items() if key in df.columns for c in cols if c in df.columns]
    drop += [c for c in df.columns if df[c].isna().all()]
    return df.drop(columns=list(dict.fromkeys(drop)))


RESULT_FIRST = ("label", "speedup", "predicted_speedup", "throughput_tok_s")  # serving tables' result columns


def _number(v: float) -> str:
    """Four significant digits, but whole numbers from 10,000 up (throughputs, bytes) without an exponent."""
    return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"


def csv_html(path, max_rows: int = 200) -> str:
    df = pd.read_csv(path)
    shown = display_frame(df)
    wide = shown.shape[1] > WIDE
    if wide:  # the result before the workload details, so that it shows without scrolling
        lead = [c for c in (shown.columns[0], *RESULT_FIRST) if c in shown.columns]
        shown = shown[list(dict.fromkeys(lead + list(shown.columns)))]
    table = shown.head(max_rows).to_html(index=False, na_rep="", float_format=_number, border=0,
                                         classes="wide" if wide else None)
    hidden = [c for c in df.columns if c not in shown.columns]
    if hidden:
        table += f"<p class='cap'>not shown (in the CSV): {html.escape(', '.join(hidden))}</p>"
    return table


def fill_caption(text: str, path: str) -> str:
    """A snakemake --report caption as plain text for the page: its `{{ snakemake.wildcards.table }}` placeholder (the
    one the table captions use) becomes the artifact's name."""
    return re.sub(r"\{\{\s*snakemake\.wildcards\.\w+\s*\}\}", Path(path).stem, text)


def image_html(path, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'>"


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


@dataclass
class Section:
    """One artifact: a figure (PNG), a table (Markdown preferred, else CSV) with its caption."""

    title: str
    path: str
    caption: str = ""
    markdown: str | None = None
    summary: str = ""  # Markdown shown above the table (an accuracy table's one-run rows beside the seed means)

    def html(self) -> str:
        body = f"<h2 id='{_anchor(self.title)}'>{html.escape(self.title)}</h2>"
        if self.caption:
            body += f"<p class='cap'>{_inline(self.caption)}</p>"
        if self.summary:
            body += markdown_html(self.summary)
        if not Path(self.path).is_file():
            return body + f"<p><b>{ABSENT}</b>: <code>{html.escape(self.path)}</code> is not built in this profile.</p>"
        if self.path.endswith(".png"):
            body += image_html(self.path, self.title)
        elif self.markdown and Path(self.markdown).is_file():
            body += markdown_html(Path(self.markdown).read_text())
        else:
            body += csv_html(self.path)
        return body + f"<p class='cap'>source: <code>{html.escape(self.path)}</code></p>"


SEEDED_TABLES = ("table2", "table4a", "table4b", "tableB2")  # accuracy tables whose rows the seeds study repeats


def seed_summary(path: str, seeds: pd.DataFrame | None) -> str:
    """Above a one-run accuracy table: its rows' Δ vs base beside the seeds study's mean (empty where it has none)."""
    from analysis.accuracy import summary_markdown

    if seeds is None or Path(path).stem not in SEEDED_TABLES or not Path(path).is_file():
        return ""
    return summary_markdown(pd.read_csv(path), seeds)


def provenance_html(prov: dict) -> str:
    def cell(v) -> str:
        if isinstance(v, dict):  # nested (artifact dates, job times): one line per entry
            return "<br>".join(f"{html.escape(str(k))}: {html.escape(str(x))}" for k, x in v.items())
        return html.escape(str(v))

    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{cell(v)}</td></tr>" for k, v in prov.items())
    return f"<table class='claims'>{rows}</table>"


def render_html(title: str, sections: list[Section], provenance: dict, registry: pd.DataFrame, note: str = "",
                disagreements: str = "", registration: str = "") -> str:
    """The page. ``registry``: reports/claims.csv; ``disagreements``: the HTML of the section that opens the page
    (analysis.disagreements); ``registration``: how the rules were written (said under the title)."""
    nav = " ".join(f"<a href='#{_anchor(s.title)}'>{html.escape(s.title)}</a>" for s in sections)
    first = (f"<h2 id='disagreements'>Where the reproduction disagrees with the paper</h2>{disagreements}"
             if disagreements else "")
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p>{registry_summary(registry)} Every number below is produced by the pipeline; the paper's numbers are "
            "kept as data in <code>analysis/paper/</code>.</p>"
            + (f"<p>{html.escape(registration)}</p>" if registration else "")
            + (f"<p class='note'>{_inline(note)}</p>" if note else "")
            + f"<nav>{nav}</nav>"
            + first
            + f"<h2 id='claims'>Every claim, by its registered rule</h2>{registry_html(registry)}"
            + "".join(s.html() for s in sections)
            + f"<h2 id='provenance'>Provenance</h2>{provenance_html(provenance)}</body></html>")
