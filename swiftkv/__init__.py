"""swiftkv: SwiftKV (SingleInputKV + AcrossKV + distillation) for transformers models.

``import swiftkv`` registers the SwiftKV model types (``llama_swiftkv``, ``mistral_swiftkv``, ``qwen2_swiftkv``)
with transformers' Auto classes, so ``AutoModelForCausalLM.from_pretrained`` loads SwiftKV checkpoints.
"""

from swiftkv.convert import convert_to_swiftkv, set_trainable
from swiftkv.errors import SwiftKVError
from swiftkv.models import register

__version__ = "0.1.0"

register()

__all__ = ["convert_to_swiftkv", "register", "set_trainable", "SwiftKVError", "__version__"]
