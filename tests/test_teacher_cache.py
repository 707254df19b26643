"""The teacher cache: one teacher pass serves every student; a cached step equals the shared-prefix step exactly."""

from __future__ import annotations

import json

import pytest
import torch

from swiftkv.data.packing import PackReport, conversation_stream, cut_stream, pack_conversations, pack_stream
from swiftkv.distill import DistillModel, DistillSettings, build_student, compute_loss, train
from swiftkv.distill.teacher_cache import (
    TeacherCache,
    TeacherCacheSettings,
    build_teacher_cache,
    cached_batch,
    weights_fingerprint,
)
from swiftkv.errors import SwiftKVError
from tests.conftest import tiny_base, tiny_conversations, tiny_tokenizer

LAYERS = [1, 2]  # the students below use l = 1 or 2 of 4 layers
MAX_LENGTH = 96


def build(path, tokens=1500, seed=0, heldout_tokens=200, dtype="float32", layers=LAYERS):
    settings = TeacherCacheSettings(layers=layers, data="sharegpt", seed=seed, max_length=MAX_LENGTH, tokens=tokens,
                                    heldout_tokens=heldout_tokens, storage_dtype=dtype)
    return build_teacher_cache(tiny_base(num_hidden_layers=4), tiny_tokenizer(), path, settings,
                               train_conversations=tiny_conversations(120),
                               heldout_conversations=tiny_conversations(15, 1, "h"), progress=False)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("cache") / "teacher"
    build(path)
    return path


def run(tmp_path, name, cache=None, train_kw=None, **settings):
    """A tiny distillation; with a cache no conversations are given (the data come from it)."""
    defaults = dict(num_key_value_layers=1, tokens=1500, max_length=MAX_LENGTH, heldout_tokens=200, batch_size=2,
                    lr=3e-3, checkpoint_every=2, eval_every=3)
    data = {} if cache is not None else {"train_conversations": tiny_conversations(120),
                                         "heldout_conversations": tiny_conversations(15, 1, "h")}
    data.setdefault("train_conversations", None)
    data.setdefault("heldout_conversations", None)
    return train(tiny_base(num_hidden_layers=4), tiny_tokenizer(), DistillSettings(**{**defaults, **settings}),
                 tmp_path / name, progress=False, mixed_precision="no", teacher_cache=cache, **data,
                 **(train_kw or {}))


def weights(path):
    from transformers import AutoModelForCausalLM

    return {n: p.detach() for n, p in AutoModelForCausalLM.from_pretrained(path).named_parameters()}


# -- the data stream --------------------------------------------------------------------------------------------


def test_a_smaller_budget_is_the_larger_stream_cut():
    tok, convs = tiny_tokenizer(), tiny_conversations(120)
    big = conversation_stream(convs, tok, MAX_LENGTH, 1500, seed=3)
    for budget in (2, 100, 731, 1499, 1500):
        direct_report, cut_report = PackReport(), PackReport()
        direct = pack_conversations(convs, tok, MAX_LENGTH, budget, seed=3, report=direct_report)
        cut = pack_stream(cut_stream(big, budget, cut_report), MAX_LENGTH, cut_report)
        assert [(p.input_ids, p.position_ids, p.labels) for p in direct] == \
            [(p.input_ids, p.position_ids, p.labels) for p in cut]
        assert (direct_report.tokens, direct_report.packs, direct_report.conversations) == \
            (cut_report.tokens, cut_report.packs, cut_report.conversations)


# -- exactness ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss,scope,l,g", [("kl", "partial", 1, 1), ("kl", "partial", 2, 2), ("lm", "partial", 1, 1),
                                            ("kl+hidden", "partial", 2, 1), ("kl", "full", 1, 3)])
def test_cached_step_equals_the_shared_prefix_step(cache_dir, loss, scope, l, g):
    cache = TeacherCache(cache_dir)
    settings = DistillSettings(num_key_value_layers=l, key_value_group_size=g, loss=loss, scope=scope,
                               max_length=MAX_LENGTH)
    packs, _, rows = cache.packs("train", 600, MAX_LENGTH)
    grads, losses = [], []
    for cached in (False, True):
        student = build_student(tiny_base(num_hidden_layers=4), settings)
        pair = DistillModel(student, scope, keep_pre_last=loss == "kl+hidden", teacher_cached=cached)
        pre_last = 3 if loss == "kl+hidden" else None
        batch = cached_batch(cache, "train", packs[:2], rows[:2], l, 0, torch.float32, pre_last)
        if cached:
            out = pair(batch["input_ids"], batch["position_ids"], batch["boundary"], batch["teacher"],
                       batch.get("teacher_pre_last"))
        else:
            out = pair(batch["input_ids"], batch["position_ids"])
        value = compute_loss(out, batch, student.get_output_embeddings(), settings)
        value.backward()
        losses.append(value.detach())
        grads.append({n: p.grad.clone() for n, p in pair.named_parameters() if p.grad is not None})
    # Equal up to fp32 rounding: bit-equal on the Xeon machines; on AVX2-only AMD EPYC the teacher's layers batched
    # differently round differently (gradients off by up to ~2e-6 of their largest element). A wrong cache entry (another
    # layer, another row) differs at the scale of the gradients themselves.
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=0)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        scale = float(grads[0][name].abs().max())
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("extra", [{}, {"loss": "kl+hidden", "num_key_value_layers": 2}, {"scope": "full"},
                                   {"key_value_group_size": 3}, {"key_value_heads": 1}, {"tokens": 600}])
def test_a_cached_run_ends_where_an_uncached_run_ends(cache_dir, tmp_path, extra):
    plain = run(tmp_path, "plain", **extra)
    cached = run(tmp_path, "cached", cache=cache_dir, **extra)
    assert cached["train_tokens"] == plain["train_tokens"] and cached["steps"] == plain["steps"]
    assert cached["data"]["train"]["tokens"] == plain["data"]["train"]["tokens"]
    assert cached["heldout_initial"] == plain["heldout_initial"]
    assert cached["heldout_final"]["heldout_kl"] == pytest.approx(plain["heldout_final"]["heldout_kl"], rel=1e-5)
    a, b = weights(tmp_path / "plain"), weights(tmp_path / "cached")
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6)
    assert list(cached["teacher_cache"]["key"]["layers"]) == [1, 2, 3]


def test_resume_with_the_cache(cache_dir, tmp_path):
    from swiftkv.distill import Interrupted

    full = run(tmp_path, "a", cache=cache_dir)
    with pytest.raises(Interrupted):
        run(tmp_path, "b", cache=cache_dir, train_kw={"interrupt_after": 5})
    resumed = run(tmp_path, "b", cache=cache_dir, train_kw={"resume": True})
    assert resumed["steps"] == full["steps"] and resumed["train_tokens"] == full["train_tokens"]
    assert resumed["heldout_final"]["heldout_kl"] == pytest.approx(full["heldout_final"]["heldout_kl"], rel=1e-4)


def test_bfloat16_storage_is_close(tmp_path, cache_dir):
    build(tmp_path / "cache-bf16", dtype="bfloat16")
    exact = run(tmp_path, "fp32", cache=cache_dir)
    half = run(tmp_path, "bf16", cache=tmp_path / "cache-bf16")
    assert half["heldout_final"]["heldout_kl"] == pytest.approx(exact["heldout_final"]["heldout_kl"], rel=0.05)
    sizes = {p.name: p.stat().st_size for p in (tmp_path / "cache-bf16").glob("train.*.bin")}
    assert sizes == {n: s // 2 for n, s in ((p.name, p.stat().st_size) for p in cache_dir.glob("train.*.bin"))}


def test_assistant_positions_sum_over_assistant_tokens_and_average_over_all(cache_dir):
    cache = TeacherCache(cache_dir)
    packs, _, rows = cache.packs("train", 600, MAX_LENGTH)
    batch = cached_batch(cache, "train", packs[:1], rows[:1], 1, 0, torch.float32)
    assert 0 < batch["assistant_mask"].sum() < batch["loss_mask"].sum()
    student = build_student(tiny_base(num_hidden_layers=4), DistillSettings(num_key_value_layers=1))
    pair = DistillModel(student, teacher_cached=True)
    out = pair(batch["input_ids"], batch["position_ids"], batch["boundary"], batch["teacher"])
    head = student.get_output_embeddings()
    from swiftkv.distill.losses import kl_sum

    with torch.no_grad():
        every = batch["loss_mask"]
        per_token = torch.stack([kl_sum(head(s[None]), head(t[None]), 2.0)
                                 for s, t in zip(out.student[every], out.teacher[every])])
        asst = batch["assistant_mask"][every]
        for positions, expected in (("all", per_token.mean()), ("assistant", per_token[asst].sum() / every.sum())):
            settings = DistillSettings(num_key_value_layers=1, loss_positions=positions)
            torch.testing.assert_close(compute_loss(out, batch, head, settings), expected, rtol=1e-5, atol=1e-6)


def test_loss_positions_run_without_a_cache_too(tmp_path):
    summary = run(tmp_path, "asst", loss_positions="assistant", tokens=600)
    assert summary["steps"] > 0 and summary["settings"]["loss_positions"] == "assistant"


# -- refusals ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("change,message", [
    ({"seed": 1}, "seed 1 != 0"),
    ({"max_length": 64}, "max_length 64 != 96"),
    ({"tokens": 3000}, "the run needs 3000 training tokens, the cache holds 1500"),
    ({"heldout_tokens": 100}, "heldout_tokens 100 != 200"),
])
def test_a_cache_for_other_settings_is_refused(cache_dir, tmp_path, change, message):
    with pytest.raises(SwiftKVError, match=message) as err:
        run(tmp_path, "x", cache=cache_dir, **change)
    assert "\n" not in str(err.value) and not (tmp_path / "x").exists()


def test_a_layer_it_does_not_hold_is_refused(tmp_path):
    build(tmp_path / "only-l2", layers=[2], tokens=300)
    with pytest.raises(SwiftKVError, match=r"l=1 is not among its layers \[2, 3\]"):
        run(tmp_path, "x", cache=tmp_path / "only-l2", tokens=300)


def test_other_teacher_weights_are_refused(cache_dir, tmp_path):
    settings = DistillSettings(num_key_value_layers=1, tokens=600, max_length=MAX_LENGTH, heldout_tokens=200)
    with pytest.raises(SwiftKVError, match="other teacher weights"):
        train(tiny_base(seed=5, num_hidden_layers=4), tiny_tokenizer(), settings, tmp_path / "x",
              train_conversations=None, heldout_conversations=None, progress=False, mixed_precision="no",
              teacher_cache=cache_dir)
    assert not (tmp_path / "x").exists()


def test_a_truncated_or_foreign_cache_is_one_line(cache_dir, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(cache_dir, broken)
    victim = broken / "train.h1.bin"
    victim.write_bytes(victim.read_bytes()[:1000])
    with pytest.raises(SwiftKVError, match="train.h1.bin is 1000 bytes, not .*build it again"):
        TeacherCache(broken)
    (broken / "cache.json").write_text("{")
    with pytest.raises(SwiftKVError, match="cache.json is damaged"):
        TeacherCache(broken)
    with pytest.raises(SwiftKVError, match="is not a teacher cache"):
        TeacherCache(tmp_path)


def test_the_key_records_what_decides_the_numbers(cache_dir):
    meta = json.loads((cache_dir / "cache.json").read_text())
    key = meta["key"]
    assert key["layers"] == [1, 2, 3] and key["tokens"] == 1500 and key["seed"] == 0 and key["dtype"] == "float32"
    student = build_student(tiny_base(num_hidden_layers=4), DistillSettings(num_key_value_layers=2))
    assert key["model"] == weights_fingerprint(student)  # the student's teacher parts are the base model's
    assert meta["build"]["train_tokens"] == 1500
