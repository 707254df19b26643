"""Adapter for rule make_long_context: the long-context results (as committed in reports/raw/long_context) ->
reports/table_long_context.csv and reports/figure_long_context.png (one model: the profile's first)."""
import logging
from pathlib import Path

from analysis.io import read_json, save_figure
from analysis.longctx import long_context_figure, long_context_table
from analysis.raw import raw_path
from analysis.stats import BootstrapSettings
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
boot = snakemake.params.bootstrap  # noqa: F821
results = {Path(src).stem: read_json(raw_path(snakemake.input.raw, src)) for src in snakemake.params.sources}  # noqa: F821
table = long_context_table(results, snakemake.params.labels,  # noqa: F821
                           settings=BootstrapSettings(boot["resamples"], boot["confidence"], boot["seed"]))
write_text(snakemake.output.table, table.to_csv(index=False, float_format="%.4f"))  # noqa: F821
save_figure(long_context_figure(table), snakemake.output.figure)  # noqa: F821
logging.info("\n%s", table.to_string(index=False))
