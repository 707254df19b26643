"""Adapter for rule make_advisor: the advisor's results (as committed in reports/raw/advisor) and Table 2's trained
rows -> reports/table_advisor.csv, reports/table_advisor_calibration.csv, reports/figure_advisor.png."""
import logging

import pandas as pd

from analysis.advisor import advisor_figure, advisor_tables
from analysis.io import read_json, save_figure
from analysis.raw import raw_path
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
results = [read_json(raw_path(snakemake.input.raw, src)) for src in snakemake.params.sources]  # noqa: F821
candidates, calibration = advisor_tables(results, pd.read_csv(snakemake.input.table2),  # noqa: F821
                                         snakemake.params.rows, snakemake.params.tolerance)  # noqa: F821
write_text(snakemake.output.table, candidates.to_csv(index=False, float_format="%.4f"))  # noqa: F821
write_text(snakemake.output.calibration, calibration.to_csv(index=False, float_format="%.4f"))  # noqa: F821
save_figure(advisor_figure(candidates, calibration), snakemake.output.figure)  # noqa: F821
logging.info("\n%s\n%s", candidates.to_string(index=False), calibration.to_string(index=False))
