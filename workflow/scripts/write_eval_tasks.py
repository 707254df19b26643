"""Adapter for rule write_eval_tasks (paper profile): the configured lm-eval task set as the task list."""
from swiftkv.io import write_json

write_json(snakemake.output[0], {"rule": "the paper's task set (config eval.tasks)", "tasks": snakemake.params.tasks})
