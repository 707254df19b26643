"""Adapter for rule plot_simscore: SimScore by depth per model (paper Fig. 2 left/middle) and the 0.5 crossings."""

import logging

from analysis.figures import simscore_figure, simscore_subtitle
from analysis.io import read_metadata, read_simscore, save_figure, write_csv
from analysis.tables import simscore_crossings

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821

df = read_simscore(snakemake.input.csv)  # noqa: F821
meta = read_metadata(snakemake.input.meta)  # noqa: F821
save_figure(simscore_figure(df, subtitle=simscore_subtitle(meta)), snakemake.output.figure)  # noqa: F821
crossings = simscore_crossings(df)
write_csv(crossings, snakemake.output.crossings)  # noqa: F821
logging.info("\n%s", crossings.to_string())
