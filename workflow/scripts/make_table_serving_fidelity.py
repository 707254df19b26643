"""Adapter for rule make_table_serving_fidelity: the served-fidelity results (as committed in
reports/raw/served_fidelity) -> reports/table_serving_fidelity.csv."""
import logging

from analysis.io import read_json
from analysis.raw import raw_path
from analysis.serving import serving_fidelity_table
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
table = serving_fidelity_table([read_json(raw_path(snakemake.input.raw, s)) for s in snakemake.params.sources])  # noqa: F821
write_text(snakemake.output[0], table.to_csv(index=False, float_format="%.6g"))  # noqa: F821
logging.info("\n%s", table.to_string(index=False))
