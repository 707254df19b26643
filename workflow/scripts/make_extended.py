"""Adapter for rule make_extended: the extended-suite study's raw folder -> the files the claims' evaluators read for
its verdicts (extended_suite/seeds.csv, extended_suite/tableB1.csv), its summary (extended_suite.csv) and the check
of its MMLU part against the power run's raw folders (extended_suite/agreement.csv)."""
import logging

from analysis.extended import extended_tables, mmlu_agreement
from analysis.stats import BootstrapSettings
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
boot = snakemake.params.bootstrap  # noqa: F821
seeds, fp8, summary = extended_tables(snakemake.input.raw, snakemake.params.models,  # noqa: F821
                                      snakemake.params.reference,  # noqa: F821
                                      BootstrapSettings(boot["resamples"], boot["confidence"], boot["seed"]))
agreement = mmlu_agreement(snakemake.input.raw, snakemake.input.power, snakemake.params.models)  # noqa: F821
out = snakemake.output  # noqa: F821
write_text(out.seeds, seeds.to_csv(index=False, float_format="%.4f"))
write_text(out.fp8, fp8.to_csv(index=False, float_format="%.4f"))
write_text(out.summary, summary.to_csv(index=False, float_format="%.4f"))
write_text(out.agreement, agreement.to_csv(index=False, float_format="%.3g"))
logging.info("\n%s", summary.to_string(index=False))
logging.info("the MMLU part against the power run's evaluations:\n%s", agreement.to_string(index=False))
