# Rules of the evidence studies (see the Snakefile index; issue 16): training-seed variance of the compared rows and
# the learning rate per training scope.
SEEDS = config.get("seeds")  # absent in profiles without the study (the paper profile)


wildcard_constraints:
    seed=r"\d+",
    lr=r"[0-9][0-9.e+-]*",


def seed_checkpoint(model, variant, seed):
    """The checkpoint of (model, variant) trained with ``seed``: the tables' own run for the profile's seed."""
    if seed == config["distill"]["seed"]:
        return f"results/checkpoints/{model}/{variant}"
    return f"results/seeds/{model}/{variant}/seed-{seed}/checkpoint"


def seed_runs(model):
    """(variant, seed or None, lm_eval, fidelity, checkpoint or None) of every run of the seeds study for a model; an
    untrained row has one run (seed None), the tables' own evaluation."""
    runs = []
    for variant in SEEDS["variants"]:
        row = VARIANTS.loc[(model, variant)]
        if row.train != "yes":
            d = f"results/eval/{model}/{variant}/native"
            runs.append((variant, None, f"{d}/lm_eval.json", f"{d}/fidelity.json", None))
            continue
        for seed in SEEDS["seeds"]:
            if seed == config["distill"]["seed"]:
                d = f"results/eval/{model}/{variant}/native"
            else:
                d = f"results/seeds/{model}/{variant}/seed-{seed}/native"
            runs.append((variant, seed, f"{d}/lm_eval.json", f"{d}/fidelity.json", seed_checkpoint(model, variant, seed)))
    return runs


def seeds_inputs(wildcards):
    inputs = {"lm_eval": [], "fidelity": [], "checkpoints": [], "base": [], "tasks": []}
    for model in SEEDS["models"]:
        for _, _, lm, fid, ckpt in seed_runs(model):
            inputs["lm_eval"].append(lm)
            inputs["fidelity"].append(fid)
            if ckpt:
                inputs["checkpoints"].append(ckpt)
        inputs["base"].append(f"results/eval/{model}/base/native/lm_eval.json")
        inputs["tasks"].append(f"results/eval/{model}/tasks.json")
    return inputs


def seeds_params():
    return [{"model": model, "runs": [{"variant": v, "seed": s, "lm_eval": lm, "fidelity": fid, "checkpoint": ckpt}
                                      for v, s, lm, fid, ckpt in seed_runs(model)]}
            for model in (SEEDS["models"] if SEEDS else [])]


# A seed's student: the table run's recipe and budget, another seed (token stream and its teacher cache).
rule distill_swiftkv_seed:
    input:
        model=model_input,
        variants=variant_check,
        cache=teacher_cache_input,
    output:
        directory("results/seeds/{model}/{variant}/seed-{seed}/checkpoint"),
    log:
        "logs/distill_swiftkv_seed/{model}/{variant}/seed-{seed}.log",
    benchmark:
        "benchmarks/distill_swiftkv_seed/{model}/{variant}/seed-{seed}.tsv"
    params:
        launcher=distill_launcher,
        model=model_source,
        budget=distill_budget_args,
        cache=teacher_cache_arg,
    threads: DISTILL_THREADS
    shell:
        DISTILL_SHELL


# ... evaluated exactly as the tables' rows are (native KV cache).
rule eval_swiftkv_seed:
    input:
        unpack(eval_inputs),
    output:
        lm_eval="results/seeds/{model}/{variant}/seed-{seed}/{kvcache}/lm_eval.json",
        fidelity="results/seeds/{model}/{variant}/seed-{seed}/{kvcache}/fidelity.json",
    log:
        "logs/eval_swiftkv_seed/{model}/{variant}/seed-{seed}/{kvcache}.log",
    benchmark:
        "benchmarks/eval_swiftkv_seed/{model}/{variant}/seed-{seed}/{kvcache}.tsv"
    params:
        target=eval_target,
        base=model_source,
        include=eval_include_args,
        fidelity=eval_fidelity_args,
        batch=EVAL["batch_size"],
    threads: ALL_CORES
    shell:
        EVAL_SHELL


rule make_seeds:
    input:
        unpack(seeds_inputs),
    output:
        report("reports/seeds.csv", caption="../report/seeds.rst", category="Accuracy"),
    log:
        "logs/make_seeds.log",
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


# The table recipe and budget (profile seed) at one lr of the sweep: only the training log's held-out KL is used.
rule distill_lr_sweep:
    input:
        model=model_input,
        variants=variant_check,
        cache=teacher_cache_input,
    output:
        directory("results/lr_sweep/{model}/{variant}/lr-{lr}"),
    log:
        "logs/distill_lr_sweep/{model}/{variant}/lr-{lr}.log",
    benchmark:
        "benchmarks/distill_lr_sweep/{model}/{variant}/lr-{lr}.tsv"
    params:
        launcher=distill_launcher,
        model=model_source,
        budget=distill_budget_args,
        cache=teacher_cache_arg,
    threads: DISTILL_THREADS
    shell:
        DISTILL_SHELL


rule make_lr_sweep:
    input:
        lr_sweep_runs(),
    output:
        report("reports/lr_sweep.csv", caption="../report/lr_sweep.rst", category="Distillation"),
    log:
        "logs/make_lr_sweep.log",
    params:
        configured={scope: config["distill"].get("lr_by_scope", {}).get(scope, config["distill"].get("overrides", {})
                                                                          .get("lr")) for scope in ("partial", "full")},
    script:
        "../scripts/make_lr_sweep.py"
