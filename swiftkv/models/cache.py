"""KV-cache size: what a transformers cache really holds, and what the SwiftKV formula says it should."""

from __future__ import annotations

import torch


def cache_bytes(cache) -> int:
    """Bytes held by the key and value tensors of a transformers ``Cache`` (empty AcrossKV slots hold none)."""
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def cached_layers(config, swiftkv: bool | None = None) -> float:
    """Number of layer-caches: L for the teacher, l + (L - l) / g for the student."""
    L = config.num_hidden_layers
    on = getattr(config, "swiftkv", False) if swiftkv is None else swiftkv
    if not on:
        return L
    l, g = config.num_key_value_layers, config.key_value_group_size
    return l + (L - l) / g


def expected_cache_bytes(
    config, seq_len: int, batch_size: int = 1, bytes_per_value: int = 2, swiftkv: bool | None = None
) -> int:
    """(l + (L - l)/g) * 2 * h_kv * d_head * seq * batch * bytes (the paper's AcrossKV memory formula).

    An MQA student (``swiftkv_key_value_heads``) caches that many KV heads in its (L - l)/g later layer-caches."""
    layers = cached_layers(config, swiftkv)
    if getattr(config, "kv_lora_rank", None):  # DeepSeek-V2's latent attention: one latent + one RoPE key per token
        return int(layers * (config.kv_lora_rank + config.qk_rope_head_dim) * seq_len * batch_size * bytes_per_value)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    mqa_heads = getattr(config, "swiftkv_key_value_heads", None)
    on = getattr(config, "swiftkv", False) if swiftkv is None else swiftkv
    if on and mqa_heads:
        l = config.num_key_value_layers
        head_layers = l * config.num_key_value_heads + (layers - l) * mqa_heads
    else:
        head_layers = layers * config.num_key_value_heads
    return int(head_layers * 2 * head_dim * seq_len * batch_size * bytes_per_value)
