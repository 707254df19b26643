"""Adapter for rule render_readme: the root's tables and raw folders into its markdown page (analysis.readme)."""

from analysis.readme import Labels, results_page
from swiftkv.io import write_text

params = snakemake.params  # noqa: F821
write_text(snakemake.output[0], results_page(snakemake.wildcards.root, params.title,  # noqa: F821
                                             Labels(params.variant_labels, params.scaling_labels)))
