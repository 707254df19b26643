"""SwiftKV model classes per family, and their registration with transformers' Auto classes."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import AutoModelForCausalLM

from swiftkv._autoregister import done as _registered
from swiftkv.configuration import (
    DeepseekV2SwiftKVConfig,
    LlamaSwiftKVConfig,
    MistralSwiftKVConfig,
    Qwen2SwiftKVConfig,
    Qwen3SwiftKVConfig,
    register_configs,
)
from swiftkv.models.deepseek_v2 import DeepseekV2SwiftKVForCausalLM
from swiftkv.models.llama import LlamaSwiftKVForCausalLM
from swiftkv.models.mistral import MistralSwiftKVForCausalLM
from swiftkv.models.qwen2 import Qwen2SwiftKVForCausalLM
from swiftkv.models.qwen3 import Qwen3SwiftKVForCausalLM


@dataclass(frozen=True)
class Family:
    base_model_type: str  # model_type of the plain transformers config
    config_class: type
    model_class: type

    @property
    def model_type(self) -> str:
        return self.config_class.model_type


FAMILIES: dict[str, Family] = {
    f.base_model_type: f
    for f in (
        Family("llama", LlamaSwiftKVConfig, LlamaSwiftKVForCausalLM),
        Family("mistral", MistralSwiftKVConfig, MistralSwiftKVForCausalLM),
        Family("qwen2", Qwen2SwiftKVConfig, Qwen2SwiftKVForCausalLM),
        Family("qwen3", Qwen3SwiftKVConfig, Qwen3SwiftKVForCausalLM),
        Family("deepseek_v2", DeepseekV2SwiftKVConfig, DeepseekV2SwiftKVForCausalLM),
    )
}
SWIFTKV_MODEL_TYPES = {f.model_type for f in FAMILIES.values()}


def register() -> None:
    """Register the SwiftKV configs and models with ``AutoConfig`` / ``AutoModelForCausalLM`` (idempotent)."""
    register_configs()
    for family in FAMILIES.values():
        AutoModelForCausalLM.register(family.config_class, family.model_class, exist_ok=True)


register()  # importing the model classes makes them loadable through the Auto classes (swiftkv._autoregister)
_registered(__name__)

__all__ = [
    "DeepseekV2SwiftKVConfig",
    "DeepseekV2SwiftKVForCausalLM",
    "FAMILIES",
    "SWIFTKV_MODEL_TYPES",
    "Family",
    "register",
    "LlamaSwiftKVConfig",
    "LlamaSwiftKVForCausalLM",
    "MistralSwiftKVConfig",
    "MistralSwiftKVForCausalLM",
    "Qwen2SwiftKVConfig",
    "Qwen2SwiftKVForCausalLM",
    "Qwen3SwiftKVConfig",
    "Qwen3SwiftKVForCausalLM",
]
