"""Adapter for rule plot_forward_time: prefill forward time vs prefill tokens at l = L, L/2, L/4 (paper Fig. 2 right)."""

import logging

from analysis.figures import forward_time_figure, forward_time_title
from analysis.io import read_prefill_time, save_figure
from analysis.raw import raw_path

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821

df = read_prefill_time([raw_path(snakemake.input.raw, s) for s in snakemake.params.sources])  # noqa: F821
save_figure(forward_time_figure(df, title=forward_time_title(df)), snakemake.output[0])  # noqa: F821
logging.info("\n%s", df[["model", "variant", "prefill_tokens", "median_s", "speedup", "predicted_ratio"]].to_string())
