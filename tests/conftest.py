"""Shared fixtures: tiny random models of each supported family (fp32, fixed seeds)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

import swiftkv  # noqa: F401  (registers the SwiftKV model types)

TINY = dict(
    vocab_size=101,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.2,  # large enough that greedy continuations are not degenerate
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=None,
)

FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
}


def tiny_base(family: str = "llama", seed: int = 0, **overrides):
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(seed)
    config = config_cls(**{**TINY, **extra, **overrides})
    config._attn_implementation = overrides.pop("attn_implementation", "sdpa")
    return model_cls(config).eval()


@pytest.fixture(params=list(FAMILIES))
def family(request) -> str:
    return request.param


def random_ids(batch: int, length: int, seed: int = 1, vocab: int = TINY["vocab_size"]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (batch, length), generator=gen)


def left_padded(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of lengths 12 and 8, left-padded with pad id 0."""
    ids = random_ids(2, 12, seed)
    mask = torch.ones_like(ids)
    ids[1, :4] = 0
    mask[1, :4] = 0
    return ids, mask
