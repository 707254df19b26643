"""SwiftKV configs (Snowflake's checkpoint format), importing nothing but transformers' config classes.

Kept apart from the model classes (``swiftkv/models``, written against one transformers version) so that other
runtimes — the vLLM plugin, whose venv pins an older transformers — can read SwiftKV checkpoints' ``config.json``.

Every ``config.json`` these classes write carries transformers 5.x's ``rope_parameters`` and ``dtype`` *and* the keys
transformers 4.x reads instead (``rope_theta``, ``rope_scaling``, ``torch_dtype``): Snowflake's training code pins
transformers 4.x, which ignores ``rope_parameters`` and would silently use ``rope_theta = 10000`` and no llama3
scaling. transformers 5.x turns the 4.x keys back into the same ``rope_parameters``, so one checkpoint loads
identically under both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import AutoConfig, DeepseekV2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from swiftkv._autoregister import done as _registered
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


def transformers4_config_keys(config_dict: dict, scaling_type_key: bool = False) -> dict:
    """The keys transformers 4.x reads for what a 5.x config dict holds in ``rope_parameters`` and ``dtype``.

    - ``rope_theta``: the base frequency (4.x defaults to 10000 without it);
    - ``rope_scaling``: ``None`` for plain RoPE, else ``rope_parameters`` without ``rope_theta`` (4.x's form, e.g.
      ``{"rope_type": "llama3", "factor": 8.0, ...}``), which 5.x merges back with ``rope_theta`` on load; with
      ``scaling_type_key`` also ``type`` (= ``rope_type``), the older name that DeepSeek-V2's 4.x-era model code
      (its hub code, which Snowflake's ``deepseek_v2_swiftkv`` builds on) reads;
    - ``torch_dtype``: the name 4.x before 4.56 reads for ``dtype``.

    RoPE parameters nested per layer type have no 4.x form and are left out (none of our families has them).
    """
    keys = {}
    rope = config_dict.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        keys["rope_theta"] = rope["rope_theta"]
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        keys["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
        if keys["rope_scaling"] and scaling_type_key:
            keys["rope_scaling"].setdefault("type", scaling["rope_type"])
    if config_dict.get("dtype") is not None:
        keys["torch_dtype"] = config_dict["dtype"]
    return keys


def add_transformers4_keys(config_json: str | os.PathLike) -> None:
    """Add the transformers 4.x keys to a ``config.json`` written by transformers 5.x (for base models)."""
    path = Path(config_json)
    config = json.loads(path.read_text())
    config.update(transformers4_config_keys(config))
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


class SwiftKVConfigMixin:
    """What the SwiftKV configs share (listed first in the bases): l and g defaults and checks after init, and a
    ``config.json`` that transformers 4.x reads correctly too.

    The 4.x keys are added to the JSON text (``to_json_string`` is what ``save_pretrained`` and ``to_json_file``
    write), not to ``to_dict()``: that stays the 5.x view, and 5.x's diff serialiser would otherwise read the
    deprecated ``torch_dtype`` property and warn on every save and load.
    """

    # The SwiftKV fields, declared once here and added to each config dataclass by __init_subclass__: the runtime
    # switch (True = student), l, the AcrossKV group size g, and the KV heads of an MQA-style student's SwiftKV K/V
    # in layers >= l (None: the model's own; not part of Snowflake's format, written only when set).
    SWIFTKV_FIELDS = {"swiftkv": (bool, False), "num_key_value_layers": (int | None, None),
                      "key_value_group_size": (int | None, None), "swiftkv_key_value_heads": (int | None, None)}

    def __init_subclass__(cls, **kwargs):
        annotations = cls.__dict__.get("__annotations__", {})
        for name, (kind, default) in SwiftKVConfigMixin.SWIFTKV_FIELDS.items():
            annotations.setdefault(name, kind)
            if name not in cls.__dict__:
                setattr(cls, name, default)
        cls.__annotations__ = annotations
        super().__init_subclass__(**kwargs)  # transformers makes the class a dataclass here, with these fields

    # whether config.json's rope_scaling also names its type the 4.x-era way (``type``), for the family's old code
    ROPE_SCALING_TYPE_KEY = False

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        init_swiftkv_config_fields(self)
        validate_swiftkv_config(self)
        rope = getattr(self, "rope_parameters", None)
        if isinstance(rope, dict) and "type" in rope and rope.get("type") == rope.get("rope_type"):
            del rope["type"]  # the 4.x alias lives in config.json only: the in-memory view stays 5.x's

    def to_json_string(self, use_diff: bool = True) -> str:
        config = json.loads(super().to_json_string(use_diff=use_diff))
        if config.get("swiftkv_key_value_heads") is None:  # Snowflake's format has no such key: only an MQA student
            config.pop("swiftkv_key_value_heads", None)
        config.update(transformers4_config_keys(config, self.ROPE_SCALING_TYPE_KEY))
        return json.dumps(config, indent=2, sort_keys=True) + "\n"


class LlamaSwiftKVConfig(SwiftKVConfigMixin, LlamaConfig):
    model_type = "llama_swiftkv"


class MistralSwiftKVConfig(SwiftKVConfigMixin, MistralConfig):
    model_type = "mistral_swiftkv"


class Qwen2SwiftKVConfig(SwiftKVConfigMixin, Qwen2Config):
    model_type = "qwen2_swiftkv"


class Qwen3SwiftKVConfig(SwiftKVConfigMixin, Qwen3Config):
    model_type = "qwen3_swiftkv"


class DeepseekV2SwiftKVConfig(SwiftKVConfigMixin, DeepseekV2Config):
    model_type = "deepseek_v2_swiftkv"
    ROPE_SCALING_TYPE_KEY = True  # DeepSeek-V2's hub model code (and Snowflake's on top of it) reads rope_scaling["type"]


SWIFTKV_CONFIGS: tuple[type, ...] = (LlamaSwiftKVConfig, MistralSwiftKVConfig, Qwen2SwiftKVConfig, Qwen3SwiftKVConfig,
                                     DeepseekV2SwiftKVConfig)


def register_configs() -> None:
    """Register the SwiftKV configs with ``AutoConfig`` (idempotent)."""
    for config_class in SWIFTKV_CONFIGS:
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)


register_configs()  # importing the configs makes them known to AutoConfig (swiftkv._autoregister)
_registered(__name__)
