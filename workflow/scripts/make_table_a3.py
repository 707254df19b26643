"""Rule make_table_a3: ShareGPT JSONs (their raw folder) -> reports/tableA3.csv (measured rows, then the paper's)."""
import logging

from analysis.io import write_csv
from analysis.paper import paper_table
from analysis.serving import load_raw, table_a3

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)
table = table_a3(load_raw(snakemake.input.raw, snakemake.params.sources), paper_table("tableA3_sharegpt.csv"))
write_csv(table, snakemake.output[0], float_format="%.4g")
logging.info("table A.3: %d rows", len(table))
