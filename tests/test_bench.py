"""bench_prefill: the variants it times and the FLOPs-predicted ratio it records (no timing is asserted)."""

from __future__ import annotations

import json

import pytest

from swiftkv.bench.speed import PrefillBench, bench_prefill
from swiftkv.cli import main
from swiftkv.measure.flops import prefill_flops
from tests.conftest import tiny_base


def test_fraction_one_is_the_base_model_and_predicted_ratios_are_recorded():
    model = tiny_base(num_hidden_layers=4)
    out = bench_prefill(model, PrefillBench(lengths=[8], fractions=[1.0, 0.5, 0.25], warmup=0, repeats=1), progress=False)
    rows = {r["variant"]: r for r in out["results"]}
    assert sorted(rows) == ["base", "swiftkv-l1", "swiftkv-l2"]
    assert rows["base"]["predicted_ratio"] == 1.0
    expected = prefill_flops(model.config, 8, 2)["total"] / prefill_flops(model.config, 8)["total"]
    assert rows["swiftkv-l2"]["predicted_ratio"] == pytest.approx(expected)
    assert 0 < rows["swiftkv-l1"]["predicted_ratio"] < rows["swiftkv-l2"]["predicted_ratio"] < 1
    assert out["hardware"]["torch_threads"] >= 1


def test_cli_random_weights_from_a_config(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50, "max_position_embeddings": 64}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "b.json"
    assert main(["bench", "prefill", str(tmp_path / "config.json"), "--random-weights", "--name", "tiny",
                 "--dtype", "float32", "--lengths", "8", "--fractions", "0.5", "--warmup", "0", "--repeats", "1",
                 "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["model"] == "tiny" and data["random_weights"] and data["num_hidden_layers"] == 2
    assert [r["variant"] for r in data["results"]] == ["base", "swiftkv-l1"]
