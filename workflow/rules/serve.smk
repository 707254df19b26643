# Rules of the serve stage (see the Snakefile index): serving benchmarks, paper section 4.2.
#
#   results/bench/serve/{engine}/{model}/{study}.json   one study on one engine (swiftkv bench serve)
#   <root>/raw/serving/{study}                         a study's results on every engine, with a manifest
#   <root>/figure3_throughput.png, <root>/figure4_latency.png, <root>/table3.csv, <root>/tableA3.csv  (roots.smk)
#
# Engines: hf-cpu / hf-cuda (transformers generate() with the SwiftKV prefill skip, variants wired in-process),
# vllm-cpu (the CPU build of vLLM in its own venv, bin/vllm-env), vllm-gpu (a CUDA vLLM, with the arctic-inference
# plugin for SwiftKV rows). Each vLLM variant runs with an explicit VLLM_PLUGINS, set by `swiftkv bench serve`
# (swiftkv.bench.serving.vllm.VllmEngine.plugins): arctic_inference for rows with ARCTIC_INFERENCE_ENABLED=1, swiftkv (ours)
# for the other SwiftKV rows, none for base rows. A study whose engine cannot run here (no GPU, no vLLM) writes a
# result marked "not measured here" with the reason, so the report shows the paper's numbers beside that line.
import json
import shlex

SERVE = config.get("serve", {})
SERVE_ENGINES = {
    "hf-cpu": {"engine": "hf", "device": "cpu"},
    "hf-cuda": {"engine": "hf", "device": "cuda"},
    "vllm-cpu": {"engine": "vllm", "device": "cpu"},
    "vllm-gpu": {"engine": "vllm", "device": "cuda"},
}
SERVE_STUDIES = ("throughput", "latency", "kv-limit", "sharegpt")


def variant_row(model, variant):
    """A row of the profile's variants sheet (common.smk's validated VARIANTS)."""
    if VARIANTS is None or (model, variant) not in VARIANTS.index:
        raise ValueError(f"variant {variant!r} of {model!r} is not in the variants sheet; add the row first")
    return VARIANTS.loc[(model, variant)]


def swiftkv_fields(model, variant):
    """l, g and label of a variants.tsv row (a base row has no l)."""
    row = variant_row(model, variant)
    fields = {"label": "Base" if variant == "base" else row["label"]}
    if variant != "base":
        fields["num_key_value_layers"] = int(row["num_key_value_layers"])
        fields["key_value_group_size"] = int(row["key_value_group_size"])
    return fields


def variant_l(wildcards):
    return swiftkv_fields(wildcards.model, wildcards.variant)["num_key_value_layers"]


def variant_g(wildcards):
    return swiftkv_fields(wildcards.model, wildcards.variant)["key_value_group_size"]


def vllm_model_path(model, entry):
    """Where a vLLM variant's weights are: the base model, an untrained conversion, a distilled checkpoint, or as given."""
    kind = entry.get("model", "base")
    if kind == "base":
        spec = model_spec(model)
        return spec["hub_id"] if spec["source"] == "hub" else f"resources/models/{model}"
    if kind == "converted":
        return f"results/converted/{model}/{entry['id']}"
    if kind == "distilled":
        return f"results/checkpoints/{model}/{entry['id']}"
    return kind


def serve_variant_specs(wildcards):
    """The --variant JSON objects of one engine, from the profile and config/variants.tsv."""
    kind = SERVE_ENGINES[wildcards.engine]["engine"]
    specs = []
    if kind == "hf":
        for variant in SERVE["hf"]["variants"]:
            specs.append({"id": variant, **swiftkv_fields(wildcards.model, variant)})
    else:
        for entry in SERVE["vllm"]["variants"]:
            spec = {"id": entry["id"], "model": vllm_model_path(wildcards.model, entry),
                    "env": entry.get("env", {}), "args": entry.get("args", [])}
            if VARIANTS is not None and (wildcards.model, entry["id"]) in VARIANTS.index:
                spec.update(swiftkv_fields(wildcards.model, entry["id"]))
            specs.append(spec)
    return specs


# The vLLM environments, each recorded (its versions) by a rule before a job uses it: the CPU build in its own venv
# (bin/vllm-env, made by bin/setup-vllm-cpu on first use: default and CI profiles), and the CUDA vLLM that
# serve.vllm.command_gpu runs (the paper profile: `vllm` of the main environment, or a path the profile gives). A
# profile that serves on GPUs only never builds the CPU venv.
VLLM_ENV_RECORDS = {"cpu": "results/envs/vllm-cpu.txt", "cuda": "results/envs/vllm-gpu.txt"}


def vllm_env_records():
    """The records of the vLLM environments this profile uses: its vLLM engines' (serve.engines), and the CPU
    build's where it measures served fidelity."""
    devices = {SERVE_ENGINES[e]["device"] for e in SERVE.get("engines", []) if SERVE_ENGINES[e]["engine"] == "vllm"}
    if config.get("served_fidelity"):
        devices.add("cpu")
    return [VLLM_ENV_RECORDS[d] for d in ("cpu", "cuda") if d in devices]


def serve_inputs(wildcards):
    """Model directories, the vLLM environment and the ShareGPT selection a study needs."""
    engine = SERVE_ENGINES[wildcards.engine]
    inputs = {"model": model_input(wildcards)}
    if engine["engine"] == "vllm":
        inputs["vllm_env"] = VLLM_ENV_RECORDS[engine["device"]]
        inputs["variants"] = [s["model"] for s in serve_variant_specs(wildcards)
                              if s["model"].startswith("results/")]
    if wildcards.study == "sharegpt":
        inputs["requests"] = f"results/bench/serve/requests/{wildcards.model}/sharegpt.json"
    return inputs


def serve_request(wildcards, input, output, threads):
    """The arguments of one (engine, model, study) run: the profile's sizes as the library's typed request
    (swiftkv.bench.serving.run.ServeRequest), written out by its own to_args."""
    from swiftkv.bench.serving.run import ServeRequest

    engine, study = SERVE_ENGINES[wildcards.engine], wildcards.study
    r = {"model": model_source(wildcards), "engine": engine["engine"], "device": engine["device"], "study": study,
         "seed": SERVE.get("seed", 0), "dtype": DTYPE, "threads": threads, "on_unavailable": "mark",
         "variant": [json.dumps(spec) for spec in serve_variant_specs(wildcards)], "output": output[0]}
    if study == "sharegpt":
        r["requests"] = input.requests
    else:
        w = SERVE[study.replace("-", "_")]  # throughput / latency / kv_limit
        r.update(input_lens=w.get("input_lens") or [w["input_len"]], output_len=w["output_len"],
                 num_requests=w["num_requests"], request_rates=w.get("request_rates"), kv_limits_mib=w.get("limits_mib"))
    r["noise_floor"] = SERVE[engine["engine"]].get("noise_floor", False)
    if engine["engine"] == "hf":
        r.update({k: SERVE["hf"][k] for k in ("batch_size", "warmup", "repeats")})
    else:
        v = SERVE["vllm"]
        r.update(vllm_command=v["command_cpu"] if engine["device"] == "cpu" else v["command_gpu"],
                 kv_cache_mib=v["kv_cache_mib"], warmup=v["warmup"], repeats=v["repeats"])
        r["workdir"] = f"results/bench/serve/{wildcards.engine}/{wildcards.model}/{study}.runs"
        if v.get("tensor_parallel_size", 1) > 1:
            r["vllm_args"] = f"--tensor-parallel-size {v['tensor_parallel_size']}"
    return shlex.join(ServeRequest(**r).to_args())


def serve_gpus(wildcards):
    """GPUs of one serving run: none on a CPU engine; on a CUDA engine the profile's resources.serve.gpu, and for
    vllm-gpu at least serve.vllm.tensor_parallel_size."""
    engine = SERVE_ENGINES[wildcards.engine]
    if engine["device"] != "cuda":
        return 0
    tensor_parallel = SERVE["vllm"].get("tensor_parallel_size", 1) if engine["engine"] == "vllm" else 1
    return max(config["resources"]["serve"]["gpu"], tensor_parallel)


def serve_resources():
    """bench_serve's resources: the profile's serve memory and time, the engine's GPUs (serve_gpus)."""
    return {**job_resources("serve"), "gpu": serve_gpus}


def cpu_serve_resources():
    """served_fidelity's resources: the profile's serve memory and time, no GPU (it serves with the CPU build)."""
    return {**job_resources("serve"), "gpu": 0}


rule setup_vllm_cpu:
    output:
        VLLM_ENV_RECORDS["cpu"],
    log:
        "logs/setup_vllm_cpu.log",
    shell:
        "bin/vllm-env --check > {output} 2> {log}"


rule record_vllm_gpu:
    output:
        VLLM_ENV_RECORDS["cuda"],
    log:
        "logs/record_vllm_gpu.log",
    params:
        command=SERVE.get("vllm", {}).get("command_gpu", "vllm"),
    shell:
        "{params.command} --version > {output} 2> {log}"


rule convert_swiftkv_untrained:
    input:
        model_input,
    output:
        directory("results/converted/{model}/{variant}"),
    log:
        "logs/convert_swiftkv_untrained/{model}/{variant}.log",
    params:
        source=model_source,
        l=variant_l,
        g=variant_g,
    resources:
        **job_resources("prepare"),
    shell:
        "swiftkv convert {params.source} -l {params.l} -g {params.g} --dtype float32 -o {output} > {log} 2>&1"


rule select_sharegpt_requests:
    input:
        model_input,
    output:
        "results/bench/serve/requests/{model}/sharegpt.json",
    log:
        "logs/select_sharegpt_requests/{model}.log",
    params:
        source=model_source,
        cfg=SERVE.get("sharegpt", {}),
    shell:
        "swiftkv bench sharegpt-requests {params.source} --split {params.cfg[split]}"
        " --min-ratios {params.cfg[min_ratios]} --num-requests {params.cfg[num_requests]}"
        " --max-input-len {params.cfg[max_input_len]} --max-output-len {params.cfg[max_output_len]}"
        " --output {output} > {log} 2>&1"


rule bench_serve:
    input:
        unpack(serve_inputs),
    output:
        "results/bench/serve/{engine}/{model}/{study}.json",
    wildcard_constraints:
        engine="|".join(SERVE_ENGINES),
        study="|".join(SERVE_STUDIES),
    log:
        "logs/bench_serve/{engine}/{model}/{study}.log",
    benchmark:
        "benchmarks/bench_serve/{engine}/{model}/{study}.tsv"
    params:
        args=serve_request,
    resources:
        **serve_resources(),
    threads: ALL_CORES  # a timing job runs alone
    shell:
        "swiftkv bench serve {params.args} > {log} 2>&1"


def serve_results(study):
    return expand("results/bench/serve/{engine}/{model}/{study}.json", engine=SERVE.get("engines", []),
                  model=SERVE.get("models", []), study=study)


# The serving results behind a study's figure or table, collected as the run's raw folder serving/<study> with a
# manifest (analysis/raw.py), so that the figure, the table and the claims they decide are re-derived from it.
rule raw_serving:
    input:
        lambda w: serve_results(w.study),
    output:
        directory(serving_raw("{study}", RUN)),
    wildcard_constraints:
        study="|".join(SERVE_STUDIES),
    log:
        "logs/raw_serving/{study}.log",
    params:
        **raw_params(),
    script:
        "../scripts/collect_raw.py"


rule plot_figure3:
    input:
        raw=serving_raw("throughput", "{root}"),
    output:
        report("{root}/figure3_throughput.png", caption="../report/figure3_throughput.rst", category="Serving"),
    log:
        "logs/plot_figure3/{root}.log",
    params:
        sources=serve_results("throughput"),
    script:
        "../scripts/plot_figure3.py"


rule plot_figure4:
    input:
        raw=serving_raw("latency", "{root}"),
    output:
        report("{root}/figure4_latency.png", caption="../report/figure4_latency.rst", category="Serving"),
    log:
        "logs/plot_figure4/{root}.log",
    params:
        sources=serve_results("latency"),
    script:
        "../scripts/plot_figure4.py"


rule make_table3:
    input:
        raw=serving_raw("kv-limit", "{root}"),
    output:
        report("{root}/table3.csv", caption="../report/table3.rst", category="Serving"),
    log:
        "logs/make_table3/{root}.log",
    params:
        sources=serve_results("kv-limit"),
    script:
        "../scripts/make_table3.py"


rule make_table_a3:
    input:
        raw=serving_raw("sharegpt", "{root}"),
    output:
        report("{root}/tableA3.csv", caption="../report/tableA3.rst", category="Serving"),
    log:
        "logs/make_table_a3/{root}.log",
    params:
        sources=serve_results("sharegpt"),
    script:
        "../scripts/make_table_a3.py"


# -- served-model fidelity (issue 18, part 3): the plugin-served student against the transformers student ----------

SERVED_FIDELITY = config.get("served_fidelity")  # null or absent: a profile without it (CI: the slow test guards it)


rule served_fidelity:
    input:
        model=model_input,
        heldout="results/tasks/heldout-ppl/{model}",
        vllm_env=VLLM_ENV_RECORDS["cpu"],
    output:
        "results/served_fidelity/{model}.json",
    log:
        "logs/served_fidelity/{model}.log",
    benchmark:
        "benchmarks/served_fidelity/{model}.tsv"
    params:
        source=model_source,
        cfg=SERVED_FIDELITY or {},
        groups=" ".join(str(g) for g in SERVED_FIDELITY["group_sizes"]) if SERVED_FIDELITY else "",
        workdir="results/served_fidelity/{model}.runs",
    resources:
        **cpu_serve_resources(),
    threads: ALL_CORES
    shell:
        "swiftkv bench served-fidelity {params.source} --name {wildcards.model} -l {params.cfg[num_key_value_layers]}"
        " -g {params.groups} --num-prompts {params.cfg[num_prompts]} --new-tokens {params.cfg[new_tokens]}"
        " --top-k {params.cfg[top_k]} --heldout {input.heldout}/conversations.jsonl --workdir {params.workdir}"
        " --overwrite --output {output} > {log} 2>&1"


def served_fidelity_results():
    return expand("results/served_fidelity/{model}.json", model=SERVED_FIDELITY["models"]) if SERVED_FIDELITY else []


rule raw_served_fidelity:
    input:
        served_fidelity_results(),
    output:
        raw_folder("served_fidelity"),
    log:
        "logs/raw_served_fidelity.log",
    params:
        **raw_params(),
    script:
        "../scripts/collect_raw.py"


rule make_table_serving_fidelity:
    input:
        raw="{root}/raw/served_fidelity",
    output:
        report("{root}/table_serving_fidelity.csv", caption="../report/table_serving_fidelity.rst", category="Serving"),
    log:
        "logs/make_table_serving_fidelity/{root}.log",
    params:
        sources=served_fidelity_results(),
    script:
        "../scripts/make_table_serving_fidelity.py"
