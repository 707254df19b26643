"""Adapter for the raw_* rules: the small files of the inputs (files, and the summaries and logs of run directories)
-> the run's raw folder results/reports/raw/<study> with its manifest (analysis/raw.py)."""
import logging
from pathlib import Path

from analysis.raw import RUN_FILES, collect, uncommitted
from swiftkv.io import atomic_dir
from swiftkv.provenance import git_commit

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)  # noqa: F821
params = snakemake.params  # noqa: F821
sources = [p for p in snakemake.input if Path(p).is_file()]  # noqa: F821
files = list(getattr(params, "files", []))  # named files inside folder inputs (raw_suite: the tasks' manifest)
runs = [d for d in snakemake.input  # noqa: F821
        if Path(d).is_dir() and not any(Path(d) in Path(f).parents for f in files)]
sources += [f"{d}/{name}" for d in runs for name in RUN_FILES] + files  # of another folder: its run files
commit = git_commit()
dirty = uncommitted() if commit.endswith("+dirty") else None  # recorded and marked; analysis.publish refuses it
out = Path(snakemake.output[0])  # noqa: F821
with atomic_dir(out, overwrite=True, what="raw results (analysis/raw.py)") as tmp:  # written as tmp, renamed to out
    manifest = collect(sources, tmp, params.config_hash, commit, profile=params.profile, overrides=params.overrides,
                       dirty=dirty, study=out.name)
logging.info("%d files, %d bytes, collected at %s", len(manifest["files"]),
             sum(f["bytes"] for f in manifest["files"].values()), commit)
