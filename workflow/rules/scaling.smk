# Rules of the budget-scaling study (see the Snakefile index; issue 16, item 3): held-out KL and top-1 agreement
# against training tokens, one warmup-stable-decay run per row read at every budget (swiftkv distill --schedule wsd),
# task accuracy at the smallest and largest budget, separate cosine runs at two budgets to check the reading.
# How a claim is read from it is registered in analysis/claims.yaml (budget_scaling).
SCALING = config.get("budget_scaling")  # null or absent: a profile without the study

wildcard_constraints:
    point="smallest|largest",
    tokens=r"\d+",


def scaling_run(wildcards):
    """The config's row for {run}: the variants sheet's row it trains, and its recipe options."""
    runs = {r["name"]: r for r in SCALING["runs"]}
    if wildcards.run not in runs:
        stop(f"config budget_scaling.runs has no run {wildcards.run!r}; it has {', '.join(runs)}")
    spec = runs[wildcards.run]
    if (wildcards.model, spec["variant"]) not in VARIANTS.index:
        stop(f"config budget_scaling.runs.{wildcards.run}: {spec['variant']} of {wildcards.model} is not a row of "
             f"the variants sheet ({config['distill']['variants']})")
    return spec


def scaling_args(wildcards, budgets=None):
    """The recipe of the tables (data, row length, seed, per-scope lr) on the study's held-out sample; wsd options
    for a study run, the cosine schedule for a check run at {tokens}."""
    d, s, spec = config["distill"], SCALING, scaling_run(wildcards)
    scope = VARIANTS.loc[(wildcards.model, spec["variant"])].scope
    lr = d.get("lr_by_scope", {}).get(scope, d.get("overrides", {}).get("lr", 3e-4))
    opts = {"max-length": d["max_length"], "heldout-tokens": s["heldout_tokens"], "seed": d["seed"],
            "data": d["data"], "batch-size": 1, "lr": lr, "eval-every": "end"}
    if "loss_positions" in spec:
        opts["loss-positions"] = spec["loss_positions"]
    if budgets is None:  # a check run: the tables' cosine schedule at one budget
        opts["tokens"] = wildcards.tokens
    else:
        opts.update({"tokens": max(budgets), "schedule": "wsd", "read-budgets": ",".join(map(str, sorted(budgets))),
                     "warmup-steps": s["warmup_steps"], "decay-ratio": s["decay_ratio"]})
    return " ".join(f"--{k} {v}" for k, v in opts.items())


def scaling_layers(model):
    return sorted({int(VARIANTS.loc[(model, spec["variant"])].num_key_value_layers) for spec in SCALING["runs"]})


SCALING_DISTILL = (
    "{params.launcher} distill {params.model} --model-id {wildcards.model} {params.student} {params.options} "
    "--teacher-cache {input.cache} {params.precision} --threads {threads} --resume"
)


# The study's own teacher cache: its largest budget and its larger held-out sample (12 rows, the bootstrap's unit).
rule build_scaling_cache:
    input:
        model=model_input,
    output:
        directory("results/budget_scaling/{model}/teacher_cache"),
    log:
        "logs/build_scaling_cache/{model}.log",
    benchmark:
        "benchmarks/build_scaling_cache/{model}.tsv"
    params:
        source=model_source,
        dtype=DTYPE,
        layers=lambda w: " ".join(map(str, scaling_layers(w.model))),
        tokens=lambda w: max(SCALING["budgets"]),
        heldout=SCALING["heldout_tokens"] if SCALING else 0,
        d={k: config["distill"].get(k) for k in ("max_length", "data", "seed", "cache_dtype")},
    resources:
        **job_resources("teacher_cache"),
    threads: ALL_CORES
    shell:
        "swiftkv teacher-cache {params.source} --layers {params.layers} --tokens {params.tokens}"
        " --max-length {params.d[max_length]} --heldout-tokens {params.heldout} --seed {params.d[seed]}"
        " --data {params.d[data]} --cache-dtype {params.d[cache_dtype]} --dtype {params.dtype} --threads {threads}"
        " --no-progress -o {output} > {log} 2>&1"


# One run per row: read at every budget; the largest budget's student and the smallest's are kept for evaluation.
rule distill_scaling:
    input:
        model=model_input,
        cache="results/budget_scaling/{model}/teacher_cache",
    output:
        largest=directory("results/budget_scaling/{model}/{run}/largest"),
        smallest=directory("results/budget_scaling/{model}/{run}/smallest"),
    log:
        "logs/distill_scaling/{model}/{run}.log",
    benchmark:
        "benchmarks/distill_scaling/{model}/{run}.tsv"
    params:
        launcher=distill_launcher,
        precision=distill_runtime_args,
        model=model_source,
        student=lambda w: student_args(w.model, scaling_run(w)["variant"]),
        options=lambda w: scaling_args(w, SCALING["budgets"]),
        smallest=lambda w: min(SCALING["budgets"]),
    resources:
        **job_resources("distill"),
    threads: DISTILL_THREADS
    shell:
        " ".join((SCALING_DISTILL, "--save-at {params.smallest}={output.smallest} -o {output.largest} > {log} 2>&1"))


# The check: the same row trained separately with the tables' cosine schedule at one budget (its held-out numbers
# only: no weights kept).
rule distill_scaling_check:
    input:
        model=model_input,
        cache="results/budget_scaling/{model}/teacher_cache",
    output:
        directory("results/budget_scaling/{model}/{run}/check-{tokens}"),
    log:
        "logs/distill_scaling_check/{model}/{run}/{tokens}.log",
    benchmark:
        "benchmarks/distill_scaling_check/{model}/{run}/{tokens}.tsv"
    params:
        launcher=distill_launcher,
        precision=distill_runtime_args,
        model=model_source,
        student=lambda w: student_args(w.model, scaling_run(w)["variant"]),
        options=scaling_args,
    resources:
        **job_resources("distill"),
    threads: DISTILL_THREADS
    shell:
        " ".join((SCALING_DISTILL, "--log-only -o {output} > {log} 2>&1"))


def scaling_eval_inputs(wildcards):
    inputs = {"model": model_input(wildcards), "tasks": eval_path(wildcards.model, "tasks.json"),
              "checkpoint": f"results/budget_scaling/{wildcards.model}/{wildcards.run}/{wildcards.point}"}
    if EVAL["suite"] == "bigbench":
        inputs["bigbench"] = "results/tasks/bigbench"
    return inputs


# Task accuracy at the end points, evaluated exactly as the tables' rows are (native KV cache).
rule eval_scaling:
    input:
        unpack(scaling_eval_inputs),
    output:
        lm_eval="results/budget_scaling/{model}/{run}/eval-{point}/{kvcache}/lm_eval.json",
    log:
        "logs/eval_scaling/{model}/{run}/{point}/{kvcache}.log",
    benchmark:
        "benchmarks/eval_scaling/{model}/{run}/{point}/{kvcache}.tsv"
    params:
        **{**EVAL_PARAMS, "target": lambda w, input: input.checkpoint},  # the student read at that budget
    resources:
        **job_resources("eval"),
    threads: ALL_CORES
    shell:
        EVAL_SHELL


def scaling_inputs(wildcards=None):
    """Every file the study's table reads (analysis.scaling.study_paths): each run (its distill.json holds every
    budget's read; train_log.jsonl), its evaluations at the accuracy_at points, the check runs, the base row."""
    from analysis.scaling import study_paths

    paths = study_paths(SCALING)
    return {
        "runs": list(paths["runs"].values()),
        "checks": list(paths["checks"].values()),
        "evals": [f"{d}/lm_eval.json" for pts in paths["evals"].values() for d in pts.values()],
        "base": [paths["base"], paths["tasks"]],
    }


rule raw_budget_scaling:
    input:
        unpack(scaling_inputs),
    output:
        raw_folder("budget_scaling"),
    log:
        "logs/raw_budget_scaling.log",
    params:
        **raw_params(),
    script:
        "../scripts/collect_raw.py"


def scaling_labels():
    """The label of each row the study trains, from the validated sheet (common.smk's VARIANTS)."""
    return {r["variant"]: VARIANTS.loc[(SCALING["model"], r["variant"])].label for r in SCALING["runs"]}


rule make_budget_scaling:
    input:
        raw="{root}/raw/budget_scaling",
    output:
        csv=report("{root}/budget_scaling.csv", caption="../report/budget_scaling.rst", category="Distillation"),
        figure=report("{root}/figure_budget_scaling.png", caption="../report/budget_scaling.rst",
                      category="Distillation"),
    log:
        "logs/make_budget_scaling/{root}.log",
    params:
        study=SCALING,
        bootstrap=EVAL["bootstrap"],
        labels=lambda w: scaling_labels(),
    script:
        "../scripts/make_budget_scaling.py"
