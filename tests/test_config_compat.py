"""config.json that transformers 4.x reads correctly too (Snowflake's training code pins transformers>=4.56,<5).

transformers 5.x writes RoPE only as ``rope_parameters`` and the dtype only as ``dtype``; 4.x ignores the former
(falling back to ``rope_theta = 10000`` and no scaling) and, before 4.56, the latter. Our checkpoints also carry
``rope_theta``, ``rope_scaling`` (4.x form) and ``torch_dtype``; these tests check both readers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM

from swiftkv import convert_to_swiftkv
from swiftkv.configuration import add_transformers4_keys
from tests.conftest import TRANSFORMERS4_VERSION, tiny_base

PAPER_CONFIGS = Path(__file__).resolve().parents[1] / "config" / "models"
MODEL_CLASSES = {"llama": LlamaForCausalLM, "mistral": MistralForCausalLM, "qwen2": Qwen2ForCausalLM}
# A paper model's architecture at test size: its RoPE, dtype and family-specific keys stay as published.
TINY_DIMS = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=101, bos_token_id=None, eos_token_id=None)
LLAMA31_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}  # as in Meta's Llama-3.1 config.json
TRANSFORMERS4_KEYS = ("rope_theta", "rope_scaling", "torch_dtype")
# The newest release that ArcticTraining's pin allows: pyproject.toml `transformers>=4.56,<5.0.0` (since Nov 2025).


def paper_base(name: str):
    """The base model of ``config/models/<name>.json`` at test size, in the published dtype (bfloat16)."""
    published = json.loads((PAPER_CONFIGS / f"{name}.json").read_text())
    model_class = MODEL_CLASSES[published["model_type"]]
    values = {k: v for k, v in published.items() if k not in ("model_type", "architectures")}
    torch.manual_seed(0)
    model = model_class(model_class.config_class(**{**values, **TINY_DIMS}))
    return model.to(getattr(torch, published["torch_dtype"])).eval()


def paper_names() -> list[str]:
    """The paper's dense models (DeepSeek-V2-Lite's config is there for FLOPs; Snowflake loads it with remote code)."""
    return sorted(p.stem for p in PAPER_CONFIGS.glob("*.json")
                  if json.loads(p.read_text())["model_type"] in MODEL_CLASSES)


@contextlib.contextmanager
def transformers_warnings():
    """Collect what transformers warns (its logger, ``warning_once`` included, and Python warnings)."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logger = logging.getLogger("transformers")
    logging.Logger.warning_once.cache_clear()  # a message already warned once elsewhere would stay silent
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield messages
        messages.extend(str(w.message) for w in caught)
    finally:
        logger.removeHandler(handler)


def assert_transformers4_keys(config: dict) -> None:
    """The 4.x keys are present and say what ``rope_parameters`` and ``dtype`` say."""
    rope = config["rope_parameters"]
    assert config["rope_theta"] == rope["rope_theta"]
    if rope["rope_type"] == "default":
        assert config["rope_scaling"] is None
    else:
        assert {**config["rope_scaling"], "rope_theta": config["rope_theta"]} == rope
    assert config["torch_dtype"] == config["dtype"]


def strip_transformers4_keys(src: Path, dst: Path) -> Path:
    """A copy of ``src``'s config.json as transformers 5.x alone writes it."""
    config = json.loads((src / "config.json").read_text())
    dst.mkdir()
    (dst / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in TRANSFORMERS4_KEYS}))
    return dst


def comparable(config) -> dict:
    return {k: v for k, v in config.to_dict().items() if k != "_name_or_path"}


@pytest.mark.parametrize("name", paper_names())
def test_paper_model_checkpoint_carries_transformers4_keys(tmp_path, name):
    base = paper_base(name)
    model = convert_to_swiftkv(base, 2, 2)
    model.save_pretrained(tmp_path / "ckpt")
    written = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert_transformers4_keys(written)
    assert written["rope_parameters"] == base.config.rope_parameters
    assert (written["torch_dtype"], written["dtype"]) == ("bfloat16", "bfloat16")
    if name.startswith("llama-3.1"):
        assert written["rope_scaling"] == LLAMA31_ROPE_SCALING
    assert "rope_theta" not in model.config.to_dict()  # the in-memory view stays 5.x's; only config.json has them

    with transformers_warnings() as warned:
        reloaded = AutoConfig.from_pretrained(tmp_path / "ckpt")
    assert warned == []
    assert type(reloaded) is type(model.config)
    assert reloaded.rope_parameters == model.config.rope_parameters
    assert reloaded.dtype == torch.bfloat16
    assert (reloaded.num_key_value_layers, reloaded.key_value_group_size, reloaded.swiftkv) == (2, 2, True)
    # the 4.x keys change nothing under 5.x: the same config as from the 5.x-only file ...
    only5 = AutoConfig.from_pretrained(strip_transformers4_keys(tmp_path / "ckpt", tmp_path / "only5"))
    assert comparable(reloaded) == comparable(only5)
    assert {k for k in TRANSFORMERS4_KEYS if k in reloaded.__dict__} == set()
    # ... and saving it again writes the same file
    reloaded.save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / "config.json").read_text() == (tmp_path / "ckpt" / "config.json").read_text()


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_tiny_checkpoint_reloads_identically(tmp_path, family):
    model = convert_to_swiftkv(tiny_base(family, num_hidden_layers=6), 2, 2)
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert_transformers4_keys(written)
    assert (written["rope_theta"], written["rope_scaling"], written["torch_dtype"]) == (10000.0, None, "float32")
    with transformers_warnings() as warned:
        reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert warned == []
    assert comparable(reloaded.config) == comparable(model.config)


@pytest.mark.parametrize("name", ["llama-3.1-8b-instruct", "qwen2.5-7b-instruct"])
def test_base_model_config_gets_transformers4_keys(tmp_path, name):
    """What ``assets.prepare_model`` does to the base models it writes (Snowflake's trainer starts from them)."""
    base = paper_base(name)
    base.save_pretrained(tmp_path / "base")
    add_transformers4_keys(tmp_path / "base" / "config.json")
    assert_transformers4_keys(json.loads((tmp_path / "base" / "config.json").read_text()))
    with transformers_warnings() as warned:
        reloaded = AutoConfig.from_pretrained(tmp_path / "base")
    assert warned == []
    only5 = AutoConfig.from_pretrained(strip_transformers4_keys(tmp_path / "base", tmp_path / "only5"))
    assert comparable(reloaded) == comparable(only5)
    assert reloaded.rope_parameters == base.config.rope_parameters


# --- transformers 4.x in a throwaway venv -------------------------------------------------------------------------

READ_WITH_TRANSFORMERS4 = r"""
import json, sys
import transformers
from transformers import AutoConfig, LlamaConfig, MistralConfig, Qwen2Config

def swiftkv_config(base, name):  # what Snowflake's code registers: the family's config plus three fields
    def __init__(self, swiftkv=False, num_key_value_layers=None, key_value_group_size=None, **kwargs):
        base.__init__(self, **kwargs)
        self.swiftkv = swiftkv
        self.num_key_value_layers = num_key_value_layers or self.num_hidden_layers
        self.key_value_group_size = key_value_group_size or 1
    return type(base.__name__.replace("Config", "SwiftKVConfig"), (base,), {"model_type": name, "__init__": __init__})

for base, name in ((LlamaConfig, "llama_swiftkv"), (MistralConfig, "mistral_swiftkv"), (Qwen2Config, "qwen2_swiftkv")):
    AutoConfig.register(name, swiftkv_config(base, name))

out = {"version": transformers.__version__}
for path in sys.argv[1:]:
    c = AutoConfig.from_pretrained(path)
    out[path] = {"model_type": c.model_type, "rope_theta": c.rope_theta,
                 "rope_scaling": getattr(c, "rope_scaling", None),  # 4.x's Mistral has none unless config.json does
                 # a string, or with torch installed (the shared venv has it) a torch.dtype: its name either way
                 "dtype": str(c.__dict__.get("dtype") or c.__dict__.get("torch_dtype")).removeprefix("torch."),
                 **{k: getattr(c, k, None) for k in ("num_key_value_layers", "key_value_group_size", "swiftkv")}}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_transformers4_reads_our_checkpoints(tmp_path, transformers4_python):
    dirs = {}
    for name, l, g in (("llama-3.1-8b-instruct", 2, 2), ("qwen2.5-7b-instruct", 3, 1),
                       ("mistral-large-instruct-2407", 2, 1)):
        base = paper_base(name)
        convert_to_swiftkv(base, l, g).save_pretrained(tmp_path / name)
        dirs[name] = (tmp_path / name, base.config, l, g)
    base = paper_base("qwen2.5-7b-instruct")  # a base model as assets.prepare_model writes it
    base.save_pretrained(tmp_path / "base")
    add_transformers4_keys(tmp_path / "base" / "config.json")
    # the bug this guards against: a 5.x-only config.json
    only5 = strip_transformers4_keys(tmp_path / "llama-3.1-8b-instruct", tmp_path / "only5")

    paths = [str(d[0]) for d in dirs.values()] + [str(tmp_path / "base"), str(only5)]
    run = subprocess.run([str(transformers4_python), "-c", READ_WITH_TRANSFORMERS4, *paths],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen.pop("version") == TRANSFORMERS4_VERSION
    assert "rope" not in run.stderr.lower(), run.stderr  # no complaint about rope_scaling's keys

    for name, (path, config, l, g) in dirs.items():
        got = seen[str(path)]
        rope = config.rope_parameters
        scaling = None if rope["rope_type"] == "default" else {k: v for k, v in rope.items() if k != "rope_theta"}
        assert got == {"model_type": config.model_type + "_swiftkv", "rope_theta": rope["rope_theta"],
                       "rope_scaling": scaling, "dtype": "bfloat16", "num_key_value_layers": l,
                       "key_value_group_size": g, "swiftkv": True}, name
    assert seen[str(dirs["llama-3.1-8b-instruct"][0])]["rope_scaling"] == LLAMA31_ROPE_SCALING
    assert seen[str(tmp_path / "base")]["rope_theta"] == 1e6
    assert (seen[str(only5)]["rope_theta"], seen[str(only5)]["rope_scaling"]) == (10000.0, None)
