"""DeepSeek-V2 SwiftKV checkpoints in the layout the rest of the world reads.

transformers 5 keeps the routed experts of ``deepseek_v2`` stacked in memory (``mlp.experts.gate_up_proj``) and
converts them to one tensor per expert (``mlp.experts.N.{gate,up,down}_proj.weight``) when it writes or reads a
checkpoint; transformers 4.x and Snowflake's ``deepseek_v2_swiftkv`` know only that per-expert layout. Our checkpoints
use it too (the same conversion, applied to ``deepseek_v2_swiftkv``), and carry ``rope_scaling["type"]``, which the
family's 4.x-era model code reads.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from swiftkv import convert_to_swiftkv
from tests.conftest import TRANSFORMERS4_VERSION, random_ids, tiny_base, tiny_tokenizer

YARN = {"rope_type": "yarn", "factor": 40.0, "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1,
        "original_max_position_embeddings": 64, "rope_theta": 10000.0}  # DeepSeek-V2-Lite's kind of RoPE, scaled down


def student(q_lora_rank=None, g=1, **extra):
    """A tiny DeepSeek-V2 SwiftKV student (l = 2 of 4 layers) whose SwiftKV weights differ from their init."""
    model = convert_to_swiftkv(tiny_base("deepseek_v2", q_lora_rank=q_lora_rank, **extra), 2, g)
    torch.manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "_swiftkv" in name:
                p.add_(0.05 * torch.randn_like(p))
    return model


def tensors(path) -> dict:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@torch.no_grad()
def logits(model, ids, swiftkv: bool):
    return model.swiftkv(swiftkv)(ids).logits


def test_checkpoint_holds_each_expert_as_transformers_writes_deepseek_v2(tmp_path):
    base = tiny_base("deepseek_v2")
    base.save_pretrained(tmp_path / "base")
    model = convert_to_swiftkv(base, 2)
    model.save_pretrained(tmp_path / "student")
    ours, theirs = tensors(tmp_path / "student"), tensors(tmp_path / "base")
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in ours
    assert not any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in ours)
    assert {k for k in ours if "_swiftkv" not in k} == set(theirs)  # the base's own names, no more, no fewer
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key


@pytest.mark.parametrize("q_lora_rank,g", [(None, 1), (24, 2)])
def test_reloaded_checkpoint_has_the_right_experts(tmp_path, q_lora_rank, g):
    model = student(q_lora_rank, g)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    want, got = model.state_dict(), reloaded.state_dict()
    assert want.keys() == got.keys()
    for key in want:  # the stacked experts in memory: each expert back in its own row
        assert torch.equal(want[key], got[key]), key
    ids = random_ids(2, 11)
    for mode in (True, False):
        torch.testing.assert_close(logits(reloaded, ids, mode), logits(model, ids, mode), rtol=0, atol=0)


def test_an_earlier_stacked_checkpoint_still_loads(tmp_path):
    """What this package wrote before (transformers 5's in-memory layout) keeps loading."""
    model = student()
    model.config.save_pretrained(tmp_path)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    assert "model.layers.1.mlp.experts.gate_up_proj" in tensors(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    want, got = model.state_dict(), reloaded.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    ids = random_ids(1, 9)  # (grouped experts on memory-mapped weights: equal to float32 rounding, not bit for bit)
    torch.testing.assert_close(logits(reloaded, ids, True), logits(model, ids, True))


def test_convert_command_round_trips_a_per_expert_base(tmp_path):
    from swiftkv.cli import main

    base = tiny_base("deepseek_v2")
    base.save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    assert main(["convert", str(tmp_path / "base"), "-l", "2", "-g", "2", "-o", str(tmp_path / "student")]) == 0
    ours, theirs = tensors(tmp_path / "student"), tensors(tmp_path / "base")
    assert {k for k in ours if "_swiftkv" not in k} == set(theirs)
    assert all(torch.equal(ours[k], v) for k, v in theirs.items())
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "student").eval()
    ids = random_ids(2, 10)
    torch.testing.assert_close(logits(reloaded, ids, False), base(ids).logits, rtol=0, atol=0)  # teacher == base


def test_yarn_rope_scaling_names_its_type_for_deepseek_only(tmp_path):
    from transformers import AutoConfig

    model = student(max_position_embeddings=2560, rope_parameters=dict(YARN))
    model.save_pretrained(tmp_path / "deepseek")
    written = json.loads((tmp_path / "deepseek" / "config.json").read_text())
    assert written["rope_scaling"]["type"] == written["rope_scaling"]["rope_type"] == "yarn"
    assert "type" not in model.config.rope_parameters and "type" not in written["rope_parameters"]
    reloaded = AutoConfig.from_pretrained(tmp_path / "deepseek")
    assert reloaded.rope_parameters == model.config.rope_parameters  # the 4.x alias changes nothing under 5.x
    reloaded.save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / "config.json").read_text() == (tmp_path / "deepseek" / "config.json").read_text()
    llama = convert_to_swiftkv(tiny_base(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}), 2)
    llama.save_pretrained(tmp_path / "llama")
    assert "type" not in json.loads((tmp_path / "llama" / "config.json").read_text())["rope_scaling"]


# --- transformers 4.x's own DeepseekV2ForCausalLM, in a throwaway venv -----------------------------------------------

TEACHER_WITH_TRANSFORMERS4 = r"""
import json, sys, torch, transformers
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

out = {"version": transformers.__version__}
for path in sys.argv[1:]:
    cfg = json.load(open(f"{path}/config.json"))  # the SwiftKV fields dropped: the teacher is the plain model
    drop = ("model_type", "architectures", "swiftkv", "num_key_value_layers", "key_value_group_size")
    config = DeepseekV2Config(**{k: v for k, v in cfg.items() if k not in drop})
    model, info = DeepseekV2ForCausalLM.from_pretrained(path, config=config, output_loading_info=True)
    ids = torch.load(f"{path}/ids.pt")
    with torch.no_grad():
        torch.save(model.eval()(ids).logits, f"{path}/logits4.pt")
    out[path] = {"missing": sorted(info["missing_keys"]),
                 "unexpected": sorted(k for k in info["unexpected_keys"] if "_swiftkv" not in k)}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_transformers4_loads_our_deepseek_checkpoint_as_its_teacher(tmp_path, transformers4_python):
    ids = random_ids(2, 12)
    paths, models = [], []
    # plain RoPE: transformers 4.57's own YaRN for deepseek_v2 differs from 5.x's (and from DeepSeek's hub code, which
    # 5.x matches), whatever the checkpoint
    for name, extra in (("lora-g2", {"q_lora_rank": 24, "g": 2}), ("g1", {})):
        model = student(**extra)
        model.save_pretrained(tmp_path / name)
        torch.save(ids, tmp_path / name / "ids.pt")
        paths.append(tmp_path / name)
        models.append(model)
    run = subprocess.run([str(transformers4_python), "-c", TEACHER_WITH_TRANSFORMERS4, *map(str, paths)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen.pop("version") == TRANSFORMERS4_VERSION
    for path, model in zip(paths, models, strict=True):
        assert seen[str(path)] == {"missing": [], "unexpected": []}, path  # every expert found under its own name
        theirs = torch.load(path / "logits4.pt")
        torch.testing.assert_close(theirs, logits(model, ids, False), rtol=0, atol=1e-5)
