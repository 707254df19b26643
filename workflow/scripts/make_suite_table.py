"""Adapter for rule make_suite_table: the suite's raw folder (<root>/raw/suite) -> <root>/suite_selection.csv."""
import logging

from analysis.selection import suite_table
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
df = suite_table(snakemake.input.raw)  # noqa: F821
write_text(snakemake.output.csv, df.to_csv(index=False, float_format="%.4f"))  # noqa: F821
picked = df[df.reported]
logging.info("%d of %d candidate tasks reported, %d report examples", picked.task.nunique(), df.task.nunique(),
             int(picked.report_n.sum()))
