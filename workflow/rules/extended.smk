# Rules of the extended-suite study (see the Snakefile index; issue 34, item 2; analysis/claims.yaml extended_suite):
# the suite's own choice kept as it is, plus new candidate tasks chosen by the same rule on their selection halves,
# and the students of the tables and of the seeds study re-scored on the whole of it. A profile without the block
# (extended_suite: null) has none of these rules.
from analysis.extended import FOLDER as EXT_FOLDER, POWER_RAWS, extended_path

EXT = config.get("extended_suite")
EXT_BUILD = "results/tasks/bigbench-extended"


def extended_runs(model):
    """(variant, seed, kv cache) of every evaluation of the study for ``model``: each row once per seed when trained
    (once, at the profile's seed, when not), and the FP8 rows at the profile's seed."""
    missing = [v for v in EXT["variants"] + EXT["fp8_variants"] if (model, v) not in VARIANTS.index]
    if missing:
        stop(f"config extended_suite: {', '.join(missing)} of {model} are not rows of the variants sheet "
             f"({config['distill']['variants']})")
    own = config["distill"]["seed"]
    runs = []
    for variant in EXT["variants"]:
        trained = VARIANTS.loc[(model, variant)].train == "yes"
        runs += [(variant, seed, "native") for seed in (EXT["seeds"] if trained else [own])]
    runs += [(variant, own, "fp8") for variant in EXT["fp8_variants"]]
    return runs


def extended_eval_path(model, variant, seed, kvcache):
    return extended_path(model, variant, f"seed-{seed}", kvcache, "lm_eval.json")


if EXT:
    EXT_TASKS = bigbench_tasks_dir(EXT["candidates"])
    if EXT_TASKS == BIGBENCH_TASKS:
        stop("config extended_suite.candidates: the same list as eval.bigbench.candidates; the study adds tasks "
             "that the suite does not have")

    rule extract_extended_tasks:
        output:
            directory(EXT_TASKS),
        log:
            "logs/extract_extended_tasks/tasks.log",
        params:
            tasks=EXT["candidates"],
            command="extract-installed" if EXT["source"] == "installed" else "generate",
        shell:
            "swiftkv bigbench {params.command} --tasks {params.tasks} --output {output} > {log} 2>&1"

    rule build_extended_tasks:
        input:
            EXT_TASKS,
        output:
            directory(EXT_BUILD),
        log:
            "logs/build_extended_tasks/tasks.log",
        params:
            tasks=EXT["candidates"],
            limits=" ".join(f"--{half}-examples {EXT[f'{half}_examples']}" for half in ("selection", "report")
                            if EXT[f"{half}_examples"] is not None),
        shell:
            "swiftkv bigbench build --tasks-dir {input} --tasks {params.tasks} {params.limits}"
            " --output {output} > {log} 2>&1"

    # The base model on the new candidates' selection halves: only used to choose among them.
    rule eval_extended_selection:
        input:
            model=model_input,
            bigbench=EXT_BUILD,
        output:
            extended_path("{model}", "selection", "lm_eval.json"),
        log:
            "logs/eval_extended_selection/{model}.log",
        benchmark:
            "benchmarks/eval_extended_selection/{model}.tsv"
        params:
            outdir=output_dir,
            source=model_source,
            batch=EVAL["batch_size"],
            dtype=DTYPE,
        resources:
            **job_resources("eval"),
        threads: ALL_CORES
        shell:
            "swiftkv eval {params.source} --bigbench-manifest {input.bigbench}/manifest.json"
            " --bigbench-split selection --no-fidelity --batch-size {params.batch} --dtype {params.dtype}"
            " --threads {threads} --output-dir {params.outdir} > {log} 2>&1"

    rule select_extended_tasks:
        input:
            result=extended_path("{model}", "selection", "lm_eval.json"),
            bigbench=EXT_BUILD,
            suite="results/tasks/bigbench",
            fixed=eval_path("{model}", "tasks.json"),
        output:
            extended_path("{model}", "tasks.json"),
        log:
            "logs/select_extended_tasks/{model}.log",
        params:
            cfg={**EXT, "max_tasks": None, "min_tasks": 0},  # every new task above chance, and no fill-up
            bootstrap=EVAL["bootstrap"],
        script:
            "../scripts/select_bigbench_tasks.py"

    # The choice as its own raw folder, published (python -m analysis.publish extended_selection) before any student
    # is scored on a new task (the registration's order): each model's selection run and task list, and the
    # candidates' manifest.
    rule raw_extended_selection:
        input:
            selection=[extended_path(m, "selection", "lm_eval.json") for m in EXT["models"]],
            tasks=[extended_path(m, "tasks.json") for m in EXT["models"]],
            bigbench=EXT_BUILD,
        output:
            raw_folder("extended_selection"),
        log:
            "logs/raw_extended_selection.log",
        params:
            **raw_params(),
            files=[f"{EXT_BUILD}/manifest.json"],
        script:
            "../scripts/collect_raw.py"

    def extended_states(model, variant="base", seed=None, kvcache="native"):
        """The base model's boundary states on the extended suite (rule eval_extended_base)."""
        seed = config["distill"]["seed"] if seed is None else seed
        return f"results/boundary/{model}/extended-{variant}-seed-{seed}-{kvcache}"

    def extended_eval_inputs(wildcards):
        inputs = {"model": model_input(wildcards), "tasks": extended_path(wildcards.model, "tasks.json"),
                  "suite": "results/tasks/bigbench", "extended": EXT_BUILD,
                  **boundary_input(wildcards, extended_states(wildcards.model, kvcache=wildcards.kvcache))}
        if wildcards.variant != "base":
            inputs["checkpoint"] = eval_target(wildcards)  # the seed's checkpoint (the tables' at the profile's seed)
        return inputs

    # EVAL_SHELL, with the suite's and the new tasks' report folders
    EXTENDED_PARAMS = {**EVAL_PARAMS, "include": lambda w, input: f"--include-path {input.suite}/report "
                                                                  f"--include-path {input.extended}/report"}

    # A row-seed on the whole extended report suite (the suite's tasks included), as the tables' rows are scored.
    rule eval_extended:
        input:
            unpack(extended_eval_inputs),
        output:
            lm_eval=extended_path("{model}", "{variant}", "seed-{seed}", "{kvcache}", "lm_eval.json"),
        log:
            "logs/eval_extended/{model}/{variant}/seed-{seed}/{kvcache}.log",
        benchmark:
            "benchmarks/eval_extended/{model}/{variant}/seed-{seed}/{kvcache}.tsv"
        params:
            **EXTENDED_PARAMS,
        resources:
            **job_resources("eval"),
        threads: ALL_CORES
        shell:
            EVAL_SHELL

    if BOUNDARY:

        # The base model's evaluation on the extended suite, as rule eval_extended runs it, that also records its
        # boundary states for the students' evaluations: native, and FP8 where the study has FP8 students.
        ruleorder: eval_extended_base > eval_extended
        EXT_FP8_STUDENTS = {m: [v for v in EXT["fp8_variants"] if v != "base"] for m in EXT["models"]}

        use rule eval_extended as eval_extended_base with:
            output:
                lm_eval=extended_path("{model}", "{variant}", "seed-{seed}", "{kvcache}", "lm_eval.json"),
                states=directory("results/boundary/{model}/extended-{variant}-seed-{seed}-{kvcache}"),
            wildcard_constraints:
                variant="base",
                kvcache=recorded_caches(EXT_FP8_STUDENTS),
            params:
                **{**EXTENDED_PARAMS, "boundary": lambda w, output: f"--save-boundary {output.states} "
                   f"--boundary-layers {recorded_cuts(w, EXT_FP8_STUDENTS, EXT['variants'])}"},

    def extended_inputs(wildcards):
        inputs = {"lm_eval": [], "selection": [], "tasks": []}
        for model in EXT["models"]:
            inputs["lm_eval"] += [extended_eval_path(model, *run) for run in extended_runs(model)]
            inputs["selection"].append(extended_path(model, "selection", "lm_eval.json"))
            inputs["tasks"].append(extended_path(model, "tasks.json"))
        return inputs

    # The study's raw folder (analysis/raw.py): every evaluation, the selection run, the task lists and the new
    # candidates' manifest; the table and the claims' extended-suite verdicts are read from it.
    rule raw_extended:
        input:
            unpack(extended_inputs),
            bigbench=EXT_BUILD,
        output:
            raw_folder("extended_suite"),
        log:
            "logs/raw_extended.log",
        params:
            **raw_params(),
            files=[f"{EXT_BUILD}/manifest.json"],
        script:
            "../scripts/collect_raw.py"

    def extended_params():
        own = config["distill"]["seed"]
        return [{"model": model, "own_seed": own, "fp8_variants": EXT["fp8_variants"],
                 "runs": [{"variant": v, "seed": seed, "kv_cache": kv, "lm_eval": extended_eval_path(model, v, seed, kv),
                           "trained": bool(VARIANTS.loc[(model, v)].train == "yes")}
                          for v, seed, kv in extended_runs(model)]}
                for model in EXT["models"]]

    # The study's tables (analysis/extended.py): what the claims' evaluators read for the extended-suite verdicts
    # (seeds.csv and tableB1.csv in their usual layout) and the summary with each row's minimum detectable difference.
    rule make_extended:
        input:
            raw="{root}/raw/extended_suite",
            # the power run's evaluations of the same row-seeds (the seeds study's folder where the profile has it)
            power=[f"{{root}}/raw/{name}" for name in POWER_RAWS if name != "seeds" or SEEDS],
        output:
            seeds=f"{{root}}/{EXT_FOLDER}/seeds.csv",
            fp8=f"{{root}}/{EXT_FOLDER}/tableB1.csv",
            summary=report("{root}/extended_suite.csv", caption="../report/extended_suite.rst", category="Accuracy"),
            agreement=f"{{root}}/{EXT_FOLDER}/agreement.csv",
        log:
            "logs/make_extended/{root}.log",
        params:
            models=extended_params(),
            reference=config["seeds"]["reference"] if config.get("seeds") else {"default": "swiftkv-50"},
            bootstrap=EVAL["bootstrap"],
        script:
            "../scripts/make_extended.py"
