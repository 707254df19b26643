"""Adapter for rule make_budget_scaling: the study's runs, checks and evaluations (as committed in
reports/raw/budget_scaling) -> reports/budget_scaling.csv and reports/figure_budget_scaling.png (analysis/scaling.py)."""
import logging

from analysis.scaling import plot_scaling, run_labels, scaling_from_raw
from analysis.stats import BootstrapSettings
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
boot = snakemake.params.bootstrap  # noqa: F821
table = scaling_from_raw(snakemake.input.raw, snakemake.params.study,  # noqa: F821
                         BootstrapSettings(boot["resamples"], boot["confidence"], boot["seed"]))
write_text(snakemake.output.csv, table.to_csv(index=False, float_format="%.5g"))  # noqa: F821
study = snakemake.params.study  # noqa: F821
plot_scaling(table, snakemake.output.figure, run_labels(study, snakemake.params.labels))  # noqa: F821
logging.info("\n%s", table.to_string(index=False))
