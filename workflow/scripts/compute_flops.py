"""Adapter for rule compute_flops: the Table 1 settings and the KV-memory rows of one model, from its config."""

import logging

from swiftkv.io import write_json
from swiftkv.measure.flops import model_summary

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821

summary = model_summary(
    snakemake.input[0],  # noqa: F821  (a config.json, or a prepared model directory holding one)
    model=snakemake.wildcards.model,  # noqa: F821
    settings=snakemake.params.settings,  # noqa: F821
    context_length=snakemake.params.context_length,  # noqa: F821
    kv_skip=snakemake.params.kv_skip,  # noqa: F821
)
write_json(snakemake.output[0], summary)  # noqa: F821
logging.info("%s: %d Table 1 rows, %d KV-memory rows", summary["model"], len(summary["table1"]), len(summary["kv_memory"]))
