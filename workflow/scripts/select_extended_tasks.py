"""Adapter for rule select_extended_tasks: the suite's own choice (kept as it is) plus the new candidates the suite
rule keeps on the base model's selection run (analysis/claims.yaml, extended_suite)."""
import json
import logging

from analysis.selection import extend_tasks, select_tasks
from analysis.stats import BootstrapSettings
from swiftkv.io import write_json

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)
cfg, boot = snakemake.params.cfg, snakemake.params.bootstrap
with open(snakemake.input.result) as f:
    result = json.load(f)
with open(f"{snakemake.input.bigbench}/manifest.json") as f:
    manifest = json.load(f)
with open(snakemake.input.fixed) as f:
    fixed = json.load(f)
chosen = select_tasks(result, manifest, metrics=tuple(cfg["metrics"]), max_tasks=None, min_tasks=0,  # no fill-up: only tasks above chance
                      settings=BootstrapSettings(boot["resamples"], boot["confidence"], boot["seed"]))
extended = extend_tasks(fixed, chosen, [f"{snakemake.input.suite}/report", manifest["splits"]["report"]])
write_json(snakemake.output[0], extended)
logging.info("fixed %s; chose %s", [t["source"] for t in fixed["tasks"]], [t["source"] for t in chosen["tasks"]])
