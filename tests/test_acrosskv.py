"""AcrossKV: the layers of a group share one K/V, and the cache holds only one entry per group."""

from __future__ import annotations

import pytest
import torch

from swiftkv import convert_to_swiftkv
from swiftkv.models.cache import cache_bytes, expected_cache_bytes
from tests.conftest import random_ids, tiny_base


@torch.no_grad()
def test_group_members_see_identical_key_values():
    base = tiny_base(num_hidden_layers=7)
    model = convert_to_swiftkv(base, 3, 2)  # later layers 3..6: groups {3,4}, {5,6}
    seen = {}

    def grab(idx):
        def hook(module, args, kwargs, output):
            seen[idx] = kwargs["swiftkv_key_value"]
        return hook

    hooks = [model.model.layers[j].self_attn.register_forward_hook(grab(j), with_kwargs=True) for j in range(3, 7)]
    model(random_ids(1, 10))
    for h in hooks:
        h.remove()
    assert seen[3][0] is seen[4][0] and seen[3][1] is seen[4][1]
    assert seen[5][0] is seen[6][0]
    assert not torch.equal(seen[3][0], seen[5][0])
    # only leaders own K/V projections
    attn = [model.model.layers[j].self_attn for j in range(7)]
    assert [hasattr(a, "k_proj_swiftkv") for a in attn] == [False, False, False, True, False, True, False]
    assert [hasattr(a, "q_proj_swiftkv") for a in attn] == [False, False, False, True, True, True, True]


@torch.no_grad()
def test_leader_init_is_group_mean():
    base = tiny_base(num_hidden_layers=6)
    model = convert_to_swiftkv(base, 2, 2)
    layers = base.model.layers
    expected = (layers[2].self_attn.k_proj.weight + layers[3].self_attn.k_proj.weight) / 2
    torch.testing.assert_close(model.model.layers[2].self_attn.k_proj_swiftkv.weight, expected)
    torch.testing.assert_close(model.model.layers[5].self_attn.q_proj_swiftkv.weight, layers[5].self_attn.q_proj.weight)
    torch.testing.assert_close(model.model.norm_swiftkv.weight, layers[2].input_layernorm.weight)


@pytest.mark.parametrize("l,g", [(6, 1), (2, 1), (2, 2), (2, 4), (4, 2)])
@torch.no_grad()
def test_cache_bytes_follow_formula(l, g):
    base = tiny_base(num_hidden_layers=6)
    model = convert_to_swiftkv(base, l, g)
    seq = 11
    out = model(random_ids(3, seq), use_cache=True, logits_to_keep=1)
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    formula = (l + (6 - l) // g) * 2 * cfg.num_key_value_heads * head_dim * seq * 3 * 4  # batch 3, fp32
    assert cache_bytes(out.cache) == formula == expected_cache_bytes(cfg, seq, batch_size=3, bytes_per_value=4)
    # and it stays so while decoding
    out = model(random_ids(3, 1), cache=out.cache, use_cache=True)
    assert cache_bytes(out.cache) == formula * (seq + 1) // seq


@torch.no_grad()
def test_teacher_caches_every_layer():
    model = convert_to_swiftkv(tiny_base(num_hidden_layers=6), 2, 4).swiftkv(False)
    out = model(random_ids(1, 5), use_cache=True)
    assert cache_bytes(out.cache) == expected_cache_bytes(model.config, 5, bytes_per_value=4, swiftkv=False)
