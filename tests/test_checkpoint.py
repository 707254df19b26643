"""Checkpoint format (reference §1): our checkpoints and Snowflake's load in each other's tools."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

import swiftkv
from swiftkv import SwiftKVError, convert_to_swiftkv
from tests.conftest import random_ids, tiny_base


@pytest.mark.parametrize("family,arch", [("llama", "LlamaSwiftKVForCausalLM"), ("qwen2", "Qwen2SwiftKVForCausalLM"),
                                         ("mistral", "MistralSwiftKVForCausalLM"),
                                         ("qwen3", "Qwen3SwiftKVForCausalLM")])
def test_save_load_keeps_names(tmp_path, family, arch):
    base = tiny_base(family, num_hidden_layers=6)
    model = convert_to_swiftkv(base, 2, 2)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == f"{family}_swiftkv"
    assert config["architectures"] == [arch]
    assert (config["swiftkv"], config["num_key_value_layers"], config["key_value_group_size"]) == (True, 2, 2)
    assert "quantization_config" not in config
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    extra = {k for k in keys if "swiftkv" in k}
    bias = family == "qwen2"
    expected = {"model.norm_swiftkv.weight"}
    for i in range(2, 6):
        names = ["q"] + (["k", "v"] if (i - 2) % 2 == 0 else [])
        for n in names:
            expected.add(f"model.layers.{i}.self_attn.{n}_proj_swiftkv.weight")
            if bias:
                expected.add(f"model.layers.{i}.self_attn.{n}_proj_swiftkv.bias")
            if family == "qwen3" and n != "v":  # Snowflake's Qwen3 names: the per-head norms beside q and k
                expected.add(f"model.layers.{i}.self_attn.{n}_norm_swiftkv.weight")
    assert extra == expected
    # every teacher weight stays in the file (the vLLM plugin expects q/k/v_proj of every layer)
    assert {f"model.layers.{i}.self_attn.{n}_proj.weight" for i in range(6) for n in "qkv"} <= keys
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is type(model)
    ids = random_ids(1, 9)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_snowflake_checkpoint_loads(tmp_path):
    """A checkpoint written by hand in Snowflake's format (config keys + weight names of reference §1)."""
    L, l, g, H, kv, heads = 4, 2, 2, 64, 2, 4
    d = H // heads
    config = {
        "architectures": ["LlamaSwiftKVForCausalLM"],
        "model_type": "llama_swiftkv",
        "swiftkv": True,
        "num_key_value_layers": l,
        "key_value_group_size": g,
        "hidden_size": H,
        "intermediate_size": 96,
        "num_hidden_layers": L,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": 50,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(0)
    t = {}

    def w(name, *shape):
        t[name] = torch.randn(*shape, generator=gen) * 0.1

    w("model.embed_tokens.weight", 50, H)
    w("lm_head.weight", 50, H)
    t["model.norm.weight"] = torch.ones(H)
    t["model.norm_swiftkv.weight"] = torch.full((H,), 0.5)
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = torch.ones(H)
        t[p + "post_attention_layernorm.weight"] = torch.ones(H)
        w(p + "self_attn.q_proj.weight", heads * d, H)
        w(p + "self_attn.k_proj.weight", kv * d, H)
        w(p + "self_attn.v_proj.weight", kv * d, H)
        w(p + "self_attn.o_proj.weight", H, heads * d)
        w(p + "mlp.gate_proj.weight", 96, H)
        w(p + "mlp.up_proj.weight", 96, H)
        w(p + "mlp.down_proj.weight", H, 96)
        if i >= l:
            w(p + "self_attn.q_proj_swiftkv.weight", heads * d, H)
            if (i - l) % g == 0:
                w(p + "self_attn.k_proj_swiftkv.weight", kv * d, H)
                w(p + "self_attn.v_proj_swiftkv.weight", kv * d, H)
    save_file(t, tmp_path / "model.safetensors", metadata={"format": "pt"})

    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(model).__name__ == "LlamaSwiftKVForCausalLM"
    assert model.config.swiftkv and model.config.num_key_value_layers == l and model.config.key_value_group_size == g
    state = model.state_dict()
    for name, tensor in t.items():
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=0)
    with torch.no_grad():
        out = model(random_ids(1, 6, vocab=50), logits_to_keep=1).logits
    assert torch.isfinite(out).all()


def test_config_round_trip_through_autoconfig(tmp_path):
    model = convert_to_swiftkv(tiny_base("qwen2"), 3, 1)
    model.config.save_pretrained(tmp_path)
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert type(cfg).__name__ == "Qwen2SwiftKVConfig"
    assert cfg.num_key_value_layers == 3 and cfg.key_value_group_size == 1 and cfg.swiftkv is True


def test_swiftkv_switch_returns_model():
    model = convert_to_swiftkv(tiny_base(), 2)
    assert model.swiftkv(False) is model and model.config.swiftkv is False
    assert model.swiftkv(True) is model and model.config.swiftkv is True


def test_trainable_parameters_after_convert():
    model = convert_to_swiftkv(tiny_base(num_hidden_layers=6), 3, 3)
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == sorted(
        ["model.norm_swiftkv.weight"]
        + [f"model.layers.{i}.self_attn.q_proj_swiftkv.weight" for i in range(3, 6)]
        + ["model.layers.3.self_attn.k_proj_swiftkv.weight", "model.layers.3.self_attn.v_proj_swiftkv.weight"]
    )


@pytest.mark.parametrize(
    "l,g,match",
    [(0, 1, "outside \\[1, 4\\]"), (5, 1, "outside \\[1, 4\\]"), (1, 2, "does not divide the 3 layers"),
     (2, 3, "does not divide the 2 layers"), (2, 0, "does not divide")],
)
def test_bad_l_g_rejected_with_one_line(l, g, match):
    with pytest.raises(SwiftKVError, match=match) as err:
        convert_to_swiftkv(tiny_base(), l, g)
    assert "\n" not in str(err.value)


def test_unknown_family_rejected():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(SwiftKVError, match="unknown model family 'gpt2'"):
        convert_to_swiftkv(model, 1)


def test_already_swiftkv_rejected():
    model = convert_to_swiftkv(tiny_base(), 2)
    with pytest.raises(SwiftKVError, match="already a SwiftKV model"):
        convert_to_swiftkv(model, 2)


def test_register_is_idempotent():
    swiftkv.register()
    swiftkv.register()
    assert AutoConfig.for_model("llama_swiftkv").model_type == "llama_swiftkv"


def test_arctic_inference_export_expands_acrosskv_and_keeps_every_logit(tmp_path):
    """Snowflake's plugin reads num_key_value_layers only and expects k/v_proj_swiftkv in every layer >= l."""
    from swiftkv.models.convert import export_arctic_inference

    model = convert_to_swiftkv(tiny_base("llama", num_hidden_layers=6), 2, 2)
    with torch.no_grad():  # a trained-looking student: group leaders' K/V differ from any teacher layer's
        for name, p in model.named_parameters():
            if "swiftkv" in name:
                p.add_(0.01 * torch.randn_like(p))
    note = export_arctic_inference(model, None, tmp_path / "arctic")
    assert note.startswith("note: the 2-way AcrossKV groups were expanded") and "no smaller" in note
    config = json.loads((tmp_path / "arctic" / "config.json").read_text())
    assert (config["architectures"], config["model_type"]) == (["LlamaSwiftKVForCausalLM"], "llama_swiftkv")
    assert (config["num_key_value_layers"], config["key_value_group_size"], config["swiftkv"]) == (2, 1, True)
    with safe_open(tmp_path / "arctic" / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        for i in range(2, 6):
            leader = 2 + (i - 2) // 2 * 2
            for n in ("k", "v"):
                w = f.get_tensor(f"model.layers.{i}.self_attn.{n}_proj_swiftkv.weight")
                assert torch.equal(w, getattr(model.model.layers[leader].self_attn, f"{n}_proj_swiftkv").weight)
    assert {f"model.layers.{i}.self_attn.{n}_proj.weight" for i in range(6) for n in "qkv"} <= keys
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "arctic").eval()
    ids = random_ids(2, 11)
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, model(ids).logits)
        torch.testing.assert_close(exported(ids, logits_to_keep=1).logits, model(ids, logits_to_keep=1).logits)
    assert export_arctic_inference(convert_to_swiftkv(tiny_base("llama"), 2), None, tmp_path / "g1") is None


def test_arctic_inference_export_refuses_what_it_cannot_serve_in_one_line(tmp_path, capsys):
    from swiftkv.cli import main
    from tests.conftest import tiny_tokenizer

    for name, model in (("qwen2", convert_to_swiftkv(tiny_base("qwen2"), 2)), ("base", tiny_base("llama"))):
        model.save_pretrained(tmp_path / name)
        tiny_tokenizer().save_pretrained(tmp_path / name)
    capsys.readouterr()
    for src, message in (("qwen2", "arctic-inference serves llama_swiftkv checkpoints only, not qwen2_swiftkv"),
                         ("base", "'llama' is not a SwiftKV checkpoint")):
        code = main(["export", str(tmp_path / src), "--format", "arctic-inference", "-o", str(tmp_path / f"out-{src}")])
        err = capsys.readouterr().err.strip()
        assert code == 2 and message in err and "\n" not in err, err
        assert not (tmp_path / f"out-{src}").exists()
