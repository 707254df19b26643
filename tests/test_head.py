"""The packed scorer's output side (swiftkv.measure.head): log-probabilities and argmaxes from a vocabulary projected
one chunk at a time equal a whole log-softmax, and models whose logits are more than ``lm_head(hidden)`` keep their
own head (the log-likelihoods through SwiftKVLM against a direct forward: tests/test_evaluate.py)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from swiftkv import convert_to_swiftkv
from swiftkv.measure import head as head_module
from swiftkv.measure.head import final_hidden_states, plain_head, scored_log_probs
from swiftkv.measure.lm import SwiftKVLM
from tests.conftest import TINY, tiny_base
from tests.test_evaluate import direct_loglikelihood, requests, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def whole(hidden, weight, index, targets):
    logp = torch.log_softmax(hidden @ weight.T, dim=-1)
    return logp[index, targets], logp.argmax(dim=-1)


@pytest.mark.parametrize("chunk", [7, 32, 101, 8192])
def test_chunked_projection_equals_a_whole_log_softmax(chunk, monkeypatch):
    """Chunks that do not divide the vocabulary, a chunk as wide as it and one wider; positions asked several tokens
    and none; rows whose maximum is tied across chunks (the argmax is the lowest id, as torch.argmax)."""
    monkeypatch.setattr(head_module, "VOCAB_CHUNK", chunk)
    gen = torch.Generator().manual_seed(0)
    vocab, d, positions = 101, 16, 9
    linear = torch.nn.Linear(d, vocab, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(vocab, d, generator=gen))
        linear.weight[90] = linear.weight[3]  # ties: token 3 and token 90 always share their logit ...
    hidden = torch.randn(positions, d, generator=gen)
    hidden[4] = linear.weight[3] / linear.weight[3].norm() * 40  # ... and are row 4's maximum
    index = torch.tensor([0, 0, 0, 2, 4, 4, 5, 8, 8])  # rows 1, 3, 6 and 7 are asked nothing
    targets = torch.tensor([0, 100, 57, 31, 3, 90, 64, 8, 99])
    want_values, want_argmax = whole(hidden, linear.weight.detach(), index, targets)
    with torch.no_grad():
        values, argmax = scored_log_probs(hidden, index, targets, linear)
    assert values.dtype == torch.float32 and values.shape == index.shape and argmax.shape == (positions,)
    assert_close(values, want_values, rtol=1e-5, atol=1e-5)
    assert argmax.tolist() == want_argmax.tolist() and argmax[4] == 3
    # the same from logits (a model that keeps its own head)
    values, argmax = scored_log_probs(hidden @ linear.weight.detach().T, index, targets)
    assert_close(values, want_values, rtol=1e-5, atol=1e-5)
    assert argmax.tolist() == want_argmax.tolist()


def test_only_plain_projections_are_taken_over_and_always_given_back():
    model = tiny_base("llama")
    lm_head = model.lm_head
    with pytest.raises(RuntimeError, match="inside"):
        with final_hidden_states(model) as head:
            assert head is lm_head and isinstance(model.lm_head, torch.nn.Identity)
            raise RuntimeError("inside")
    assert model.lm_head is lm_head
    student = convert_to_swiftkv(model, 2)
    assert plain_head(student) is student.lm_head
    # a head that accelerate dispatches (device_map) keeps its hook's way
    lm_head._hf_hook = object()
    try:
        assert plain_head(model) is None
    finally:
        del lm_head._hf_hook
    # soft-capped logits (Gemma): the model keeps its head
    gemma = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=TINY["vocab_size"], hidden_size=16, intermediate_size=32,
                                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                               head_dim=8, final_logit_softcapping=30.0))
    with final_hidden_states(gemma) as head:
        assert head is None and isinstance(gemma.lm_head, torch.nn.Linear)


@pytest.mark.parametrize("kind", ["base", "student"])
@torch.no_grad()
def test_a_model_that_keeps_its_head_scores_the_same(kind, monkeypatch):
    """With no model type taken over, the packed scorer works from the model's logits: still a direct forward's."""
    monkeypatch.setattr(head_module, "PLAIN_HEAD_TYPES", frozenset())
    base = tiny_base("llama")
    model = convert_to_swiftkv(base, 2) if kind == "student" else base
    lm = SwiftKVLM(model, tokenizer=tiny_tokenizer(), batch_size=3, max_length=24, device="cpu")
    reqs = requests()
    got = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    assert lm.last_path == "packed"
    want = [direct_loglikelihood(model, c, t, 24) for _, c, t in reqs]
    assert_close(torch.tensor([g[0] for g in got]), torch.tensor([w[0] for w in want]), rtol=1e-4, atol=1e-4)
    assert [g[1] for g in got] == [w[1] for w in want]
