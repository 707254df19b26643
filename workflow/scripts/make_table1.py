"""Adapter for rule make_table1: our per-op prefill GFLOPs beside the paper's Table 1."""

import logging

from analysis.io import read_flops, write_csv
from analysis.paper import paper_table
from analysis.raw import raw_path
from analysis.tables import table1, table1_markdown
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821

paths = [raw_path(snakemake.input.raw, s) for s in snakemake.params.sources]  # noqa: F821  (reports/raw/flops)
t = table1(read_flops(paths, "table1"), paper_table("table1"))
write_csv(t, snakemake.output.csv)  # noqa: F821
write_text(snakemake.output.md, table1_markdown(t))  # noqa: F821
logging.info("\n%s", table1_markdown(t))
