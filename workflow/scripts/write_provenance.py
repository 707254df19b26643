"""Adapter for rule write_provenance: where the committed reports/ came from, as JSON."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821

from swiftkv.io import write_json  # noqa: E402
from swiftkv.provenance import provenance  # noqa: E402

write_json(snakemake.output[0], provenance(snakemake.params.profile, snakemake.params.config_hash))  # noqa: F821
