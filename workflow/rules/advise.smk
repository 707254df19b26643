# Rules of the advisor stage (issue 18, part 2; see the Snakefile index): where to cut, before any training.
#
#   results/advise/{model}.json          swiftkv advise: every candidate (l, g), its SimScore, untrained KL, savings
#   <root>/raw/advisor                   those results with a manifest (analysis/raw.py; {root}: roots.smk)
#   <root>/table_advisor.csv, <root>/table_advisor_calibration.csv, <root>/figure_advisor.png
#
# The untrained KL is the measure of Table 2's kl column (teacher-forced on the fidelity measure's held-out
# conversations, eval.fidelity.tokens each), so the page calibrates it against Table 2's trained rows.

ADVISE = config.get("advise")  # null or absent: a profile without the advisor


rule advise_cut:
    input:
        model=model_input,
        heldout="results/tasks/heldout-ppl/{model}",
    output:
        "results/advise/{model}.json",
    log:
        "logs/advise_cut/{model}.log",
    benchmark:
        "benchmarks/advise_cut/{model}.tsv"
    params:
        source=model_source,
        dtype=DTYPE,
        sequences=ADVISE["num_sequences"] if ADVISE else 0,
        tokens=EVAL["fidelity"]["tokens"],
        skips=" ".join(f"{s:g}" for s in ADVISE["skips"]) if ADVISE else "",
        groups=" ".join(str(g) for g in ADVISE["group_sizes"]) if ADVISE else "",
    resources:
        **job_resources("analysis"),
    threads: ALL_CORES  # forward passes use every core; one model at a time
    shell:
        "swiftkv advise {params.source} --name {wildcards.model} --dtype {params.dtype} --threads {threads}"
        " --heldout {input.heldout}/conversations.jsonl --num-sequences {params.sequences}"
        " --max-tokens {params.tokens} --skips {params.skips} --group-sizes {params.groups}"
        " --output {output} > {log} 2>&1"


def advise_results():
    return expand("results/advise/{model}.json", model=ADVISE["models"]) if ADVISE else []


rule raw_advisor:
    input:
        advise_results(),
    output:
        raw_folder("advisor"),
    log:
        "logs/raw_advisor.log",
    params:
        **raw_params(),
    script:
        "../scripts/collect_raw.py"


rule make_advisor:
    input:
        raw="{root}/raw/advisor",
        table2="{root}/table2.csv",
    output:
        table=report("{root}/table_advisor.csv", caption="../report/advisor.rst", category="Advisor"),
        calibration=report("{root}/table_advisor_calibration.csv", caption="../report/advisor.rst",
                           category="Advisor"),
        figure=report("{root}/figure_advisor.png", caption="../report/advisor.rst", category="Advisor"),
    log:
        "logs/make_advisor/{root}.log",
    params:
        sources=advise_results(),
        rows=eval_variant_rows(),
        tolerance=ADVISE["tolerance"] if ADVISE else None,
    script:
        "../scripts/make_advisor.py"
