"""Adapter for rule render_report: claims, artifacts and provenance into one self-contained HTML page."""

import logging
from pathlib import Path

import pandas as pd

from analysis import disagreements
from analysis.claims import load_registry
from analysis.io import read_prefill_time
from analysis.raw import raw_path
from analysis.report import Section, fill_caption, render_html, seed_summary
from analysis.serving import load_raw
from analysis.verdicts import claims
from swiftkv.bench.provenance import provenance
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
inp, params = snakemake.input, snakemake.params  # noqa: F821
paths = {name: inp[name] for name in inp.keys()  # noqa: SIM118 (snakemake's Namedlist)
         if isinstance(inp[name], str)
         and name not in ("registry", "vllm_env", "captions", "serve", "latency", "forward_time", "seeds_raw")}
prefill = read_prefill_time([raw_path(inp.forward_time, s) for s in params.prefill_sources]) \
    if params.prefill_sources else None
serve = load_raw(inp.serve[0], params.serve_sources) if params.serve_sources else None
latency = load_raw(inp.latency[0], params.latency_sources) if params.latency_sources else None
items = claims(paths, prefill, serve, latency)
seeds = pd.read_csv(paths["seeds"]) if "seeds" in paths else None  # one-run tables show the seed means beside them
sections = [Section(title, path, caption=fill_caption(Path(caption).read_text(), path) if caption else "",
                    markdown=path[: -len(".csv")] + ".md" if path.endswith(".csv") else None, summary=seed_summary(path, seeds))
            for title, path, caption in params.sections]
extra = {"vLLM (CPU build, own venv)": Path(inp.vllm_env[0]).read_text().strip()} if inp.vllm_env else {}
prov = provenance(params.profile, params.config_hash, extra=extra)
note = ("CI profile: tiny samples and sizes that test the pipeline end to end; its numbers and verdicts say nothing "
        "about the paper." if params.ci else "")
registry = pd.read_csv(inp.registry)
reports = Path(snakemake.output[0]).parent  # noqa: F821
disagree = disagreements.html_table(disagreements.rows(registry, load_registry(), reports))
write_text(snakemake.output[0], render_html(params.title, items, sections, prov, note, registry=registry,  # noqa: F821
                                            disagreements=disagree,
                                            registration=disagreements.registration_summary(registry)))
for c in items:
    logging.info("%s: %s (%s)", c.verdict, c.claim, c.measured)
