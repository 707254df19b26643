# Benchmarks measured in-process (warm-up, interleaved repeats, same-run baseline).


rule bench_prefill:
    input:
        model_input,
    output:
        "results/bench/prefill/{model}.json",
    log:
        "logs/bench_prefill/{model}.log",
    benchmark:
        "benchmarks/bench_prefill/{model}.tsv"
    params:
        source=model_source,
        cfg=config["bench_prefill"],
    threads: ALL_CORES  # a timing job runs alone
    shell:
        "swiftkv bench prefill {params.source} --dtype {DTYPE} --threads {threads}"
        " --lengths {params.cfg[lengths]} --fractions {params.cfg[fractions]}"
        " --warmup {params.cfg[warmup]} --repeats {params.cfg[repeats]}"
        " --output {output} > {log} 2>&1"
