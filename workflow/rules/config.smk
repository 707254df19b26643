# The profile, checked before anything else: a bad key or value stops the run with one line naming it.
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
    return f"config ({where}): {err.message}"


def stop(message):
    """End the run with ``error: message`` on one line and exit status 2 (no traceback, no schema dump)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


_problem = config_problem(config, Path(workflow.basedir) / "workflow/schemas/config.schema.yaml")
if _problem:
    stop(f"{_problem}; fix the profile (config/*.yaml, --configfile, --config)")
