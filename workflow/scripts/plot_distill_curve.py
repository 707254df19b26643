"""Adapter for rule plot_distill_curve: held-out KL vs training tokens (long run + table-budget run)."""

import sys

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821

from analysis.distill import heldout_curve, plot_heldout_curve  # noqa: E402
from analysis.raw import raw_path  # noqa: E402

runs = snakemake.params.runs  # noqa: F821  (as committed in reports/raw/distill_curve)
curve = heldout_curve(raw_path(snakemake.input.raw, runs["curve"]))  # noqa: F821
table = heldout_curve(raw_path(snakemake.input.raw, runs["table"]))  # noqa: F821
plot_heldout_curve(curve, table, snakemake.params.table_tokens, snakemake.params.label,  # noqa: F821
                   snakemake.output[0])  # noqa: F821
print(curve[["step", "tokens", "heldout_kl"]].to_string(index=False), file=sys.stderr)
