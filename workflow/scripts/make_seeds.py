"""Adapter for rule make_seeds: every seed's evaluation of the compared rows -> reports/seeds.csv."""
import json
import logging

import pandas as pd

from analysis.accuracy import task_label
from analysis.seeds import SeedRun, build_seeds_table
from analysis.stats import BootstrapSettings
from swiftkv.io import write_text

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
boot = snakemake.params.bootstrap  # noqa: F821
settings = BootstrapSettings(boot["resamples"], boot["confidence"], boot["seed"])
frames = []
for spec, base, tasks_path in zip(snakemake.params.models, snakemake.input.base, snakemake.input.tasks):  # noqa: F821
    with open(tasks_path) as f:
        tasks = [dict(t, label=task_label(t["name"])) for t in json.load(f)["tasks"]]
    runs = [SeedRun(spec["model"], r["variant"], r["seed"], r["lm_eval"], r["fidelity"], r["checkpoint"])
            for r in spec["runs"]]
    frames.append(build_seeds_table(runs, SeedRun(spec["model"], "base", None, base), tasks,
                                    snakemake.params.reference, settings))  # noqa: F821
table = pd.concat(frames, ignore_index=True)
write_text(snakemake.output[0], table.to_csv(index=False, float_format="%.4f"))  # noqa: F821
logging.info("\n%s", table.to_string(index=False))
