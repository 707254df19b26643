"""SimScore on constructed hidden states with known answers, and end to end on a tiny random model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from swiftkv.data.conversations import Conversation
from swiftkv.measure.simscore import (
    SimScoreSettings,
    bootstrap_ci,
    encode_sample,
    layer_inputs,
    measure_simscore,
    render,
    simscore,
    simscore_from_pairs,
)
from tests.conftest import tiny_base


def test_identical_layers_score_one():
    h = torch.randn(1, 2, 7, 16).expand(5, 2, 7, 16)  # (L, B, T, D): every layer the same
    out = simscore(h)
    for metric in ("cosine", "centred", "no_outliers"):
        np.testing.assert_allclose(out[metric], 1.0, atol=1e-5)


def test_orthogonal_layers_score_zero():
    L, T, D = 4, 6, 8
    h = torch.zeros(L, 1, T, D)
    for l in range(L):
        h[l, 0, :, l] = torch.rand(T) + 0.5  # layer l lives on its own axis
    np.testing.assert_allclose(simscore(h)["cosine"], 0.0, atol=1e-7)


def test_eq1_averages_over_later_layers():
    e1, e2 = torch.eye(3)[0], torch.eye(3)[1]
    h = torch.stack([e1, e1, e2]).reshape(3, 1, 1, 3).expand(3, 1, 4, 3)  # x0 = x1 = e1, x2 = e2
    # SimScore(x0) = (cos(x0,x1) + cos(x0,x2)) / 2 = 0.5; SimScore(x1) = cos(x1,x2) = 0
    np.testing.assert_allclose(simscore(h)["cosine"], [0.5, 0.0], atol=1e-7)
    theta = torch.tensor(0.3)
    h2 = torch.stack([e1, torch.cos(theta) * e1 + torch.sin(theta) * e2]).reshape(2, 1, 1, 3)
    np.testing.assert_allclose(simscore(h2)["cosine"], [float(torch.cos(theta))], atol=1e-6)


def test_simscore_from_pairs_matches_definition():
    rng = np.random.default_rng(0)
    pairs = rng.random((6, 6))
    expected = [np.mean([pairs[l, j] for j in range(l + 1, 6)]) for l in range(5)]
    np.testing.assert_allclose(simscore_from_pairs(pairs), expected)


def test_padding_is_ignored():
    torch.manual_seed(0)
    a, b = torch.randn(3, 1, 9, 8), torch.randn(3, 1, 5, 8)
    batch = torch.zeros(3, 2, 9, 8)
    batch[:, 0] = a[:, 0]
    batch[:, 1, :5] = b[:, 0]
    batch[:, 1, 5:] = 1e6 * torch.randn(3, 4, 8)  # garbage in the padding
    mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
    got = simscore(batch, mask, sink_tokens=0)
    # pooled over the 14 real tokens = token-weighted mean of the two sequences' own SimScores
    sa, sb = simscore(a, sink_tokens=0), simscore(b, sink_tokens=0)
    for m in got:
        np.testing.assert_allclose(got[m], (9 * sa[m] + 5 * sb[m]) / 14, atol=1e-6)
    # with the first position left out of the diagnostics: 8 + 4 tokens there, 9 + 5 for the paper's cosine
    got, sa, sb = simscore(batch, mask), simscore(a), simscore(b)
    np.testing.assert_allclose(got["cosine"], (9 * sa["cosine"] + 5 * sb["cosine"]) / 14, atol=1e-6)
    np.testing.assert_allclose(got["centred"], (8 * sa["centred"] + 4 * sb["centred"]) / 12, atol=1e-6)


def test_a_massive_first_token_does_not_drive_the_diagnostics():
    g = torch.Generator().manual_seed(1)
    L, T, D = 4, 300, 64
    h = torch.randn(L, 1, T, D, generator=g)  # unrelated token content in every layer
    h[:, 0, 0, 5] = 1e5  # the attention-sink token's massive activation, the same in every layer
    np.testing.assert_allclose(simscore(h, sink_tokens=1)["centred"], 0.0, atol=0.05)
    assert simscore(h, sink_tokens=0)["centred"].min() > 0.9  # the token mean would carry it into every token


def test_diagnostics_see_through_a_shared_outlier_dimension():
    """A huge token-independent offset on one dim makes plain cosine ~1 for unrelated layers; the diagnostics see ~0."""
    g = torch.Generator().manual_seed(0)
    L, T, D = 4, 400, 64
    h = torch.randn(L, 1, T, D, generator=g)  # independent token content in every layer
    h[..., 7] += 100.0  # the massive shared dimension
    out = simscore(h, outlier_dims=1)
    assert out["cosine"].min() > 0.95
    np.testing.assert_allclose(out["centred"], 0.0, atol=0.05)
    np.testing.assert_allclose(out["no_outliers"], 0.0, atol=0.05)


def test_bootstrap_ci_brackets_the_pooled_ratio():
    rng = np.random.default_rng(1)
    tokens = rng.integers(10, 100, size=40).astype(float)
    sums = (0.6 + 0.05 * rng.standard_normal((40, 3))) * tokens[:, None]
    low, high = bootstrap_ci(sums, tokens, SimScoreSettings(n_resamples=500))
    value = sums.sum(0) / tokens.sum()
    assert np.all(low < value) and np.all(value < high) and np.all(high - low < 0.05)


def test_layer_inputs_are_the_decoder_layer_inputs():
    model = tiny_base()
    captured = []
    hooks = [layer.register_forward_pre_hook(lambda m, args, kw: captured.append(kw.get("hidden_states", args[0] if args else None)),
                                             with_kwargs=True) for layer in model.model.layers]
    ids = torch.randint(1, 100, (2, 6))
    with torch.no_grad():
        out = model.model(input_ids=ids, output_hidden_states=True)
    for hk in hooks:
        hk.remove()
    stacked = layer_inputs(out.hidden_states, model.config.num_hidden_layers)
    assert stacked.shape == (4, 2, 6, 64)
    for l in range(4):
        torch.testing.assert_close(stacked[l], captured[l])


class CharTokenizer:
    """Enough of a tokenizer for the sampling / rendering code: one id per character, no chat template."""

    chat_template = None
    pad_token_id = 0

    def __call__(self, text, add_special_tokens=True, truncation=True, max_length=None):
        ids = ([1] if add_special_tokens else []) + [2 + (ord(c) % 90) for c in text]
        return {"input_ids": ids[:max_length] if truncation and max_length else ids}


def conversations(n=12):
    return [Conversation(f"c{i}_0", [{"role": "user", "content": "question " * (3 + i)},
                                     {"role": "assistant", "content": "answer " * (2 + 2 * i)}]) for i in range(n)]


def test_plain_text_rendering_without_chat_template():
    text, templated = render(CharTokenizer(), conversations(1)[0].messages)
    assert not templated and text.startswith("User: question") and "\n\nAssistant: answer" in text


def test_sample_is_seeded_and_truncated():
    s = SimScoreSettings(num_sequences=5, max_tokens=40, seed=3)
    seqs, ids, _ = encode_sample(CharTokenizer(), conversations(), s)
    assert len(seqs) == 5 and max(len(x) for x in seqs) <= 40
    assert encode_sample(CharTokenizer(), conversations(), s)[1] == ids
    assert encode_sample(CharTokenizer(), conversations(), SimScoreSettings(num_sequences=5, max_tokens=40, seed=4))[1] != ids


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_measure_end_to_end_and_batching_does_not_change_it(family):
    model = tiny_base(family)
    base = dict(num_sequences=6, max_tokens=48, n_resamples=200, min_tokens=8)
    one = measure_simscore(model, CharTokenizer(), conversations(), SimScoreSettings(batch_size=1, **base), progress=False)
    three = measure_simscore(model, CharTokenizer(), conversations(), SimScoreSettings(batch_size=3, **base), progress=False)
    L = model.config.num_hidden_layers
    assert len(one["rows"]) == 3 * (L - 1) and one["num_sequences"] == 6 and not one["chat_template"]
    for r1, r3 in zip(one["rows"], three["rows"]):  # right padding + mask: real tokens see the same context
        assert r1["simscore"] == pytest.approx(r3["simscore"], abs=1e-5)
    for r in one["rows"]:
        assert r["ci_low"] - 1e-9 <= r["simscore"] <= r["ci_high"] + 1e-9
