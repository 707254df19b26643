"""SwiftKV configs (Snowflake's checkpoint format), importing nothing but transformers' config classes.

Kept apart from the model classes (``swiftkv/models``, written against one transformers version) so that other
runtimes — the vLLM plugin, whose venv pins an older transformers — can read SwiftKV checkpoints' ``config.json``.
"""

from __future__ import annotations

from transformers import AutoConfig, LlamaConfig, MistralConfig, Qwen2Config

from swiftkv.errors import SwiftKVError

SWIFTKV_CONFIG_KEYS = ("swiftkv", "num_key_value_layers", "key_value_group_size")


def validate_swiftkv_config(config) -> None:
    """Check l and g of a SwiftKV config; raise one clear line if they are inconsistent."""
    L = config.num_hidden_layers
    l, g = config.num_key_value_layers, config.key_value_group_size
    if not isinstance(l, int) or not 1 <= l <= L:
        raise SwiftKVError(
            f"num_key_value_layers={l} is outside [1, {L}] for a {L}-layer model; pick l with 1 <= l <= {L}"
        )
    if not isinstance(g, int) or g < 1 or (L - l) % g:
        divisors = [d for d in range(1, L - l + 1) if (L - l) % d == 0] or [1]
        raise SwiftKVError(
            f"key_value_group_size={g} does not divide the {L - l} layers after l={l}; use one of {divisors}"
        )
    n_kv = getattr(config, "swiftkv_key_value_heads", None)
    if n_kv is not None:  # MQA-style student: fewer KV heads in the SwiftKV K/V of layers >= l
        heads, kv = config.num_attention_heads, config.num_key_value_heads
        if not isinstance(n_kv, int) or n_kv < 1 or heads % n_kv or kv % n_kv:
            options = [d for d in range(1, kv + 1) if kv % d == 0 and heads % d == 0]
            raise SwiftKVError(
                f"swiftkv_key_value_heads={n_kv} must divide both the {heads} attention heads and the {kv} KV heads; "
                f"use one of {options}"
            )


def init_swiftkv_config_fields(config) -> None:
    """Fill defaults the way the reference does: l defaults to L (no SwiftKV), g to 1."""
    if config.num_key_value_layers is None:
        config.num_key_value_layers = config.num_hidden_layers
    if config.key_value_group_size is None:
        config.key_value_group_size = 1


class LlamaSwiftKVConfig(LlamaConfig):
    model_type = "llama_swiftkv"

    # SwiftKV: runtime switch (True = student), l, and the AcrossKV group size g
    swiftkv: bool = False
    num_key_value_layers: int | None = None
    key_value_group_size: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        init_swiftkv_config_fields(self)
        validate_swiftkv_config(self)


class MistralSwiftKVConfig(MistralConfig):
    model_type = "mistral_swiftkv"

    # SwiftKV: runtime switch (True = student), l, and the AcrossKV group size g
    swiftkv: bool = False
    num_key_value_layers: int | None = None
    key_value_group_size: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        init_swiftkv_config_fields(self)
        validate_swiftkv_config(self)


class Qwen2SwiftKVConfig(Qwen2Config):
    model_type = "qwen2_swiftkv"

    # SwiftKV: runtime switch (True = student), l, and the AcrossKV group size g
    swiftkv: bool = False
    num_key_value_layers: int | None = None
    key_value_group_size: int | None = None

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        init_swiftkv_config_fields(self)
        validate_swiftkv_config(self)


SWIFTKV_CONFIGS: tuple[type, ...] = (LlamaSwiftKVConfig, MistralSwiftKVConfig, Qwen2SwiftKVConfig)


def register_configs() -> None:
    """Register the SwiftKV configs with ``AutoConfig`` (idempotent)."""
    for config_class in SWIFTKV_CONFIGS:
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
