"""Adapter for rule make_table_kv_memory: KV-cache bytes per token and AcrossKV / FP8 reductions."""

import logging

from analysis.io import read_flops, write_csv
from analysis.paper import paper_table
from analysis.raw import raw_path
from analysis.tables import kv_memory, kv_memory_markdown
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821

paths = [raw_path(snakemake.input.raw, s) for s in snakemake.params.sources]  # noqa: F821  (reports/raw/flops)
t = kv_memory(read_flops(paths, "kv_memory"), paper_table("kv_memory"))
write_csv(t, snakemake.output.csv)  # noqa: F821
write_text(snakemake.output.md, kv_memory_markdown(t))  # noqa: F821
logging.info("\n%s", kv_memory_markdown(t))
