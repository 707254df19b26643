"""lm-eval's own command line with SwiftKV registered: ``python -m swiftkv.harness <lm_eval arguments>``.

lm-eval 0.4.13 has no plugin hook for model types, and ``--model hf`` loads checkpoints through
``AutoModelForCausalLM``, which knows ``llama_swiftkv`` / ``qwen2_swiftkv`` / ``mistral_swiftkv`` only once
``swiftkv`` is imported. This module imports it (which also registers the lm-eval model ``swiftkv``: HFLM with
the prefill skip and the ``kv_cache=fp8`` option) and hands over to lm-eval's CLI unchanged:

    python -m swiftkv.harness --model hf --model_args pretrained=results/checkpoints/smollm2-135m/swiftkv-50 \\
        --tasks <tasks> --include_path <task dir> --device cpu
    python -m swiftkv.harness --model swiftkv --model_args pretrained=<checkpoint>,kv_cache=fp8 ...

Without this module, the same one line is ``python -c "import swiftkv; from lm_eval.__main__ import
cli_evaluate; cli_evaluate()" <lm_eval arguments>``.
"""

import swiftkv  # noqa: F401  (transformers: SwiftKV model types)
import swiftkv.evaluate  # noqa: F401  (lm-eval: model "swiftkv")
from lm_eval.__main__ import cli_evaluate

if __name__ == "__main__":
    cli_evaluate()
