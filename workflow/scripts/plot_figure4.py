"""Rule plot_figure4: serving latency JSONs (their raw folder) -> reports/figure4_latency.png (paper numbers beside)."""
import logging

from analysis.paper import paper_table
from analysis.serving import load_raw
from analysis.serving_figures import figure4

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)
measured = load_raw(snakemake.input.raw, snakemake.params.sources)
figure4(measured, paper_table("figure4_latency.csv"), snakemake.output[0])
logging.info("figure 4 from %d rows of %s", len(measured), snakemake.input.raw)
