"""Adapter for rules raw_seeds / raw_lr_sweep: the small files of the inputs (files, and the summaries and logs of
run directories) -> reports/raw/<study>/ with its manifest (analysis/raw.py)."""
import logging
from pathlib import Path

from analysis.raw import collect
from swiftkv.bench.provenance import git_commit
from swiftkv.io import atomic_dir

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
RUN_FILES = ("distill.json", "train_log.jsonl")  # of a run directory: what the tables read; never the weights
sources = [p for p in snakemake.input if Path(p).is_file()]  # noqa: F821
sources += [f"{d}/{name}" for d in snakemake.input if Path(d).is_dir() for name in RUN_FILES]  # noqa: F821
with atomic_dir(snakemake.output[0], overwrite=True, what="raw results (analysis/raw.py)") as tmp:  # noqa: F821
    manifest = collect(sources, tmp, snakemake.params.config_hash, git_commit())  # noqa: F821
logging.info("%d files, %d bytes", len(manifest["files"]), sum(f["bytes"] for f in manifest["files"].values()))
