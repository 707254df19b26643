"""SimScore on the real embedded models (slow): real ShareGPT text, chat template or plain turns, sane values."""

from __future__ import annotations

import os

import pytest

from swiftkv.data.assets import model_dir
from swiftkv.data.conversations import sharegpt_split
from swiftkv.measure.simscore import SimScoreSettings, encode_sample, measure_simscore

pytestmark = pytest.mark.slow

RESOURCES = os.environ.get("SWIFTKV_RESOURCES", "resources")


def _load(model_id):
    if not (model_dir(model_id, RESOURCES) / "config.json").is_file():
        pytest.skip(f"{model_id} is not prepared (swiftkv prepare-model {model_id})")
    from swiftkv.loading import load_model

    return load_model(model_id, dtype="float32", resources=RESOURCES)


@pytest.fixture(scope="module")
def heldout():
    return sharegpt_split("heldout")


def test_smollm2_simscore_on_heldout_sharegpt(heldout):
    model, tok = _load("smollm2-135m")
    s = SimScoreSettings(num_sequences=2, max_tokens=64, n_resamples=100)
    out = measure_simscore(model, tok, heldout, s, progress=False)
    assert out["chat_template"] and out["num_sequences"] == 2 and out["num_tokens"] <= 128
    cos = [r["simscore"] for r in out["rows"] if r["metric"] == "cosine"]
    assert len(cos) == 29 and all(-1 <= v <= 1 for v in cos)
    assert cos[-1] > 0.5  # the last layers' inputs are close to each other


def test_gemma3_has_no_chat_template_and_gets_plain_turns_with_bos(heldout):
    if not (model_dir("gemma3-270m", RESOURCES) / "tokenizer.json").is_file():
        pytest.skip("gemma3-270m is not prepared")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir("gemma3-270m", RESOURCES)))
    seqs, _, templated = encode_sample(tok, heldout, SimScoreSettings(num_sequences=3, max_tokens=32))
    assert not templated
    assert all(s[0] == tok.bos_token_id for s in seqs)
    assert tok.decode(seqs[0][1:3]).startswith("User")
