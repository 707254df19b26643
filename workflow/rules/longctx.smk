# Rules of the long-context stage (issue 18, part 1; see the Snakefile index): quality against prompt length.
#
#   results/long_context/{model}/{variant}.json   swiftkv long-context: passkey readings and likelihood vs context
#   <root>/raw/long_context                       those results with a manifest (analysis/raw.py; roots.smk)
#   <root>/table_long_context.csv, <root>/figure_long_context.png
#
# The students are the tables' own (rule distill_swiftkv, trained on rows of distill.max_length tokens): the study
# asks how the students the tables evaluate behave on longer prompts than they were trained on.

LONG_CONTEXT = config.get("long_context")  # null or absent: a profile without the study


def long_context_inputs(wildcards):
    inputs = {"model": model_input(wildcards)}
    if wildcards.variant != "base":
        inputs["checkpoint"] = eval_target(wildcards)
    return inputs


def long_context_source(wildcards):
    return model_source(wildcards) if wildcards.variant == "base" else eval_target(wildcards)


rule long_context:
    input:
        unpack(long_context_inputs),
    output:
        "results/long_context/{model}/{variant}.json",
    log:
        "logs/long_context/{model}/{variant}.log",
    benchmark:
        "benchmarks/long_context/{model}/{variant}.tsv"
    params:
        source=long_context_source,
        dtype=DTYPE,
        cfg=LONG_CONTEXT or {},
        lengths=" ".join(str(n) for n in LONG_CONTEXT["lengths"]) if LONG_CONTEXT else "",
        depths=" ".join(f"{d:g}" for d in LONG_CONTEXT["depths"]) if LONG_CONTEXT else "",
        contexts=" ".join(str(n) for n in LONG_CONTEXT["contexts"]) if LONG_CONTEXT else "",
    resources:
        **job_resources("eval"),
    threads: ALL_CORES
    shell:
        "swiftkv long-context {params.source} --name {wildcards.model} --dtype {params.dtype} --threads {threads}"
        " --lengths {params.lengths} --depths {params.depths} --samples {params.cfg[samples]}"
        " --contexts {params.contexts} --conversations {params.cfg[conversations]}"
        " --target-tokens {params.cfg[target_tokens]} --output {output} > {log} 2>&1"


def long_context_results():
    if not LONG_CONTEXT:
        return []
    return [f"results/long_context/{m}/{v}.json" for m in LONG_CONTEXT["models"] for v in LONG_CONTEXT["variants"]]


rule raw_long_context:
    input:
        long_context_results(),
    output:
        raw_folder("long_context"),
    log:
        "logs/raw_long_context.log",
    params:
        **raw_params(),
    script:
        "../scripts/collect_raw.py"


rule make_long_context:
    input:
        raw="{root}/raw/long_context",
    output:
        table=report("{root}/table_long_context.csv", caption="../report/long_context.rst",
                     category="Beyond the paper"),
        figure=report("{root}/figure_long_context.png", caption="../report/long_context.rst",
                      category="Beyond the paper"),
    log:
        "logs/make_long_context/{root}.log",
    params:
        sources=long_context_results(),
        labels=lambda w: {r["variant"]: r["label"] for r in eval_variant_rows()},
        bootstrap=EVAL["bootstrap"],
    script:
        "../scripts/make_long_context.py"
