# Shared helpers for the rules: model sources and wildcard constraints.
import hashlib
import json

MODELS = {m["id"]: m for m in config["models"]}


wildcard_constraints:
    model="[a-z0-9][a-z0-9.-]*",


def model_spec(model):
    try:
        return MODELS[model]
    except KeyError:
        raise ValueError(f"model {model!r} is not in config 'models' ({', '.join(MODELS)}); add it to the profile")


def model_source(wildcards):
    """What the CLI gets as MODEL: an embedded id (prepared under resources/) or a hub id."""
    spec = model_spec(wildcards.model)
    return spec["hub_id"] if spec["source"] == "hub" else wildcards.model


def model_input(wildcards):
    """Embedded models need resources/models/<id> prepared first; hub models need nothing local."""
    spec = model_spec(wildcards.model)
    return [f"resources/models/{wildcards.model}"] if spec["source"] == "embedded" else []


def config_hash():
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
