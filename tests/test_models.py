"""SwiftKV models against the plain transformers models: teacher == base, l = L == base, skip == full student."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close
from transformers import AutoModelForCausalLM

from swiftkv import SwiftKVError, convert_to_swiftkv
from tests.conftest import left_padded, random_ids, tiny_base


def full_student_greedy(model, ids, mask, steps):
    """Reference decoding: every step a full student forward over every position, no cache, no skip."""
    model.model.prefill_skip = False
    try:
        for _ in range(steps):
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits[:, -1]
            nxt = logits.argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
            mask = torch.cat([mask, torch.ones_like(nxt)], 1)
    finally:
        model.model.prefill_skip = True
    return ids


@torch.no_grad()
def test_teacher_mode_equals_plain_model(family):
    base = tiny_base(family)
    model = convert_to_swiftkv(base, 2).swiftkv(False)
    ids, mask = left_padded()
    assert_close(model(ids, attention_mask=mask).logits, base(ids, attention_mask=mask).logits, rtol=0, atol=0)
    out_m = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    out_b = base.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert torch.equal(out_m, out_b)


@torch.no_grad()
def test_l_equals_L_is_the_base_model(family):
    base = tiny_base(family)
    model = convert_to_swiftkv(base, base.config.num_hidden_layers)
    assert model.config.swiftkv
    ids, mask = left_padded()
    assert_close(model(ids, attention_mask=mask).logits, base(ids, attention_mask=mask).logits)
    assert_close(model(ids, attention_mask=mask, logits_to_keep=1).logits, base(ids, attention_mask=mask).logits[:, -1:])


@torch.no_grad()
def test_fresh_student_with_one_later_layer_is_the_teacher(family):
    """With l = L - 1 and g = 1 the converted student's only later layer computes Q, K and V from
    norm_swiftkv(h_l) = input_layernorm(h_l) with copies of its own projections (and, in Qwen3, of its q/k norms):
    exactly the teacher. Fails if any part of the SwiftKV path (a per-head norm, RoPE, the boundary) is missing."""
    base = tiny_base(family)
    model = convert_to_swiftkv(base, base.config.num_hidden_layers - 1)
    ids, mask = left_padded()
    assert_close(model(ids, attention_mask=mask).logits, base(ids, attention_mask=mask).logits)
    assert_close(model(ids, attention_mask=mask, logits_to_keep=1).logits, base(ids, attention_mask=mask).logits[:, -1:])


@torch.no_grad()
def test_the_cache_holds_l_plus_one_layer_per_group(family):
    from swiftkv.models.cache import cache_bytes, expected_cache_bytes

    model = convert_to_swiftkv(tiny_base(family, num_hidden_layers=6), 2, 2)  # 2 + 4 / 2 = 4 layer-caches
    out = model(random_ids(3, 7), use_cache=True)
    assert sum(1 for layer in out.cache.layers if getattr(layer, "keys", None) is not None
               and layer.keys.numel()) == 4
    assert cache_bytes(out.cache) == expected_cache_bytes(model.config, 7, batch_size=3, bytes_per_value=4)


@torch.no_grad()
def test_deepseek_v2_with_a_query_lora_keeps_snowflakes_names_and_the_skip(tmp_path):
    from safetensors import safe_open

    base = tiny_base("deepseek_v2", q_lora_rank=12, num_hidden_layers=6)
    fresh = convert_to_swiftkv(base, 5)  # one later layer, fresh: the teacher (test above, with the query LoRA)
    ids, mask = left_padded()
    assert_close(fresh(ids, attention_mask=mask).logits, base(ids, attention_mask=mask).logits)
    model = convert_to_swiftkv(base, 2, 2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "swiftkv" in name:
                p.add_(0.05 * torch.randn_like(p))
    full = full_student_greedy(model, ids, mask, 4)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert torch.equal(out, full)
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        names = {k for k in f.keys() if "swiftkv" in k}
    query = {f"model.layers.{i}.self_attn.{n}_swiftkv.weight" for i in range(2, 6)
             for n in ("q_a_proj", "q_a_layernorm", "q_b_proj")}
    latent = {f"model.layers.{i}.self_attn.{n}_swiftkv.weight" for i in (2, 4)
              for n in ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj")}
    assert names == query | latent | {"model.norm_swiftkv.weight"}
    from swiftkv.models.convert import set_trainable

    assert set(set_trainable(model, "partial")) == names  # distillation trains exactly these; MoE experts stay frozen
    full = set(set_trainable(model, "full"))
    assert any(".mlp.experts" in n for n in full) and not any(n.startswith("model.layers.1.") for n in full)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert_close(reloaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)
    with pytest.raises(SwiftKVError, match="latent attention"):
        convert_to_swiftkv(base, 2, key_value_heads=1)


@torch.no_grad()
def test_qwen3_swiftkv_norms_start_from_the_teachers_and_are_trained():
    from swiftkv.models.convert import set_trainable

    base = tiny_base("qwen3", num_hidden_layers=6)
    for i, layer in enumerate(base.model.layers):  # distinct per-layer norms, so that a group mean is visible
        layer.self_attn.q_norm.weight.fill_(1.0 + i)
        layer.self_attn.k_norm.weight.fill_(2.0 + i)
    model = convert_to_swiftkv(base, 2, 2)
    layers = model.model.layers
    for i in range(2, 6):
        assert_close(layers[i].self_attn.q_norm_swiftkv.weight, torch.full((32,), 1.0 + i))
    assert_close(layers[2].self_attn.k_norm_swiftkv.weight, torch.full((32,), 2.0 + 2.5))  # mean of layers 2 and 3
    assert_close(layers[4].self_attn.k_norm_swiftkv.weight, torch.full((32,), 2.0 + 4.5))
    assert not hasattr(layers[3].self_attn, "k_norm_swiftkv") and not hasattr(layers[1].self_attn, "q_norm_swiftkv")
    names = set(set_trainable(model, "partial"))
    assert {f"model.layers.{i}.self_attn.q_norm_swiftkv.weight" for i in range(2, 6)} <= names
    assert {"model.layers.2.self_attn.k_norm_swiftkv.weight", "model.layers.4.self_attn.k_norm_swiftkv.weight"} <= names
    ids = random_ids(1, 10)
    before = model(ids).logits
    layers[4].self_attn.k_norm_swiftkv.weight.mul_(3.0)  # the norm is on the path: changing it changes the logits
    assert (model(ids).logits - before).abs().max() > 1e-4


@torch.no_grad()
def test_student_differs_from_teacher():
    """Guard against a student that silently runs the teacher path."""
    base = tiny_base()
    model = convert_to_swiftkv(base, 2)
    ids = random_ids(1, 10)
    assert (model(ids).logits - base(ids).logits).abs().max() > 1e-3


@pytest.mark.parametrize("l,g", [(2, 1), (2, 2), (1, 3), (3, 1)])
@torch.no_grad()
def test_prefill_skip_equals_full_student(family, l, g):
    model = convert_to_swiftkv(tiny_base(family), l, g)
    ids, mask = left_padded()
    full = model(ids, attention_mask=mask).logits  # every position through every layer
    last = model(ids, attention_mask=mask, logits_to_keep=1).logits
    assert last.shape[1] == 1
    assert_close(last, full[:, -1:], rtol=1e-5, atol=1e-5)
    # next 20 greedy tokens: generate (prefill skip + cache) vs full recomputation every step
    out = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, min_new_tokens=20)
    ref = full_student_greedy(model, ids, mask, 20)
    assert torch.equal(out, ref)
    assert len(set(out[0, 12:].tolist())) > 3, "degenerate continuation: the comparison would prove little"


@torch.no_grad()
def test_prefill_skip_runs_later_layers_on_requested_positions_only():
    model = convert_to_swiftkv(tiny_base(), 2)
    seen = []
    hooks = [model.model.layers[i].register_forward_hook(lambda m, a, o: seen.append(o.shape[1])) for i in (1, 2, 3)]
    model(random_ids(2, 16), logits_to_keep=1)
    assert seen == [16, 1, 1]  # layer 1 (< l) sees every position; layers 2, 3 only the last one
    seen.clear()
    model.generate(random_ids(1, 16), max_new_tokens=3, do_sample=False, min_new_tokens=3)
    assert seen == [16, 1, 1] + [1, 1, 1] * 2  # prefill, then two decode steps
    for h in hooks:
        h.remove()


@pytest.mark.parametrize(
    "keep",
    [3, torch.tensor([0, 5, 11]), torch.tensor([[2, 11], [7, 9]])],
    ids=["last3", "positions", "per-row"],
)
@torch.no_grad()
def test_logits_to_keep_forms(keep):
    model = convert_to_swiftkv(tiny_base(), 2, 2)
    ids, mask = left_padded()
    full = model(ids, attention_mask=mask).logits
    out = model(ids, attention_mask=mask, logits_to_keep=keep).logits
    if isinstance(keep, int):
        ref = full[:, -keep:]
    elif keep.dim() == 1:
        ref = full[:, keep]
    else:
        ref = torch.stack([full[b, keep[b]] for b in range(2)])
    assert_close(out, ref, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_sampling_with_skip_equals_without(family):
    model = convert_to_swiftkv(tiny_base(family), 2)
    ids, mask = left_padded()
    kw = dict(attention_mask=mask, max_new_tokens=12, min_new_tokens=12, do_sample=True, top_k=0, temperature=1.0)
    torch.manual_seed(7)
    with_skip = model.generate(ids, **kw)
    model.model.prefill_skip = False
    torch.manual_seed(7)
    without = model.generate(ids, **kw)
    assert torch.equal(with_skip, without)


@pytest.mark.parametrize("student", [True, False])
@torch.no_grad()
def test_cached_decode_equals_uncached(student):
    model = convert_to_swiftkv(tiny_base(), 2, 2).swiftkv(student)
    ids = random_ids(2, 10)
    out = model(ids, use_cache=True, logits_to_keep=1)
    cache, seq = out.cache, ids
    for step in range(5):
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
        out = model(nxt, cache=cache, use_cache=True)
        cache = out.cache
        assert_close(out.logits[:, -1], model(seq, use_cache=False).logits[:, -1], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_cache_carried_across_turns(family):
    """Turn 2 reuses turn 1's cache: its new prompt tokens stop at layer l too."""
    model = convert_to_swiftkv(tiny_base(family), 2, 2)
    turn1 = random_ids(1, 9, seed=3)
    gen1 = model.generate(turn1, max_new_tokens=5, min_new_tokens=5, do_sample=False, return_dict_in_generate=True)
    turn2 = torch.cat([gen1.sequences, random_ids(1, 7, seed=4)], 1)
    cache = gen1.cache if hasattr(gen1, "cache") else gen1.past_key_values
    out = model.generate(turn2, cache=cache, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    ref = full_student_greedy(model, turn2, torch.ones_like(turn2), 6)
    assert torch.equal(out, ref)


@torch.no_grad()
def test_sliding_window_family():
    """Mistral with a sliding window shorter than the prompt: the skip still equals the full student."""
    model = convert_to_swiftkv(tiny_base("mistral", sliding_window=5), 2, 2)
    ids = random_ids(2, 14)
    full = model(ids).logits
    assert_close(model(ids, logits_to_keep=4).logits, full[:, -4:], rtol=1e-5, atol=1e-5)
    out = model.generate(ids, max_new_tokens=10, min_new_tokens=10, do_sample=False)
    assert torch.equal(out, full_student_greedy(model, ids, torch.ones_like(ids), 10))


@torch.no_grad()
def test_eager_attention_path():
    model = convert_to_swiftkv(tiny_base("qwen2", attn_implementation="eager"), 2)
    ids, mask = left_padded()
    assert_close(model(ids, attention_mask=mask, logits_to_keep=2).logits,
                 model(ids, attention_mask=mask).logits[:, -2:], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_output_hidden_states_in_student_mode():
    model = convert_to_swiftkv(tiny_base(), 2)
    ids = random_ids(1, 8)
    out = model(ids, output_hidden_states=True, logits_to_keep=1)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    assert all(h.shape[1] == 8 for h in out.hidden_states[:-1])
    assert_close(out.logits, model(ids).logits[:, -1:])
