"""Adapter for rule select_bigbench_tasks: the base model's selection-split results -> the reported task list."""
import json
import logging

from analysis.selection import select_tasks
from analysis.stats import BootstrapSettings
from swiftkv.io import write_json

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)
cfg, boot = snakemake.params.cfg, snakemake.params.bootstrap
with open(snakemake.input.result) as f:
    result = json.load(f)
with open(f"{snakemake.input.bigbench}/manifest.json") as f:
    manifest = json.load(f)
chosen = select_tasks(
    result,
    manifest,
    metrics=tuple(cfg["metrics"]),
    max_tasks=cfg.get("max_tasks"),
    min_tasks=cfg.get("min_tasks", 1),
    settings=BootstrapSettings(boot["resamples"], boot["confidence"], boot["seed"]),
)
chosen["include_path"] = manifest["splits"]["report"]
write_json(snakemake.output[0], chosen)
logging.info("chose %s", [t["source"] for t in chosen["tasks"]])
