"""Adapter for rule make_lr_sweep: the sweep's training summaries (as committed in reports/raw/lr_sweep) ->
reports/lr_sweep.csv (held-out KL per lr)."""
import logging

from analysis.distill import lr_sweep_table
from analysis.raw import raw_path
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
runs = [raw_path(snakemake.input.raw, run) for run in snakemake.params.runs]  # noqa: F821
table = lr_sweep_table(runs, snakemake.params.configured)  # noqa: F821
write_text(snakemake.output[0], table.to_csv(index=False, float_format="%.6g"))  # noqa: F821
logging.info("\n%s", table.to_string(index=False))
