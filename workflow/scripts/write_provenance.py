"""Adapter for rule write_provenance: where the committed reports/ came from, as JSON."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821

from pathlib import Path  # noqa: E402

from analysis.raw import summary  # noqa: E402
from swiftkv.bench.provenance import artifact_dates, provenance  # noqa: E402
from swiftkv.io import write_json  # noqa: E402

out = Path(snakemake.output[0])  # noqa: F821
info = provenance(snakemake.params.profile, snakemake.params.config_hash)  # noqa: F821
info["artifacts (last written, UTC)"] = artifact_dates(out.parent)
info["raw results (reports/raw/<study>: collected at commit, config hash, files)"] = summary(out.parent)
write_json(out, info)
