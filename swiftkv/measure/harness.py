"""lm-eval's own command line with SwiftKV registered: ``python -m swiftkv.measure.harness <lm_eval arguments>``.

lm-eval 0.4.13 has no plugin hook for model types, and ``--model hf`` loads checkpoints through
``AutoModelForCausalLM``, which knows ``llama_swiftkv`` / ``qwen2_swiftkv`` / ``mistral_swiftkv`` only once
``swiftkv`` is imported. This module imports it (which also registers the lm-eval model ``swiftkv``: HFLM with
the prefill skip and the ``kv_cache=fp8`` option) and hands over to lm-eval's CLI unchanged:

    python -m swiftkv.measure.harness --model hf --model_args pretrained=results/checkpoints/smollm2-135m/swiftkv-50 \\
        --tasks <tasks> --include_path <task dir> --device cpu
    python -m swiftkv.measure.harness --model swiftkv --model_args pretrained=<checkpoint>,kv_cache=fp8 ...

Without this module, the same one line is ``python -c "import swiftkv; from lm_eval.__main__ import
cli_evaluate; cli_evaluate()" <lm_eval arguments>``.
"""

import sys

import swiftkv


def shadowing_folder(module) -> str | None:
    """The folder that ``import swiftkv`` picked up instead of the package, or None when it got the package.

    ``python -m`` puts the working directory first on ``sys.path``: a folder named ``swiftkv`` there (e.g. a clone of
    this repository) is imported as an empty namespace package, which registers nothing."""
    if getattr(module, "__file__", None) is None:
        return ", ".join(getattr(module, "__path__", [])) or "a folder named swiftkv"
    return None


if __name__ == "__main__":
    shadow = shadowing_folder(swiftkv)
    if shadow:
        print(f"error: 'import swiftkv' found the folder {shadow} in the working directory instead of the installed "
              "package, so no SwiftKV model type is registered; run this command from another directory (or from "
              "inside the checkout)", file=sys.stderr)
        sys.exit(2)
    swiftkv.register()  # transformers: SwiftKV model types
    from lm_eval.__main__ import cli_evaluate

    import swiftkv.measure.lm  # noqa: F401  (lm-eval: model "swiftkv")

    cli_evaluate()
