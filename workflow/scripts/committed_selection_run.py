"""Adapter for rule committed_selection_run: the committed selection run (eval.bigbench.selection_from) as this
run's, after checking that it scored exactly this build's selection half of every candidate task."""
import json
import logging
from pathlib import Path

from analysis.io import read_json
from analysis.selection import check_same_questions
from swiftkv.io import open_output_dir, write_json

logging.basicConfig(filename=snakemake.log[0], level=logging.INFO)
committed = str(snakemake.input.run).removesuffix(".gz")  # read_json reads <path>.gz where only that exists
result = read_json(committed)
with open(f"{snakemake.input.bigbench}/manifest.json") as f:
    manifest = json.load(f)
try:
    check_same_questions(result, manifest, f"{snakemake.input.bigbench}/selection")
except ValueError as e:
    raise SystemExit(f"{committed}.gz: {e}; to run the selection here instead, set eval.bigbench.selection_from: null")
out = Path(snakemake.output[0])
open_output_dir(out.parent, what="lm-eval results (the committed selection run)")
write_json(out, result)
logging.info("selection run taken from %s.gz (%d tasks)", committed, len(result.get("samples", {})))
