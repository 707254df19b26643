"""MQA student (paper Table B.2): fewer KV heads in the SwiftKV K/V of layers >= l, mean-pooled from the teacher's."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from swiftkv import SwiftKVError, convert_to_swiftkv
from swiftkv.models.cache import cache_bytes, expected_cache_bytes
from tests.conftest import random_ids, tiny_base


@pytest.mark.parametrize("g", [1, 2])
def test_mqa_shapes_and_pooled_init(family, g):
    if family == "deepseek_v2":  # latent attention caches one latent per token: no KV heads to pool
        with pytest.raises(SwiftKVError, match="not defined for latent attention"):
            convert_to_swiftkv(tiny_base(family, num_hidden_layers=6), 2, g, key_value_heads=1)
        return
    base = tiny_base(family, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2)
    model = convert_to_swiftkv(base, 2, g, key_value_heads=1)
    d = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    for i in range(2, 6, g):
        attn = model.model.layers[i].self_attn
        assert attn.k_proj_swiftkv.weight.shape == (d, model.config.hidden_size)
        assert attn.v_proj_swiftkv.weight.shape == (d, model.config.hidden_size)
        assert attn.swiftkv_num_key_value_groups == 4
        group = [base.model.layers[j].self_attn for j in range(i, i + g)]
        for name in ("k_proj", "v_proj"):
            w = torch.stack([getattr(a, name).weight for a in group]).mean(0).view(2, d, -1).mean(0)  # layers, then heads
            torch.testing.assert_close(getattr(attn, f"{name}_swiftkv").weight, w)
            if getattr(group[0], name).bias is not None:
                b = torch.stack([getattr(a, name).bias for a in group]).mean(0).view(2, d).mean(0)
                torch.testing.assert_close(getattr(attn, f"{name}_swiftkv").bias, b)
    # teacher K/V and layers < l are untouched
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (2 * d, model.config.hidden_size)


def test_mqa_pooling_of_equal_heads_changes_nothing():
    """If the teacher's KV heads are equal, pooling changes nothing: the MQA student computes the same logits."""
    base = tiny_base(num_hidden_layers=4)
    with torch.no_grad():
        for layer in base.model.layers:
            for proj in (layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.weight.view(2, -1, proj.in_features)[1] = proj.weight.view(2, -1, proj.in_features)[0]
    ids = random_ids(2, 9)
    with torch.no_grad():
        gqa = convert_to_swiftkv(base, 1)(ids).logits
        mqa = convert_to_swiftkv(base, 1, key_value_heads=1)(ids).logits
    torch.testing.assert_close(mqa, gqa, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("l,g", [(2, 1), (2, 2), (4, 2)])
@torch.no_grad()
def test_mqa_cache_is_smaller_and_follows_the_formula(l, g):
    base = tiny_base(num_hidden_layers=6)
    gqa = convert_to_swiftkv(base, l, g)
    mqa = convert_to_swiftkv(base, l, g, key_value_heads=1)
    seq, batch = 11, 3
    ids = random_ids(batch, seq)
    out_g = gqa(ids, use_cache=True, logits_to_keep=1)
    out_m = mqa(ids, use_cache=True, logits_to_keep=1)
    head_dim = base.config.hidden_size // base.config.num_attention_heads
    per_head_layer = 2 * head_dim * seq * batch * 4  # K and V, fp32
    later = (6 - l) // g
    assert cache_bytes(out_g.cache) == (l * 2 + later * 2) * per_head_layer
    assert cache_bytes(out_m.cache) == (l * 2 + later * 1) * per_head_layer
    assert cache_bytes(out_m.cache) == expected_cache_bytes(mqa.config, seq, batch, bytes_per_value=4)
    assert cache_bytes(out_m.cache) < cache_bytes(out_g.cache)
    # decoding with the smaller cache works and equals the uncached forward
    nxt = random_ids(batch, 1, seed=5)
    step = mqa(nxt, cache=out_m.cache, use_cache=True).logits[:, -1]
    full = mqa(torch.cat([ids, nxt], 1)).logits[:, -1]
    torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_mqa_prefill_skip_equals_full_student():
    model = convert_to_swiftkv(tiny_base("qwen2", num_hidden_layers=5), 2, 3, key_value_heads=1)
    ids = random_ids(2, 10)
    skip = model(ids, logits_to_keep=3).logits
    model.model.prefill_skip = False
    torch.testing.assert_close(skip, model(ids).logits[:, -3:], atol=1e-5, rtol=1e-5)


def test_mqa_key_survives_save_and_load(tmp_path):
    model = convert_to_swiftkv(tiny_base(num_hidden_layers=4), 2, key_value_heads=1)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["swiftkv_key_value_heads"] == 1
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert reloaded.config.swiftkv_key_value_heads == 1
    assert reloaded.model.layers[2].self_attn.k_proj_swiftkv.out_features == 16
    ids = random_ids(1, 8)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("heads", [0, 3, 4])
def test_bad_mqa_heads_are_one_line(heads):
    with pytest.raises(SwiftKVError, match="swiftkv_key_value_heads"):
        convert_to_swiftkv(tiny_base(num_hidden_layers=4), 2, key_value_heads=heads)
