# Rules of the distill stage (see the Snakefile index).

# Distillation (issue 4): one SwiftKV checkpoint per trainable row of config/variants.tsv.
# One distillation run into {output} (also the seeds study's and the lr sweep's, workflow/rules/seeds.smk); params
# student is the sheet row as options (common.smk: student_args), budget the seed and lr of the run
# (distill_budget_args).
DISTILL_COMMAND = (
    "{params.launcher} distill {params.model} --model-id {wildcards.model} {params.student} {params.budget} "
    "{params.cache} {params.precision} --threads {threads} --resume"
)
DISTILL_SHELL = " ".join((DISTILL_COMMAND, "-o {output} > {log} 2>&1"))


# The teacher's side of every distillation of a model (all variants, budgets, losses): one pass, one cache per seed.
rule build_teacher_cache:
    input:
        model=model_input,
    output:
        directory("results/teacher_cache/{model}/seed-{seed}"),
    log:
        "logs/build_teacher_cache/{model}/seed-{seed}.log",
    benchmark:
        "benchmarks/build_teacher_cache/{model}/seed-{seed}.tsv"
    params:
        source=model_source,
        dtype=DTYPE,
        spec=teacher_cache_spec,
        # only what the cache holds: a change of lr, threads or the curve's label must not rebuild it (and with it
        # every distillation); .get: a profile without the cache (the paper's) need not set cache_dtype
        d={k: config["distill"].get(k) for k in ("max_length", "heldout_tokens", "data", "cache_dtype")},
    resources:
        **job_resources("teacher_cache"),
    threads: ALL_CORES
    shell:
        "swiftkv teacher-cache {params.source} --layers {params.spec[layers]} --tokens {params.spec[tokens]}"
        " --max-length {params.d[max_length]} --heldout-tokens {params.d[heldout_tokens]} --seed {wildcards.seed}"
        " --data {params.d[data]} --cache-dtype {params.d[cache_dtype]} --dtype {params.dtype} --threads {threads}"
        " --no-progress -o {output} > {log} 2>&1"


rule distill_swiftkv:
    input:
        model=model_input,
        cache=teacher_cache_input,
    output:
        directory("results/checkpoints/{model}/{variant}"),
    log:
        "logs/distill_swiftkv/{model}/{variant}.log",
    benchmark:
        "benchmarks/distill_swiftkv/{model}/{variant}.tsv"
    params:
        launcher=distill_launcher,
        precision=distill_runtime_args,
        model=model_source,
        student=lambda w: student_args(w.model, w.variant),
        budget=distill_budget_args,
        cache=teacher_cache_arg,
    resources:
        **job_resources("distill"),
    threads: DISTILL_THREADS
    shell:
        DISTILL_SHELL


# The same student trained on a longer budget with frequent held-out evaluations: where does the KL flatten?
rule distill_swiftkv_curve:
    input:
        model=model_input,
        cache=teacher_cache_input,
    output:
        directory("results/distill_curve/{model}/{variant}"),
    log:
        "logs/distill_swiftkv_curve/{model}/{variant}.log",
    benchmark:
        "benchmarks/distill_swiftkv_curve/{model}/{variant}.tsv"
    params:
        launcher=distill_launcher,
        precision=distill_runtime_args,
        model=model_source,
        student=lambda w: student_args(w.model, w.variant),
        budget=distill_curve_args,
        cache=teacher_cache_arg,
    resources:
        **job_resources("distill"),
    threads: DISTILL_THREADS
    shell:
        DISTILL_SHELL


rule collect_distill:
    input:
        distill_targets,
    output:
        "results/distill/summary.csv",
    log:
        "logs/collect_distill/summary.log",
    script:
        "../scripts/collect_distill.py"


CURVE_RUNS = {
    "curve": "results/distill_curve/{model}/{variant}".format(**config["distill"]["curve"]),
    "table": "results/checkpoints/{model}/{variant}".format(**config["distill"]["curve"]),
}


# The two runs' logs and summaries (never the weights), collected as the run's raw folder distill_curve
# (analysis/raw.py).
rule raw_distill_curve:
    input:
        **CURVE_RUNS,
    output:
        raw_folder("distill_curve"),
    log:
        "logs/raw_distill_curve.log",
    params:
        **raw_params(),
    script:
        "../scripts/collect_raw.py"


rule plot_distill_curve:
    input:
        raw="{root}/raw/distill_curve",
    output:
        report(
            "{root}/figure_distill_curve.png",
            caption="../report/figure_distill_curve.rst",
            category="Distillation",
        ),
    log:
        "logs/plot_distill_curve/{root}/figure.log",
    params:
        runs=CURVE_RUNS,
        table_tokens=config["distill"]["tokens"],
        label=config["distill"]["curve"]["label"],
    script:
        "../scripts/plot_distill_curve.py"


# Distillation speed: the trainer's shared-prefix step vs a naive teacher + student step, same process and batches.
rule bench_distill:
    input:
        model=model_input,
    output:
        "results/bench/distill/{model}.json",
    log:
        "logs/bench_distill/{model}.log",
    benchmark:
        "benchmarks/bench_distill/{model}.tsv"
    params:
        model=model_source,
        options=bench_distill_args,
    resources:
        **job_resources("bench"),
    threads: ALL_CORES
    shell:
        "swiftkv bench distill {params.model} {params.options} --threads {threads} -o {output} > {log} 2>&1"
