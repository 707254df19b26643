"""Adapter for rule make_table: a table's rows' evaluations (as committed in reports/raw/<table>) -> reports/<table>.csv
and .md."""
import logging

from analysis.accuracy import table_from_raw
from analysis.stats import BootstrapSettings
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
boot = snakemake.params.bootstrap  # noqa: F821
df, md = table_from_raw(snakemake.wildcards.table, snakemake.input.raw, snakemake.params.rows,  # noqa: F821
                        BootstrapSettings(boot["resamples"], boot["confidence"], boot["seed"]))
write_text(snakemake.output.csv, df.to_csv(index=False, float_format="%.4f"))  # noqa: F821
write_text(snakemake.output.md, md)  # noqa: F821
