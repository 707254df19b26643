"""FP8 KV-cache quantisation applied after training (paper Table B.1), as fake quantisation.

Every key and value that enters the cache is rounded to ``float8_e4m3fn`` with one scale per token (over all KV
heads and head dimensions of that layer: ``scale = amax / 448``) and immediately dequantised, so attention reads
exactly what an FP8 cache would return. The cache is a transformers ``DynamicCache`` whose ``update`` quantises;
both the teacher layers and the SwiftKV boundary K/V go through ``cache.update``, so it covers every layer of
both teacher and student, with and without AcrossKV. Memory is not actually saved here (values are stored
dequantised); :func:`kv_memory` gives the footprint an FP8 cache would have.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache

from swiftkv.models.cache import cached_layers

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448


def fake_quant_fp8_per_token(x: torch.Tensor) -> torch.Tensor:
    """Round x (B, H, S, D) to FP8 e4m3 with one scale per (batch, token) over heads and head dims."""
    amax = x.detach().abs().amax(dim=(1, 3), keepdim=True).float()  # B,1,S,1
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return (q.float() * scale).to(x.dtype)


class FP8FakeQuantCache(DynamicCache):
    """A ``DynamicCache`` that stores (and returns) keys and values after an FP8 per-token round trip."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(
            fake_quant_fp8_per_token(key_states), fake_quant_fp8_per_token(value_states), layer_idx, *args, **kwargs
        )


KV_CACHES = ("native", "fp8")


def make_cache_factory(kind: str):
    """``native`` -> None (the model's own cache); ``fp8`` -> a callable(config) building an FP8 fake-quant cache."""
    if kind == "native":
        return None
    if kind == "fp8":
        return lambda config: FP8FakeQuantCache(config=config)
    raise ValueError(f"unknown KV cache {kind!r}; use one of {', '.join(KV_CACHES)}")


def cached_kv_heads(config) -> float:
    """KV heads held in the cache per token, summed over layers: L * h_kv for the teacher, l * h_kv + (L - l) / g *
    h_kv' for the student (h_kv' = ``swiftkv_key_value_heads`` for an MQA-style student, else h_kv)."""
    h_kv = config.num_key_value_heads
    if not getattr(config, "swiftkv", False):
        return config.num_hidden_layers * h_kv
    l = config.num_key_value_layers
    later = cached_layers(config) - l  # (L - l) / g
    return l * h_kv + later * (getattr(config, "swiftkv_key_value_heads", None) or h_kv)


def kv_memory(config, kind: str = "native", baseline_bytes: int = 2) -> dict:
    """KV-cache bytes per token of this config relative to the base model with a ``baseline_bytes`` (bf16) cache.

    ``reduction`` follows the paper (values only); ``reduction_with_scales`` also counts the FP8 cache's one fp32
    scale per token per cached K and V tensor.
    """
    L, h_kv = config.num_hidden_layers, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    heads = cached_kv_heads(config)
    value_bytes = 1 if kind == "fp8" else baseline_bytes
    scale_bytes = 4 if kind == "fp8" else 0
    base = L * h_kv * head_dim * baseline_bytes
    layers = cached_layers(config)
    return {
        "kv_cache": kind,
        "cached_layers": layers,
        "cached_kv_heads": heads,
        "num_hidden_layers": L,
        "bytes_per_value": value_bytes,
        "baseline_bytes_per_value": baseline_bytes,
        "reduction": 1 - heads * head_dim * value_bytes / base,
        "reduction_with_scales": 1 - (heads * head_dim * value_bytes + layers * scale_bytes) / base,
    }
