"""Adapter for rule render_report: the registered claims, every artifact and provenance into one self-contained HTML
page."""

import logging
from pathlib import Path

import pandas as pd

from analysis import disagreements
from analysis.claims import load_registry
from analysis.report import Section, fill_caption, render_html, seed_summary
from swiftkv.bench.provenance import provenance
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
inp, params = snakemake.input, snakemake.params  # noqa: F821
seeds = pd.read_csv(inp.seeds) if "seeds" in inp.keys() else None  # noqa: SIM118 (one-run tables: the seed means)
sections = [Section(title, path, caption=fill_caption(Path(caption).read_text(), path) if caption else "",
                    markdown=path[: -len(".csv")] + ".md" if path.endswith(".csv") else None, summary=seed_summary(path, seeds))
            for title, path, caption in params.sections]
extra = {"vLLM (CPU build, own venv)": Path(inp.vllm_env[0]).read_text().strip()} if inp.vllm_env else {}
prov = provenance(params.profile, params.config_hash, extra=extra)
note = ("CI profile: tiny samples and sizes that test the pipeline end to end; its numbers and verdicts say nothing "
        "about the paper." if params.ci else "")
registry = pd.read_csv(inp.registry)
reports = Path(snakemake.output[0]).parent  # noqa: F821
items = disagreements.rows(registry, load_registry(), reports)
write_text(snakemake.output[0], render_html(params.title, sections, prov, registry, note,  # noqa: F821
                                            disagreements.html_table(items), disagreements.registration_summary(registry)))
logging.info("%d claims, %d where the reproduction disagrees", len(registry), len(items))
