"""Rule make_table3: KV-limit JSONs (their raw folder) -> reports/table3.csv (measured rows, then the paper's)."""
import logging

from analysis.io import write_csv
from analysis.paper import paper_table
from analysis.serving import load_raw, table3

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)
table = table3(load_raw(snakemake.input.raw, snakemake.params.sources), paper_table("table3_memory.csv"))
write_csv(table, snakemake.output[0], float_format="%.4g")
logging.info("table 3: %d rows", len(table))
