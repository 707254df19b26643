# The profile, checked before anything else: a bad key or value stops the run with one line naming it.
import math
import re
import sys

import jsonschema
import yaml


def config_problem(config, schema_path):
    """jsonschema's most relevant error for ``config`` as one line, or None when the profile is valid."""
    schema = yaml.safe_load(Path(schema_path).read_text())
    errors = jsonschema.Draft202012Validator(schema).iter_errors(config)
    err = jsonschema.exceptions.best_match(errors)
    if err is None:
        return None
    where = ".".join(str(p) for p in err.absolute_path) or "top level"
    problem = f"config ({where}): {err.message}"
    if isinstance(err.instance, str) and err.validator == "type" and err.absolute_path:
        # a typed value given as text (--config passes every nested value as a string) that does not read as one
        keys = list(err.absolute_path)
        value = err.instance
        for key in reversed(keys):
            value = {key: value}
        snippet = yaml.safe_dump(value, default_flow_style=True).strip()
        problem += (f"; --config hands nested values over as text: put `{snippet}` (with the value you mean) in a "
                    "YAML file and pass it with --configfile FILE")
    return problem


def coerce_text(value, schema):
    """``value`` with every string the schema types otherwise (integer, number, boolean, null; objects and lists
    written as YAML text) turned into that type where it reads as one: Snakemake reads nested --config values with
    YAML's base loader, so `--config "distill={tokens: 512}"` arrives as the text '512'. Anything else is kept."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        return {k: coerce_text(v, props.get(k, extra if isinstance(extra, dict) else {})) for k, v in value.items()}
    if isinstance(value, list):
        return [coerce_text(v, schema.get("items", {})) for v in value]
    if not isinstance(value, str):
        return value
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    if not types or "string" in types:
        return value
    text = value.strip()
    for kind in types:
        if kind == "integer" and re.fullmatch(r"[-+]?\d+", text):
            return int(text)
        if kind == "number":
            try:
                number = float(text)
            except ValueError:
                continue
            if math.isfinite(number):
                return int(number) if re.fullmatch(r"[-+]?\d+", text) else number
        if kind == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if kind == "null" and text.lower() in ("null", "~", "none"):
            return None
        if kind in ("object", "array"):
            try:
                parsed = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            if isinstance(parsed, dict if kind == "object" else list):
                return coerce_text(parsed, schema)
    return value


def stop(message):
    """End the run with ``error: message`` on one line and exit status 2 (no traceback, no schema dump)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


_schema_path = Path(workflow.basedir) / "workflow/schemas/config.schema.yaml"
config.update(coerce_text(dict(config), yaml.safe_load(_schema_path.read_text())))
_problem = config_problem(config, _schema_path)
if _problem:
    stop(f"{_problem}; fix the profile (config/*.yaml, --configfile, --config)")
