"""Adapter for rule plot_simscore: SimScore by depth per model (paper Fig. 2 left/middle) and the 0.5 crossings."""

import logging

from analysis.figures import simscore_figure, simscore_subtitle
from analysis.io import read_metadata, read_simscore, save_figure, write_csv
from analysis.raw import raw_path
from analysis.tables import simscore_crossings

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821

raw, params = snakemake.input.raw, snakemake.params  # noqa: F821  (reports/raw/simscore)
df = read_simscore([raw_path(raw, s) for s in params.csv])
meta = read_metadata([raw_path(raw, s) for s in params.meta])
save_figure(simscore_figure(df, subtitle=simscore_subtitle(meta)), snakemake.output.figure)  # noqa: F821
crossings = simscore_crossings(df)
write_csv(crossings, snakemake.output.crossings)  # noqa: F821
logging.info("\n%s", crossings.to_string())
