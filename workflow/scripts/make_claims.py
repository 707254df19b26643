"""Adapter for rule make_claims: the registered rules (analysis/claims.yaml) applied to a root's tables and raw
folders -> <root>/claims.csv. A table's evidence commit is what its raw folder records (analysis.claims
.evidence_commit), so that the committed claims re-derive from committed files alone."""
import logging
from pathlib import Path

from analysis.claims import evaluate
from analysis.io import write_csv
from analysis.raw import COMMITTED
from swiftkv.provenance import git_commit

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
root = Path(snakemake.wildcards.root)  # noqa: F821
frame = evaluate(root, snakemake.input.registry, commit="not recorded" if str(root) == COMMITTED else git_commit(),  # noqa: F821
                 registered_points=snakemake.params.registered_points)  # noqa: F821
write_csv(frame, snakemake.output[0])  # noqa: F821
logging.info("%s", frame.groupby(["status", "verdict"]).size().to_string())
