"""FLOPs and KV-cache memory: a hand-counted tiny config, the paper's Table 1 and KV-memory numbers, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import LlamaConfig, MistralConfig

from analysis.paper import paper_table
from swiftkv.cli import main
from swiftkv.errors import SwiftKVError
from swiftkv.measure.flops import (
    TABLE1_CONTEXT_LENGTH,
    decode_flops_per_token,
    flops_report,
    kv_cache,
    kv_memory_table,
    model_dims,
    nearest_group_size,
    prefill_flops,
    prefill_flops_per_token,
    settings_table,
)

ROOT = Path(__file__).resolve().parents[1]
LLAMA_70B = ROOT / "config/models/llama-3.1-70b-instruct.json"
LLAMA_8B = ROOT / "config/models/llama-3.1-8b-instruct.json"


def hand_config(**overrides):
    # L=2, d=4, I=8, h=2, h_kv=1, d_h=2, V=10
    kw = dict(num_hidden_layers=2, hidden_size=4, intermediate_size=8, num_attention_heads=2, num_key_value_heads=1,
              head_dim=2, vocab_size=10)
    return LlamaConfig(**{**kw, **overrides})


def giga(d):
    return {k: v * 1e9 for k, v in d.items()}


def test_hand_counted_base_and_swiftkv():
    # per token: vocab 2*2*4*10=160; kv/layer 2*2*4*2=32; qo/layer 2*2*4*4=64; mlp/layer 3*2*4*8=192;
    # attention/layer at S=3: 4*h*d_h*(S+1)/2 = 16*2 = 32
    base = giga(prefill_flops_per_token(hand_config(), context_length=3))
    assert base == pytest.approx({"vocab": 160, "kv_proj": 64, "qo_proj": 128, "mlp": 384, "attention": 64, "total": 800})
    sk = giga(prefill_flops_per_token(hand_config(), num_key_value_layers=1, context_length=3))
    # layer 1 is skipped by prompt tokens but its K/V still come from a projection of layer 1's input
    assert sk == pytest.approx({"vocab": 160, "kv_proj": 64, "qo_proj": 64, "mlp": 192, "attention": 32, "total": 512})


def test_acrosskv_counts_one_kv_projection_per_group():
    cfg = hand_config(num_hidden_layers=5)
    f = giga(prefill_flops_per_token(cfg, num_key_value_layers=1, key_value_group_size=2, context_length=3))
    assert f["kv_proj"] == pytest.approx((1 + 4 / 2) * 32)
    assert kv_cache(cfg, 1, 2)["kv_cache_layers"] == 3
    assert kv_cache(cfg, 1, 2)["kv_cache_reduction"] == pytest.approx(1 - 3 / 5)


def test_decode_runs_every_layer_and_attends_to_the_context():
    f = giga(decode_flops_per_token(hand_config(), context_length=5))
    assert f == pytest.approx({"vocab": 160, "kv_proj": 64, "qo_proj": 128, "mlp": 384, "attention": 2 * 16 * 5,
                               "total": 160 + 64 + 128 + 384 + 160})


def test_prefill_flops_of_one_forward_hand_counted():
    # N=3 tokens, only the last one continues past l and reaches the LM head; the embedding is a lookup
    base = prefill_flops(hand_config(), 3)
    assert base == pytest.approx({"vocab": 80, "kv_proj": 192, "qo_proj": 384, "mlp": 1152, "attention": 192, "total": 2000})
    sk = prefill_flops(hand_config(), 3, num_key_value_layers=1)
    assert sk == pytest.approx({"vocab": 80, "kv_proj": 192, "qo_proj": 256, "mlp": 768, "attention": 16 * (6 + 3),
                                "total": 80 + 192 + 256 + 768 + 144})


@pytest.mark.parametrize("window", [1, 2, 3, 7, 100])
@pytest.mark.parametrize("N,l,k", [(9, 1, 1), (9, 2, 3), (5, 1, 5)])
def test_sliding_windows_cap_the_keys(window, N, l, k):
    cfg = hand_config(sliding_window=window, layer_types=["sliding_attention", "full_attention"])
    assert model_dims(cfg).windows == (window, None)
    got = prefill_flops(cfg, N, num_key_value_layers=l, logits_to_keep=k)["attention"]
    windows = [window, None]
    naive = sum(min(i, w) if w else i for w in windows[:l] for i in range(1, N + 1))
    naive += sum(min(i, w) if w else i for w in windows[l:] for i in range(N - k + 1, N + 1))
    assert got == pytest.approx(16 * naive)
    per_token = prefill_flops_per_token(cfg, context_length=N)["attention"] * 1e9
    assert per_token == pytest.approx(16 * sum(sum(min(i, w) if w else i for i in range(1, N + 1)) / N for w in windows))


def test_mistral_v01_slides_every_layer():
    dims = model_dims(MistralConfig(num_hidden_layers=3, sliding_window=4096))
    assert dims.windows == (4096,) * 3
    dims = model_dims(MistralConfig(num_hidden_layers=3, sliding_window=None))
    assert dims.windows == (None,) * 3


# --- the paper's Table 1 (Llama-3.1-70B-Instruct) --------------------------------------------------------------------

PAPER = paper_table("table1")


@pytest.mark.parametrize("row", PAPER.to_dict("records"), ids=list(PAPER.setting))
def test_table1_reproduced(row):
    ours = prefill_flops_per_token(LLAMA_70B, row["num_key_value_layers"], row["key_value_group_size"],
                                   TABLE1_CONTEXT_LENGTH)
    assert round(ours["total"]) == row["total"]  # 302 -> 228 -> 154 -> 153
    for op in ("vocab", "kv_proj", "qo_proj", "mlp", "attention"):
        unit = 0.1 if row[op] < 10 else 1.0  # one unit of the paper's last printed digit
        assert abs(ours[op] - row[op]) <= unit + 1e-9, (op, ours[op], row[op])
    assert round(ours["attention"]) == row["attention"] or row["attention"] < 10


def test_table1_context_length_window():
    """The documented fit: lengths in [122371, 122450] reproduce every total and the attention column; 120K, 128K don't."""

    dims = model_dims(LLAMA_70B)

    def matches(S):
        for row in PAPER.to_dict("records"):
            ours = prefill_flops_per_token(dims, row["num_key_value_layers"], row["key_value_group_size"], S)
            if round(ours["total"]) != row["total"] or round(ours["attention"]) != row["attention"]:
                return False
        return True

    assert all(matches(S) for S in (122_371, TABLE1_CONTEXT_LENGTH, 122_450))
    assert not any(matches(S) for S in (122_370, 122_451, 122_880, 131_072, 65_536))


def test_table1_settings_snap_acrosskv_to_divisors():
    rows = settings_table(LLAMA_70B, [{"label": "b", "skip": 0}, {"label": "50+4", "skip": 0.5, "group": 4}], 2048)
    assert [(r["num_key_value_layers"], r["key_value_group_size"]) for r in rows] == [(80, 1), (40, 4)]
    assert nearest_group_size(15, 4) == 3  # SmolLM2 at 50%: 15 later layers, 4 does not divide
    assert nearest_group_size(12, 4) == 4
    assert nearest_group_size(0, 4) == 1


# --- KV-cache memory (paper Sec. 3.3, Table B.1: Llama-3.1-8B-Instruct at 50%) ----------------------------------------


def test_kv_memory_reductions_match_the_paper():
    paper = paper_table("kv_memory")
    rows = {r["key_value_group_size"]: r for r in kv_memory_table(LLAMA_8B, 0.5)}
    assert sorted(rows) == [1, 2, 4, 8, 16]
    assert rows[1]["kv_cache_reduction"] == 0
    for p in paper.to_dict("records"):
        r = rows[p["key_value_group_size"]]
        assert r["kv_cache_reduction"] == pytest.approx(p["kv_cache_reduction"])
        if p["kv_cache_reduction_fp8"] == p["kv_cache_reduction_fp8"]:  # not NaN
            assert r["kv_cache_reduction_fp8"] == pytest.approx(p["kv_cache_reduction_fp8"])
    # 32 layers * 2 (K, V) * 8 KV heads * 128 * 2 bytes = 128 KiB per token for the base model
    assert kv_cache(LLAMA_8B)["kv_cache_bytes_per_token"] == 32 * 2 * 8 * 128 * 2


@pytest.mark.parametrize("l,g,msg", [(0, 1, "outside 1..2"), (3, 1, "outside 1..2"), (1, 2, "does not divide"),
                                     (2, 2, "needs num_key_value_layers < 2")])
def test_bad_settings_are_user_errors(l, g, msg):
    with pytest.raises(SwiftKVError, match=msg):
        prefill_flops_per_token(hand_config(), l, g)


def test_flops_report_is_flat():
    rec = flops_report(LLAMA_70B, 40, 4, TABLE1_CONTEXT_LENGTH)
    assert all(not isinstance(v, (dict, list)) for v in rec.values())
    assert rec["prefill_reduction"] == pytest.approx(1 - 153.206 / 301.538, abs=1e-4)


# --- CLI -----------------------------------------------------------------------------------------------------------


def test_cli_json_and_csv(tmp_path, capsys):
    args = ["flops", "--model-config", str(LLAMA_70B), "--num-key-value-layers", "40", "--key-value-group-size", "4",
            "--context-length", str(TABLE1_CONTEXT_LENGTH)]
    assert main([*args, "--format", "json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    for key in ("vocab", "kv_proj", "qo_proj", "mlp", "attention", "total", "kv_cache_bytes_per_token",
                "kv_cache_reduction", "kv_cache_reduction_fp8"):
        assert key in rec
    assert round(rec["total"]) == 153 and rec["kv_cache_reduction"] == pytest.approx(0.375)
    assert main([*args, "--format", "csv", "-o", str(tmp_path / "f.csv")]) == 0
    lines = (tmp_path / "f.csv").read_text().splitlines()
    assert len(lines) == 2 and lines[0].split(",")[-1] == "kv_cache_reduction_fp8"


def test_cli_errors_are_one_line(capsys):
    assert main(["flops", "--model-config", str(LLAMA_8B), "-l", "16", "-g", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: key_value_group_size=5 does not divide the 16 layers after l=16"
    assert main(["flops", "--model-config", "/nonexistent/config.json"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_snapped_group_size_shows_in_the_label():
    cfg = hand_config(num_hidden_layers=6)  # 50% -> l=3, 3 later layers: 4-way snaps to 3-way
    (row,) = settings_table(cfg, [{"label": "50% SwiftKV + 4-way AcrossKV", "skip": 0.5, "group": 4}], 16)
    assert (row["num_key_value_layers"], row["key_value_group_size"]) == (3, 3)
    assert row["setting"] == "50% SwiftKV + 3-way AcrossKV"


def test_deepseek_v2_lite_counts_latent_attention_and_the_active_experts():
    """DeepSeek-V2-Lite (config/models): ~2.4B activated parameters per token (DeepSeek's own figure: the active
    experts, attention and the LM head), an MLA cache of kv_lora_rank + qk_rope_head_dim values per token and layer."""
    dims = model_dims(ROOT / "config/models/deepseek-v2-lite-chat.json")
    assert dims.mla == (None, 512, 128, 64, 128) and dims.mlp_widths[0] == 10944 and dims.mlp_widths[1] == 8 * 1408
    base = prefill_flops_per_token(dims, context_length=1)
    active = (base["kv_proj"] + base["qo_proj"] + base["mlp"]) * 1e9 / 2 + dims.hidden * dims.vocab
    assert 2.3e9 < active < 2.5e9
    kv = kv_cache(dims, 15, 1)  # Snowflake's SwiftKV cut for this model: l = 15 of 27
    assert kv["kv_cache_bytes_per_token"] == 27 * (512 + 64) * 2 and kv["kv_cache_reduction"] == 0.0
    kv = kv_cache(dims, 15, 4)
    assert kv["kv_cache_layers"] == 15 + 12 / 4 and kv["kv_cache_reduction"] == pytest.approx(1 - 18 / 27)
    half = prefill_flops_per_token(dims, 14, 1, context_length=1)
    # prompt tokens stop after layer l: every per-layer op but the K/V (still made for every later layer) shrinks
    d = 2048
    dense, moe = 3 * 2 * d * 10944, 3 * 2 * d * 8 * 1408 + 2 * d * 64  # the router: one d x 64 matmul
    assert base["mlp"] * 1e9 == pytest.approx(dense + 26 * moe) and half["mlp"] * 1e9 == pytest.approx(dense + 13 * moe)
    assert half["kv_proj"] == base["kv_proj"] and half["qo_proj"] == pytest.approx(base["qo_proj"] * 14 / 27)
    # a real forward: the last position runs the later layers' active experts too
    one = prefill_flops(dims, 1024, 14, 1)
    assert one["mlp"] > 1024 * half["mlp"] * 1e9


def test_an_acrosskv_setting_without_a_group_is_left_out_of_table1():
    """DeepSeek-V2-Lite at 50 %: l = 14, and the 13 later layers have no divisor above 1, so the 4-way AcrossKV row
    would be a copy of the SwiftKV row; it is left out instead of being shown as "1-way AcrossKV"."""
    import yaml

    settings = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["flops"]["settings"]
    dims = model_dims(ROOT / "config/models/deepseek-v2-lite-chat.json")
    rows = settings_table(dims, settings, 1024)
    assert [r["setting"] for r in rows] == ["Baseline", "25% SwiftKV", "50% SwiftKV"]
    rows = settings_table(model_dims(ROOT / "config/models/llama-3.1-70b-instruct.json"), settings, 1024)
    assert rows[-1]["setting"] == "50% SwiftKV + 4-way AcrossKV"
