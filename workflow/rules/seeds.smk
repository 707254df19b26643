# Rules of the evidence studies (see the Snakefile index; issue 16): training-seed variance of the compared rows and
# the learning rate per training scope.
SEEDS = config.get("seeds")  # null or absent: a profile without the study


wildcard_constraints:
    seed=r"\d+",
    lr=r"[0-9][0-9.e+-]*",


def seed_checkpoint(model, variant, seed):
    from analysis.seeds import checkpoint_path

    return checkpoint_path(model, variant, seed, config["distill"]["seed"])


def seed_runs(model):
    """Every run of the seeds study for a model (analysis.seeds.seed_runs: variant, seed, result paths)."""
    from analysis.seeds import seed_runs as runs

    missing = [v for v in SEEDS["variants"] if (model, v) not in VARIANTS.index]
    if missing:
        stop(f"config seeds.variants: {', '.join(missing)} of {model} are not rows of the variants sheet "
             f"({config['distill']['variants']})")
    trained = {v: VARIANTS.loc[(model, v)].train == "yes" for v in SEEDS["variants"]}
    return runs(model, SEEDS["variants"], SEEDS["seeds"], config["distill"]["seed"], trained)


def seeds_inputs(wildcards):
    inputs = {"lm_eval": [], "fidelity": [], "checkpoints": [], "base": [], "tasks": []}
    for model in SEEDS["models"]:
        for run in seed_runs(model):
            inputs["lm_eval"].append(run["lm_eval"])
            inputs["fidelity"].append(run["fidelity"])
            if run["checkpoint"]:
                inputs["checkpoints"].append(run["checkpoint"])
        inputs["base"].append(eval_path(model, "base", "native", "lm_eval.json"))
        inputs["tasks"].append(eval_path(model, "tasks.json"))
    return inputs


def seeds_params():
    return [{"model": model, "runs": seed_runs(model)} for model in (SEEDS["models"] if SEEDS else [])]


# A seed's student: the table run's recipe and budget, another seed (token stream and its teacher cache).
rule distill_swiftkv_seed:
    input:
        model=model_input,
        cache=teacher_cache_input,
    output:
        directory("results/seeds/{model}/{variant}/seed-{seed}/checkpoint"),
    log:
        "logs/distill_swiftkv_seed/{model}/{variant}/seed-{seed}.log",
    benchmark:
        "benchmarks/distill_swiftkv_seed/{model}/{variant}/seed-{seed}.tsv"
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


# ... evaluated exactly as the tables' rows are (native KV cache): the benchmark tasks and the fidelity.
rule eval_swiftkv_seed:
    input:
        unpack(eval_inputs),
    output:
        lm_eval="results/seeds/{model}/{variant}/seed-{seed}/{kvcache}/lm_eval.json",
    log:
        "logs/eval_swiftkv_seed/{model}/{variant}/seed-{seed}/{kvcache}.log",
    benchmark:
        "benchmarks/eval_swiftkv_seed/{model}/{variant}/seed-{seed}/{kvcache}.tsv"
    params:
        **EVAL_PARAMS,
    resources:
        **job_resources("eval"),
    threads: ALL_CORES
    shell:
        EVAL_SHELL


rule fidelity_swiftkv_seed:
    input:
        unpack(heldout_inputs),
    output:
        fidelity="results/seeds/{model}/{variant}/seed-{seed}/{kvcache}/fidelity.json",
    log:
        "logs/fidelity_swiftkv_seed/{model}/{variant}/seed-{seed}/{kvcache}.log",
    benchmark:
        "benchmarks/fidelity_swiftkv_seed/{model}/{variant}/seed-{seed}/{kvcache}.tsv"
    params:
        **heldout_params(""),  # seeds.csv reads no bits per byte
    resources:
        **job_resources("eval"),
    threads: ALL_CORES
    shell:
        HELDOUT_SHELL


# The small files behind seeds.csv (raw folder seeds: evaluations, training summaries and logs, no checkpoints), so
# that the table and the claims it decides are re-derived from them (analysis/raw.py).
rule raw_seeds:
    input:
        unpack(seeds_inputs),
    output:
        raw_folder("seeds"),
    log:
        "logs/raw_seeds.log",
    params:
        **raw_params(),
    script:
        "../scripts/collect_raw.py"


rule make_seeds:
    input:
        raw="{root}/raw/seeds",
    output:
        report("{root}/seeds.csv", caption="../report/seeds.rst", category="Accuracy"),
    log:
        "logs/make_seeds/{root}.log",
    params:
        models=seeds_params(),
        reference=SEEDS["reference"] if SEEDS else {},
        bootstrap=EVAL["bootstrap"],
    script:
        "../scripts/make_seeds.py"


# -- learning rate per training scope ----------------------------------------------------------------------------

LR_SWEEP = config["distill"].get("lr_sweep")


def lr_sweep_runs():
    s = LR_SWEEP
    return [f"results/lr_sweep/{s['model']}/{v}/lr-{lr:g}" for v in s["variants"] for lr in s["lrs"]] if s else []


# The table recipe and budget (profile seed) at one lr of the sweep: only the training log's held-out KL is used, so
# the run keeps no weights (--log-only).
rule distill_lr_sweep:
    input:
        model=model_input,
        cache=teacher_cache_input,
    output:
        directory("results/lr_sweep/{model}/{variant}/lr-{lr}"),
    log:
        "logs/distill_lr_sweep/{model}/{variant}/lr-{lr}.log",
    benchmark:
        "benchmarks/distill_lr_sweep/{model}/{variant}/lr-{lr}.tsv"
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
        " ".join((DISTILL_COMMAND, "--log-only -o {output} > {log} 2>&1"))


rule raw_lr_sweep:
    input:
        lr_sweep_runs(),
    output:
        raw_folder("lr_sweep"),
    log:
        "logs/raw_lr_sweep.log",
    params:
        **raw_params(),
    script:
        "../scripts/collect_raw.py"


rule make_lr_sweep:
    input:
        raw="{root}/raw/lr_sweep",
    output:
        report("{root}/lr_sweep.csv", caption="../report/lr_sweep.rst", category="Distillation"),
    log:
        "logs/make_lr_sweep/{root}.log",
    params:
        runs=lr_sweep_runs(),
        configured={scope: config["distill"].get("lr_by_scope", {}).get(scope, config["distill"].get("overrides", {})
                                                                          .get("lr")) for scope in ("partial", "full")},
    script:
        "../scripts/make_lr_sweep.py"
