"""Adapter for rule collect_distill: one summary row per distilled checkpoint."""

import logging
import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821
logging.basicConfig(stream=sys.stderr, level=logging.INFO)

from analysis.distill import summarize_runs  # noqa: E402
from swiftkv.io import atomic_path  # noqa: E402

table = summarize_runs(list(snakemake.input))  # noqa: F821
with atomic_path(snakemake.output[0]) as tmp:  # noqa: F821
    table.to_csv(tmp, index=False)
print(table.to_string(index=False), file=sys.stderr)
