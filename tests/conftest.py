"""Shared fixtures: tiny random models of each supported family (fp32, fixed seeds)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import (
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import swiftkv  # noqa: F401  (registers the SwiftKV model types)

REPO = Path(__file__).resolve().parents[1]


if os.environ.get("PYTEST_XDIST_WORKER"):
    # One of pytest-xdist's workers (the README's `-n auto`): the workers share the machine's cores, so each runs
    # torch, and the commands its tests start, on one thread; two threads per worker on a 2-core machine would make
    # OpenMP spin in its barriers (see ``one_thread``). A test that sets its own thread count still does.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


TRANSFORMERS4_VERSION = "4.57.6"  # the transformers 4.x that the interoperability tests run our checkpoints in


@pytest.fixture(scope="session")
def transformers4_python(tmp_path_factory) -> Path:
    """One throwaway venv with transformers 4.x and torch (the local CPU wheel: never an unpinned torch), shared by
    the tests that read or run our checkpoints with code nobody here wrote."""
    import subprocess
    import sys

    from filelock import FileLock

    # Made once per pytest run: under pytest-xdist every worker's base temp is below one shared directory, and the
    # first worker to need the venv builds it there while the others wait on the lock.
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    venv, failed = shared / "transformers4-venv", shared / "transformers4-venv.failed"
    python = venv / "bin" / "python"
    with FileLock(str(shared / "transformers4-venv.lock")):
        if not (venv / "done").exists() and not failed.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
            pip = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                                  "--retries", "1", "--timeout", "30", "torch==2.13.0",
                                  f"transformers=={TRANSFORMERS4_VERSION}"], capture_output=True, text=True, timeout=1800)
            if pip.returncode:
                failed.write_text((pip.stderr.strip().splitlines() or ["no output"])[-1])
            else:
                (venv / "done").touch()
    if failed.exists():
        pytest.skip(f"cannot pip install torch==2.13.0 transformers=={TRANSFORMERS4_VERSION} (offline?): "
                    f"{failed.read_text()}")
    return python


@pytest.fixture()
def one_thread():
    """Tiny models gain nothing from threads, and on a busy 2-core machine OpenMP spinning (barrier waits) makes their
    tests 10-20x slower: torch runs on one thread for the test. Files of tiny-model tests use it for every test
    (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def at_collection(raw: Path, path: str) -> str:
    """The text of the repository file ``path`` at the commit that collected the raw folder ``raw`` (its manifest's
    ``collected_at``, less a ``+dirty`` mark): what the run behind a committed table was configured with, which a
    registered run's config (a later commit) may extend before the run has produced its results."""
    import json
    import subprocess

    commit = json.loads((raw / "manifest.json").read_text())["collected_at"].split("+")[0]
    out = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, (f"git show {commit}:{path} failed ({out.stderr.strip()}): the committed tables are "
                                 f"checked against the config they were run with, which needs the git history "
                                 f"(a clone without --depth)")
    return out.stdout


# the overlays a published run of the default profile was collected with, as Snakemake merges them (--configfile)
OVERLAYS = ((), ("config/power.yaml",), ("config/power.yaml", "config/extended-suite.yaml"),
            ("config/extended-suite.yaml",))


def collected_profile(raw: Path) -> dict:
    """The default profile as the run behind the raw folder ``raw`` resolved it: config/config.yaml at the commit
    that collected it (``at_collection``) with the overlays (``OVERLAYS``) whose merged config has the manifest's
    ``config_hash`` (the workflow's ``config_hash()``)."""
    import hashlib
    import json
    import subprocess

    import yaml
    from snakemake.utils import update_config  # how Snakemake merges --configfile files

    manifest = json.loads((raw / "manifest.json").read_text())
    commit = manifest["collected_at"].split("+")[0]
    base = yaml.safe_load(at_collection(raw, "config/config.yaml"))
    for overlays in OVERLAYS:
        if any(subprocess.run(["git", "cat-file", "-e", f"{commit}:{o}"], cwd=REPO, capture_output=True).returncode
               for o in overlays):
            continue  # not in that commit
        merged = json.loads(json.dumps(base))
        for overlay in overlays:
            update_config(merged, yaml.safe_load(at_collection(raw, overlay)))
        if hashlib.sha256(json.dumps(merged, sort_keys=True).encode()).hexdigest()[:12] == manifest["config_hash"]:
            return merged
    raise AssertionError(f"{raw}: no profile at {commit[:12]} (config/config.yaml with the overlays {OVERLAYS}) has "
                         f"the manifest's config_hash {manifest['config_hash']}")


def committed_raw(study: str) -> tuple[Path, dict]:
    """A committed raw folder of the default profile, checked intact against its manifest, and that profile as the
    run behind it resolved it (``collected_profile``)."""
    from analysis.raw import verify

    raw = REPO / "reports" / "raw" / study
    assert verify(raw) == []
    return raw, collected_profile(raw)


def committed_sheet(study: str, dtype=str):
    """The variants sheet of the profile the raw folder ``study`` was collected with (``collected_profile``), as it
    was then, as a frame (of strings, unless ``dtype`` is None: pandas' own types)."""
    import io

    import pandas as pd

    raw = REPO / "reports" / "raw" / study
    text = at_collection(raw, collected_profile(raw)["distill"]["variants"])
    return pd.read_csv(io.StringIO(text), sep="\t", dtype=dtype, keep_default_na=False)


TINY = dict(
    vocab_size=101,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.2,  # large enough that greedy continuations are not degenerate
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=None,
)

DEEPSEEK_TINY = dict(num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                     v_head_dim=12, head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                     moe_intermediate_size=32, first_k_dense_replace=1)

FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 32}),  # per-head q/k norms; head_dim != hidden / heads
    # latent attention (no query LoRA here; tests/test_models.py adds one) and MoE after the first (dense) layer
    "deepseek_v2": (DeepseekV2Config, DeepseekV2ForCausalLM, DEEPSEEK_TINY),
}


def tiny_base(family: str = "llama", seed: int = 0, **overrides):
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(seed)
    config = config_cls(**{**TINY, **extra, **overrides})
    config._attn_implementation = overrides.pop("attn_implementation", "sdpa")
    return model_cls(config).eval()


@pytest.fixture(params=list(FAMILIES))
def family(request) -> str:
    return request.param


def random_ids(batch: int, length: int, seed: int = 1, vocab: int = TINY["vocab_size"]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (batch, length), generator=gen)


def left_padded(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of lengths 12 and 8, left-padded with pad id 0."""
    ids = random_ids(2, 12, seed)
    mask = torch.ones_like(ids)
    ids[1, :4] = 0
    mask[1, :4] = 0
    return ids, mask


CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} </s> {% endfor %}"
WORDS = [f"w{i}" for i in range(90)]


def tiny_tokenizer():
    """A word-level tokenizer over TINY's vocabulary (101 ids) with a chat template: no files, no hub."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "</s>", "<user>", "<assistant>", "<system>"]
    vocab = {tok: i for i, tok in enumerate(specials + WORDS)}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_conversations(n: int = 40, seed: int = 0, prefix: str = "c"):
    """``n`` random conversations of 1-3 exchanges with 3-20 words per message."""
    import random

    from swiftkv.data.conversations import Conversation

    rng = random.Random(seed)
    convs = []
    for i in range(n):
        messages = []
        for _ in range(rng.randint(1, 3)):
            for role in ("user", "assistant"):
                messages.append({"role": role, "content": " ".join(rng.choices(WORDS, k=rng.randint(3, 20)))})
        convs.append(Conversation(f"{prefix}{i}", messages))
    return convs
