"""Adapter for rule render_report: the registered claims, every artifact and provenance into one self-contained HTML
page. Everything on the page comes from the root's files (its provenance.json is the run's record of where, when and
on what), so that the committed page re-renders byte-identically from the committed files."""

import logging
from pathlib import Path

import pandas as pd

from analysis import disagreements
from analysis.claims import load_registry
from analysis.io import read_json
from analysis.raw_summary import summary, summary_line
from analysis.report import Section, fill_caption, render_html, seed_summary
from swiftkv.io import write_text

RECORDS = ("artifacts (last written, UTC)",)  # of provenance.json: when files were written, not where they came from
logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
inp, params, root = snakemake.input, snakemake.params, snakemake.wildcards.root  # noqa: F821
seeds = pd.read_csv(inp.seeds) if "seeds" in inp.keys() else None  # noqa: SIM118 (one-run tables: the seed means)
sections = [Section(title, path, caption=fill_caption(Path(caption).read_text(), path) if caption else "",
                    markdown=path[: -len(".csv")] + ".md" if path.endswith(".csv") else None,
                    summary=seed_summary(path, seeds))
            for title, path, caption in params.sections]
prov = {k: v for k, v in read_json(inp.provenance).items() if k not in RECORDS and not k.startswith("raw results")}
# each raw folder as its manifest says, with the mark of one collected from a tree with uncommitted changes
raw = summary(root)
prov[f"raw results ({root}/raw/<study>)"] = {study: summary_line(entry) for study, entry in raw.items()}
marked = [f"`{root}/raw/{study}`" for study, entry in raw.items() if "uncommitted changes" in entry]
note = " ".join(filter(None, [
    "CI profile: tiny samples and sizes that test the pipeline end to end; its numbers and verdicts say nothing "
    "about the paper." if params.ci else "",
    f"Marked evidence: {', '.join(marked)} {'was' if len(marked) == 1 else 'were'} collected from a tree with "
    f"uncommitted changes, so the code that computed {'it' if len(marked) == 1 else 'them'} is not exactly any commit "
    "(provenance table at the end)."
    if marked else ""]))
registry = pd.read_csv(inp.registry)
items = disagreements.rows(registry, load_registry(), root)
write_text(snakemake.output[0], render_html(params.title, sections, prov, registry, note,  # noqa: F821
                                            disagreements.html_table(items), disagreements.registration_summary(registry)))
logging.info("%d claims, %d where the reproduction disagrees", len(registry), len(items))
