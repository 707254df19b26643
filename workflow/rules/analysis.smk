# Rules of the analysis stage (see the Snakefile index): SimScore (Fig. 2 left/middle), FLOPs and KV memory
# (Table 1, AcrossKV memory), forward time vs prefill tokens (Fig. 2 right).


def model_config_input(wildcards):
    """Where a model's config.json comes from: the prepared embedded model, else config/models/<id>.json."""
    spec = MODELS.get(wildcards.model)
    if spec is not None and spec["source"] == "embedded":
        return model_input(wildcards)
    return [f"config/models/{wildcards.model}.json"]


def flops_context_length(wildcards):
    """The paper's Table 1 models at the paper's (fitted) prompt length, every other model at the profile's."""
    cfg = config["flops"]
    return cfg["reference_context_length"] if wildcards.model in cfg["table1_models"] else cfg["context_length"]


FLOPS_TABLE1_MODELS = list(dict.fromkeys(config["flops"]["table1_models"] + list(MODELS)))
FLOPS_KV_MODELS = list(dict.fromkeys(config["flops"]["kv_memory_models"] + list(MODELS)))

# The results behind each analysis figure and table, collected as a run's raw folder <root>/raw/<study> with a
# manifest (analysis/raw.py); the figure and table rules read them from there, so that a clone re-derives them from
# the committed reports/raw/<study> (issue 16, item 6).
ANALYSIS_RAW = {
    "flops": [f"results/flops/{m}.json" for m in dict.fromkeys(FLOPS_TABLE1_MODELS + FLOPS_KV_MODELS)],
    "simscore": [f"results/simscore/{m}.{ext}" for m in config["simscore"]["models"] for ext in ("csv", "json")],
    "forward_time": [f"results/prefill_time/{m}.json" for m in config["prefill_time"]["models"]],
}


def analysis_sources(study, pattern):
    """The results of ``study``'s raw folder that match ``pattern`` (a glob of the source path)."""
    from fnmatch import fnmatch

    return [s for s in ANALYSIS_RAW[study] if fnmatch(s, pattern)]


rule raw_analysis:
    input:
        lambda w: ANALYSIS_RAW[w.study],
    output:
        raw_folder("{study}"),
    wildcard_constraints:
        study="|".join(ANALYSIS_RAW),
    log:
        "logs/raw_analysis/{study}.log",
    params:
        **raw_params(),
    script:
        "../scripts/collect_raw.py"


rule compute_flops:
    input:
        model_config_input,
    output:
        "results/flops/{model}.json",
    log:
        "logs/compute_flops/{model}.log",
    params:
        context_length=flops_context_length,
        settings=config["flops"]["settings"],
        kv_skip=config["flops"]["kv_memory_skip"],
    script:
        "../scripts/compute_flops.py"


rule make_table1:
    input:
        raw="{root}/raw/flops",
    output:
        csv=report("{root}/table1.csv", caption="../report/table1.rst", category="Table 1: prefill FLOPs"),
        md=report("{root}/table1.md", caption="../report/table1.rst", category="Table 1: prefill FLOPs"),
    log:
        "logs/make_table1/{root}/table1.log",
    params:
        sources=expand("results/flops/{model}.json", model=FLOPS_TABLE1_MODELS),
    script:
        "../scripts/make_table1.py"


rule make_table_kv_memory:
    input:
        raw="{root}/raw/flops",
    output:
        csv=report("{root}/table_kv_memory.csv", caption="../report/table_kv_memory.rst", category="KV memory"),
        md=report("{root}/table_kv_memory.md", caption="../report/table_kv_memory.rst", category="KV memory"),
    log:
        "logs/make_table_kv_memory/{root}/table_kv_memory.log",
    params:
        sources=expand("results/flops/{model}.json", model=FLOPS_KV_MODELS),
    script:
        "../scripts/make_table_kv_memory.py"


rule compute_simscore:
    input:
        model_input,
    output:
        csv="results/simscore/{model}.csv",
        meta="results/simscore/{model}.json",
    log:
        "logs/compute_simscore/{model}.log",
    benchmark:
        "benchmarks/compute_simscore/{model}.tsv"
    params:
        source=model_source,
        dtype=DTYPE,
        cfg=config["simscore"],
    resources:
        **job_resources("analysis"),
    threads: ALL_CORES  # forward passes use every core; one model at a time
    shell:
        "swiftkv simscore {params.source} --name {wildcards.model} --dtype {params.dtype} --threads {threads}"
        " --num-sequences {params.cfg[num_sequences]} --max-tokens {params.cfg[max_tokens]}"
        " --seed {params.cfg[seed]} --batch-size {params.cfg[batch_size]}"
        " --outlier-dims {params.cfg[outlier_dims]} --sink-tokens {params.cfg[sink_tokens]}"
        " --n-resamples {params.cfg[n_resamples]}"
        " --output {output.csv} --metadata {output.meta} > {log} 2>&1"


rule plot_simscore:
    input:
        raw="{root}/raw/simscore",
    output:
        figure=report("{root}/figure2_simscore.png", caption="../report/figure2_simscore.rst", category="Figure 2"),
        crossings=report("{root}/simscore_crossings.csv", caption="../report/simscore_crossings.rst",
                         category="Figure 2"),
    log:
        "logs/plot_simscore/{root}/figure2_simscore.log",
    params:
        csv=analysis_sources("simscore", "*.csv"),
        meta=analysis_sources("simscore", "*.json"),
    script:
        "../scripts/plot_simscore.py"


rule bench_forward_time:
    input:
        model_input,
    output:
        "results/prefill_time/{model}.json",
    log:
        "logs/bench_forward_time/{model}.log",
    benchmark:
        "benchmarks/bench_forward_time/{model}.tsv"
    params:
        source=model_source,
        dtype=DTYPE,
        cfg=config["prefill_time"],
    resources:
        **job_resources("bench"),
    threads: ALL_CORES  # a timing job runs alone
    shell:
        "swiftkv bench prefill {params.source} --dtype {params.dtype} --threads {threads}"
        " --lengths {params.cfg[lengths]} --fractions {params.cfg[fractions]}"
        " --warmup {params.cfg[warmup]} --repeats {params.cfg[repeats]}"
        " --output {output} > {log} 2>&1"


rule plot_forward_time:
    input:
        raw="{root}/raw/forward_time",
    output:
        report("{root}/figure2_forward_time.png", caption="../report/figure2_forward_time.rst", category="Figure 2"),
    log:
        "logs/plot_forward_time/{root}/figure2_forward_time.log",
    params:
        sources=ANALYSIS_RAW["forward_time"],
    script:
        "../scripts/plot_forward_time.py"
