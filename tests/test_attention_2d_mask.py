"""The prefill skip under attention kernels that take a 2D key-padding mask (flash attention 2/3/4), on CPU.

flash-attn is not installed here, so the models run transformers' own flash-attention path, unchanged — the FA2
mask function (a 2D padding mask, or None), ``flash_attention_forward`` and ``_flash_attention_forward`` with its
unpadding — under a registered name, with the two CUDA kernels swapped for torch stand-ins that follow the flash-attn
semantics: varlen sequences, causal alignment bottom-right (query i of Q sits at key K - Q + i), zeros where a query
has no key. The skip is compared with the same weights under SDPA, and with the full student forward.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import pytest
import torch
from torch.testing import assert_close
from transformers import AttentionInterface, AttentionMaskInterface
from transformers import modeling_flash_attention_utils as fa_utils
from transformers.integrations.flash_attention import flash_attention_forward
from transformers.masking_utils import flash_attention_mask

from swiftkv import convert_to_swiftkv
from swiftkv.models import common
from tests.conftest import left_padded, random_ids, tiny_base

STANDIN = "fa2_standin"  # no "flash" in the name: transformers would then try to load a kernel from the Hub
FAMILIES = ["llama", "qwen2"]


def _attend(q, k, v, scale, causal, window):
    """One sequence: q (Q, H, D), k/v (K, Hkv, D) -> (Q, H, D), as flash-attn computes it."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale  # H,Q,K
    at = torch.arange(q.shape[0])[:, None] + k.shape[0] - q.shape[0]  # Q,1: the key each query sits at
    key = torch.arange(k.shape[0])[None, :]  # 1,K
    allowed = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool)
    left, right = window
    if causal:
        allowed &= key <= at
    if left >= 0:
        allowed &= key >= at - left
    if right >= 0:
        allowed &= key <= at + right
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)  # no key -> zeros
    return torch.einsum("hqk,khd->qhd", probs, v)


def flash_attn_varlen_func(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
    dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
):
    """Stand-in for flash_attn.flash_attn_varlen_func: q (total_q, H, D), k/v (total_k, Hkv, D)."""
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out = torch.zeros_like(q)
    for b in range(len(cu_seqlens_q) - 1):
        qs, qe, ks, ke = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]), int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        out[qs:qe] = _attend(q[qs:qe], k[ks:ke], v[ks:ke], scale, causal, window_size)
    return out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1)):
    """Stand-in for flash_attn.flash_attn_func: q (B, Q, H, D), k/v (B, K, Hkv, D), no padding."""
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    return torch.stack([_attend(q[b], k[b], v[b], scale, causal, window_size) for b in range(q.shape[0])])


AttentionInterface.register(STANDIN, flash_attention_forward)  # transformers' own FA glue under a new name
AttentionMaskInterface.register(STANDIN, flash_attention_mask)  # and its FA mask: 2D padding mask or None


@pytest.fixture(autouse=True)
def standin_kernels(monkeypatch):
    """transformers loads the kernels for STANDIN lazily: hand it the torch stand-ins and its own pad/unpad."""
    real = fa_utils.lazy_import_flash_attention
    kernels = (flash_attn_func, flash_attn_varlen_func, None, fa_utils._pad_input, fa_utils._unpad_input)
    process = (fa_utils._lazy_define_process_function(flash_attn_varlen_func), dict)

    def lazy_import(implementation, *args, **kwargs):
        return (kernels, process) if implementation == STANDIN else real(implementation, *args, **kwargs)

    monkeypatch.setattr(fa_utils, "lazy_import_flash_attention", lazy_import)
    monkeypatch.setattr(common, "_warned", set())  # each test sees the one-time warning afresh


def pair(family, l=2, g=1, **overrides):
    """The same SwiftKV student twice: under the FA stand-in and under SDPA."""
    fa = convert_to_swiftkv(tiny_base(family, attn_implementation=STANDIN, **overrides), l, g)
    sdpa = convert_to_swiftkv(tiny_base(family, **overrides), l, g)
    assert fa.config._attn_implementation == STANDIN and sdpa.config._attn_implementation == "sdpa"
    return fa, sdpa


def left_padded_wide(lengths=(4, 3, 2, 1, 4, 2), width=4, seed=5):
    """A batch larger than its prompt length: rows of the given real lengths, left-padded with 0."""
    ids = random_ids(len(lengths), width, seed)
    mask = torch.ones_like(ids)
    for row, n in enumerate(lengths):
        ids[row, : width - n] = 0
        mask[row, : width - n] = 0
    return ids, mask


@contextmanager
def seen_by_layer(model, layer):
    """Yields the list of query lengths that decoder layer ``layer`` sees while the block runs."""
    seen = []
    hook = model.model.layers[layer].register_forward_hook(lambda m, a, o: seen.append(o.shape[1]))
    try:
        yield seen
    finally:
        hook.remove()


@torch.no_grad()
def test_standin_is_flash_attention_semantics(family):
    """Guard: under the stand-in the plain transformers model equals SDPA at every real position, and the mask it
    gets is FA's 2D padding mask."""
    base_fa, base_sdpa = tiny_base(family, attn_implementation=STANDIN), tiny_base(family)
    ids, mask = left_padded()
    real = mask.bool()
    assert_close(base_fa(ids, attention_mask=mask).logits[real], base_sdpa(ids, attention_mask=mask).logits[real])
    student = convert_to_swiftkv(base_fa, 2)
    state = student.model.prepare_prefix(ids, mask, dense_masks=True)
    assert state.dense_masks["full_attention"].shape == (2, 12)  # keys only: never rows to select
    assert student.model.prepare_prefix(random_ids(2, 12), None, dense_masks=True).dense_masks["full_attention"] is None


@pytest.mark.parametrize("padded", [True, False], ids=["left-padded", "no-padding"])
@pytest.mark.parametrize("keep", [1, 3])
@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_last_positions_skip_equals_sdpa(family, keep, padded, caplog):
    fa, sdpa = pair(family, 2, 2)
    ids, mask = left_padded() if padded else (random_ids(2, 12), torch.ones(2, 12, dtype=torch.long))
    with seen_by_layer(fa, 3) as seen, caplog.at_level(logging.WARNING, logger=common.__name__):
        out = fa(ids, attention_mask=mask, logits_to_keep=keep).logits
    assert seen == [keep], "the skip was not taken: layer 3 ran on every position"
    assert not [r for r in caplog.records if r.name == common.__name__]
    assert_close(out, sdpa(ids, attention_mask=mask, logits_to_keep=keep).logits)
    fa.model.prefill_skip = False
    assert_close(out, fa(ids, attention_mask=mask).logits[:, -keep:])  # == the full student forward


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_batch_one_without_mask(family):
    """Batch 1, no mask: FA's plain (non-varlen) kernel, bottom-right causal; position_ids must not look packed."""
    fa, sdpa = pair(family, 2)
    ids = random_ids(1, 10)
    assert_close(fa(ids, logits_to_keep=4).logits, sdpa(ids, logits_to_keep=4).logits)


@pytest.mark.parametrize("keep", [1, 2])
@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_batch_larger_than_prompt(family, keep):
    """Batch 6, prompt 4: selecting the mask's dim -2 would have picked batch rows."""
    fa, sdpa = pair(family, 2)
    ids, mask = left_padded_wide()
    out = fa(ids, attention_mask=mask, logits_to_keep=keep).logits
    real = mask[:, -keep:].bool()  # a padded query's output is undefined under FA (zeros), so compare real ones
    assert_close(out[real], sdpa(ids, attention_mask=mask, logits_to_keep=keep).logits[real])


@pytest.mark.parametrize("prompts", ["2x12", "6x4"])
@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_generate_left_padded_equals_sdpa(family, prompts):
    fa, sdpa = pair(family, 2, 2)
    ids, mask = left_padded() if prompts == "2x12" else left_padded_wide()
    kw = dict(attention_mask=mask, max_new_tokens=10, min_new_tokens=10, do_sample=False)
    with seen_by_layer(fa, 3) as seen:
        out = fa.generate(ids, **kw)
    assert seen[0] == 1, "the prefill skip was not taken"
    assert torch.equal(out, sdpa.generate(ids, **kw))
    assert len(set(out[:, ids.shape[1]:].flatten().tolist())) > 3, "degenerate continuation"


@pytest.mark.parametrize("padded", [True, False], ids=["left-padded", "no-padding"])
@pytest.mark.parametrize(
    "keep", [torch.tensor([0, 5, 11]), torch.tensor([[2, 11], [7, 9]])], ids=["positions", "per-row"]
)
@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_arbitrary_positions_fall_back_with_one_warning(family, keep, padded, caplog):
    fa, _ = pair(family, 2, 2)
    ids, mask = left_padded() if padded else (random_ids(2, 12), None)
    fa.model.prefill_skip = False
    full = fa(ids, attention_mask=mask).logits  # the full student forward
    fa.model.prefill_skip = True
    ref = full[:, keep] if keep.dim() == 1 else torch.stack([full[b, keep[b]] for b in range(2)])
    with seen_by_layer(fa, 3) as seen, caplog.at_level(logging.WARNING, logger=common.__name__):
        first = fa(ids, attention_mask=mask, logits_to_keep=keep).logits
        second = fa(ids, attention_mask=mask, logits_to_keep=keep).logits
    assert seen == [12, 12]  # every position ran through the later layers
    warnings = [r for r in caplog.records if r.name == common.__name__]
    assert len(warnings) == 1 and STANDIN in warnings[0].getMessage()
    assert_close(first, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(first, second)


@torch.no_grad()
def test_last_positions_as_a_tensor_keep_the_skip(caplog):
    fa, sdpa = pair("llama", 2)
    ids, mask = left_padded()
    keep = torch.tensor([9, 10, 11])
    with seen_by_layer(fa, 3) as seen, caplog.at_level(logging.WARNING, logger=common.__name__):
        out = fa(ids, attention_mask=mask, logits_to_keep=keep).logits
    assert seen == [3] and not [r for r in caplog.records if r.name == common.__name__]
    assert_close(out, sdpa(ids, attention_mask=mask, logits_to_keep=3).logits)


@torch.no_grad()
def test_sliding_window_under_standin():
    """Mistral, window 5 < prompt: FA's window_size path with the skip equals SDPA's sliding mask."""
    fa, sdpa = pair("mistral", 2, 2, sliding_window=5)
    ids = random_ids(2, 14)
    assert_close(fa(ids, logits_to_keep=4).logits, sdpa(ids, logits_to_keep=4).logits)
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert torch.equal(fa.generate(ids, **kw), sdpa.generate(ids, **kw))


def test_mask_row_selection():
    four_d = torch.arange(2 * 5 * 5).view(2, 1, 5, 5)
    two_d = torch.ones(2, 5, dtype=torch.bool)
    index = torch.tensor([3, 4])
    assert torch.equal(common.select_query_rows(four_d, index), four_d[:, :, 3:])
    assert common.select_query_rows(two_d, index) is two_d and common.select_query_rows(None, index) is None
    assert common.is_last_positions(2, index, 5)
    assert common.is_last_positions(None, index, 5) and common.is_last_positions(None, torch.tensor([[3, 4]] * 6), 5)
    assert not common.is_last_positions(None, torch.tensor([2, 4]), 5)
    assert not common.is_last_positions(None, torch.tensor([[3, 4], [2, 4]]), 5)
