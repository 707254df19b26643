# swiftkv: the paper as a DAG. This file is an index; the rules live in workflow/rules/.
#   snakemake --cores all results/reports/table2.csv                  (default profile, embedded models)
#   python -m analysis.reproduce                                      (did it reproduce the committed reports/?)
#   snakemake --cores all --configfile config/ci.yaml <target>        (CI profile: tiny sizes)
#   snakemake --cores all --configfile config/paper.yaml <target>     (paper profile: hub models, GPUs)
from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/config.smk"  # one line naming a bad key or value, before anything runs


validate(config, "workflow/schemas/config.schema.yaml")  # (after that check: Snakemake's own, fills defaults)


include: "workflow/rules/common.smk"
include: "workflow/rules/roots.smk"  # {root}: results/reports (a run) or reports (committed)
include: "workflow/rules/models.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/distill.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/seeds.smk"
include: "workflow/rules/extended.smk"
include: "workflow/rules/scaling.smk"
include: "workflow/rules/advise.smk"
include: "workflow/rules/longctx.smk"
include: "workflow/rules/serve.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        "results/reports/table1.csv",
        "results/reports/table_kv_memory.csv",
        "results/reports/figure2_simscore.png",
        "results/reports/figure2_forward_time.png",
