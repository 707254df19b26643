"""Adapter for rule make_seeds: every seed's evaluation of the compared rows (as committed in reports/raw/seeds)
-> reports/seeds.csv."""
import logging

from analysis.seeds import seeds_from_raw
from analysis.stats import BootstrapSettings
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
boot = snakemake.params.bootstrap  # noqa: F821
table = seeds_from_raw(snakemake.input.raw, snakemake.params.models, snakemake.params.reference,  # noqa: F821
                       BootstrapSettings(boot["resamples"], boot["confidence"], boot["seed"]))
write_text(snakemake.output[0], table.to_csv(index=False, float_format="%.4f"))  # noqa: F821
logging.info("\n%s", table.to_string(index=False))
