"""Adapter for rules select_bigbench_tasks and select_extended_tasks: the base model's selection-split results -> the
reported task list; with a ``fixed`` input (the extended suite, analysis/claims.yaml extended_suite), that suite's own
choice kept as it is and the rule's choice among the new candidates added to it."""
import json
import logging

from analysis.selection import extend_tasks, select_tasks
from analysis.stats import BootstrapSettings
from swiftkv.io import write_json

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
cfg, boot = snakemake.params.cfg, snakemake.params.bootstrap  # noqa: F821
with open(snakemake.input.result) as f:  # noqa: F821
    result = json.load(f)
with open(f"{snakemake.input.bigbench}/manifest.json") as f:  # noqa: F821
    manifest = json.load(f)
chosen = select_tasks(
    result,
    manifest,
    metrics=tuple(cfg["metrics"]),
    max_tasks=cfg.get("max_tasks"),
    min_tasks=cfg.get("min_tasks", 1),
    settings=BootstrapSettings(boot["resamples"], boot["confidence"], boot["seed"]),
)
fixed_path = getattr(snakemake.input, "fixed", None)  # noqa: F821
if fixed_path:
    with open(fixed_path) as f:
        fixed = json.load(f)
    chosen = extend_tasks(fixed, chosen, [f"{snakemake.input.suite}/report", manifest["splits"]["report"]])  # noqa: F821
    logging.info("kept the suite's %s", [t["source"] for t in fixed["tasks"]])
else:
    chosen["include_path"] = manifest["splits"]["report"]
write_json(snakemake.output[0], chosen)  # noqa: F821
logging.info("chose %s", [t["source"] for t in chosen["tasks"]])
