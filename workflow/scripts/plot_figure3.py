"""Rule plot_figure3: serving throughput JSONs (their raw folder) -> reports/figure3_throughput.png (paper numbers beside)."""
import logging

from analysis.paper import paper_table
from analysis.serving import load_raw
from analysis.serving_figures import figure3

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)
measured = load_raw(snakemake.input.raw, snakemake.params.sources)
figure3(measured, paper_table("figure3_throughput.csv"), snakemake.output[0])
logging.info("figure 3 from %d rows of %s", len(measured), snakemake.input.raw)
