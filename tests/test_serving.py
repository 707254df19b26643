"""Serving benchmarks: variants, workloads, the transformers engine, the vLLM driver (with a stand-in vLLM CLI),
the analytical model and the report tables/figures. Tiny random models, no timing asserted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from swiftkv.bench.serving.hf import HFEngine, HFSettings
from swiftkv.bench.serving.memory import PeakMemory, large_allocations_unpooled
from swiftkv.bench.serving.processes import process_group
from swiftkv.bench.serving.server_metrics import running_requests
from swiftkv.bench.serving.variants import parse_variant, parse_variants, round_order
from swiftkv.bench.serving.vllm import VllmEngine, VllmSettings
from swiftkv.bench.serving.workloads import poisson_arrivals, random_prompts, select_sharegpt
from swiftkv.data.conversations import Conversation
from swiftkv.errors import SwiftKVError
from swiftkv.models.cache import expected_cache_bytes
from tests.conftest import tiny_base

FAKE_VLLM = [sys.executable, str(Path(__file__).with_name("fake_vllm.py"))]
REPO = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture
def word_tokenizer():
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(90)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[UNK]")


def _conversation(i: int, n_in: int, n_out: int) -> Conversation:
    words = lambda n, off: " ".join(f"w{(off + k) % 90}" for k in range(n))  # noqa: E731
    return Conversation(f"c{i}", [{"role": "user", "content": words(n_in, i)},
                                  {"role": "assistant", "content": words(n_out, i + 7)}])


# -- variants and workloads ----------------------------------------------------------------------------------


def test_variant_shorthand_and_json():
    assert parse_variant("base").num_key_value_layers is None
    s = parse_variant("swiftkv-50-acrosskv-3=15,3")
    assert (s.id, s.num_key_value_layers, s.key_value_group_size) == ("swiftkv-50-acrosskv-3", 15, 3)
    j = parse_variant('{"id": "p", "model": "d", "env": {"X": 1}, "args": ["--a"], "num_key_value_layers": 2}')
    assert j.env == {"X": "1"} and j.args == ["--a"] and j.is_swiftkv
    assert [v.id for v in parse_variants(None)] == ["base"]
    with pytest.raises(SwiftKVError, match="unique"):
        parse_variants(["a", "a=2"])
    with pytest.raises(SwiftKVError, match="use ID"):
        parse_variant("a=x")
    with pytest.raises(SwiftKVError, match="may hold"):
        parse_variant('{"id": "a", "colour": 1}')


def test_random_prompts_and_arrivals_are_seeded():
    a, b = random_prompts(3, 7, 5000, seed=1), random_prompts(3, 7, 5000, seed=1)
    assert a.shape == (3, 7) and torch.equal(a, b) and int(a.min()) >= 100
    t = poisson_arrivals(2000, 4.0, seed=0)
    assert t == poisson_arrivals(2000, 4.0, seed=0) and t == sorted(t)
    assert abs(t[-1] / 2000 - 0.25) < 0.03  # mean gap 1 / rate
    assert poisson_arrivals(3, float("inf")) == [0.0, 0.0, 0.0]


def test_sharegpt_selection_filters_on_original_ratio_and_caps_output(word_tokenizer):
    convs = [_conversation(i, n_in, n_out) for i, (n_in, n_out) in
             enumerate([(10, 100), (40, 20), (60, 6), (80, 4), (3, 10), (20, 2), (50, 30)])]
    sel = select_sharegpt(word_tokenizer, [0, 2, 10], num_requests=10, max_input_len=70, max_output_len=8,
                          conversations=convs)
    by_ratio = {f["min_ratio"]: f for f in sel["filters"]}
    # dropped: prompt of 3 (< 4), reply of 2 (< 4), prompt of 80 (> max_input_len)
    assert sel["usable"] == 4
    assert sorted(r["id"] for r in by_ratio[0]["requests"]) == ["c0", "c1", "c2", "c6"]
    assert sorted(r["id"] for r in by_ratio[2]["requests"]) == ["c1", "c2"]  # 40/20, 60/6 (original lengths)
    assert [r["id"] for r in by_ratio[10]["requests"]] == ["c2"]
    for f in sel["filters"]:
        for r in f["requests"]:
            assert r["output_len"] == min(r["reply_len"], 8)
            assert len(word_tokenizer(r["reply"])["input_ids"]) == r["output_len"]
    f2 = by_ratio[2]
    assert f2["ratio_of_sums"] == pytest.approx((40 + 60) / (8 + 6))
    assert f2["uncapped_ratio_of_sums"] == pytest.approx((40 + 60) / (20 + 6))
    with pytest.raises(SwiftKVError, match="no ShareGPT request"):
        select_sharegpt(word_tokenizer, [1000], 2, 70, 8, conversations=convs)


# -- the transformers engine ---------------------------------------------------------------------------------


def _engine(**kw) -> HFEngine:
    base = tiny_base(num_hidden_layers=6)
    specs = parse_variants(["base", "swiftkv=3", "acrosskv=3,3"])
    settings = HFSettings(batch_size=2, warmup=1, repeats=2, **kw)
    return HFEngine(base, specs, settings, progress=False)


def test_hf_throughput_rows_and_real_cache_saving():
    engine = _engine()
    rows = engine.throughput([12, 20], output_len=5, num_requests=3)
    assert [(r["input_len"], r["variant"]) for r in rows] == [
        (12, "base"), (12, "swiftkv"), (12, "acrosskv"), (20, "base"), (20, "swiftkv"), (20, "acrosskv")]
    for r in rows:
        assert r["total_tokens"] == 3 * (r["input_len"] + 5)
        assert len(r["elapsed_times_s"]) == 2 and r["throughput_tok_s"] > 0
        assert r["prefill_s"] + r["decode_s"] <= r["elapsed_s"] * 1.001
    base, swift, across = rows[3:]
    assert base["speedup"] == 1.0 and base["paired_speedup"] == 1.0 and swift["paired_speedup"] > 0
    # the memory pass keeps generate's cache: batch of 2, 20 + 5 - 1 cached positions, L=6 -> l + (L-l)/g layers
    cfg = engine.base.config
    for r, g in ((base, None), (swift, 1), (across, 3)):
        model = engine.models[r["variant"]]
        assert r["kv_cache_bytes"] == expected_cache_bytes(model.config, 24, 2, 4, swiftkv=g is not None)
    assert across["kv_cache_bytes"] * 6 == base["kv_cache_bytes"] * (3 + 1)
    assert cfg.num_hidden_layers == 6


def test_hf_generate_makes_exactly_output_len_tokens():
    engine = _engine()
    ids = random_prompts(2, 9, engine.base.config.vocab_size)
    for model in engine.models.values():
        t = engine.generate(model, ids, 4, keep_cache=True)
        assert t.new_tokens == 4 and t.kv_cache_bytes > 0


def test_hf_kv_limit_fits_more_acrosskv_requests():
    engine = _engine(max_batch=8)
    per = expected_cache_bytes(engine.base.config, 10 + 3, 1, 4)  # one base request
    small_limit = int(0.7 * per)
    rows = engine.kv_limit(10, 3, num_requests=4, limits_bytes=[small_limit, 2 * per])
    small = {r["variant"]: r for r in rows if r["kv_limit_bytes"] == small_limit}
    big = {r["variant"]: r for r in rows if r["kv_limit_bytes"] == 2 * per}
    assert small["base"]["status"] == "does_not_fit" and small["base"]["throughput_tok_s"] is None
    assert small["acrosskv"]["batch_size"] == 1  # 4 of 6 layers cached: 2/3 of a base request
    assert (big["base"]["batch_size"], big["swiftkv"]["batch_size"], big["acrosskv"]["batch_size"]) == (2, 2, 3)
    assert big["acrosskv"]["kv_cache_bytes"] <= 2 * per


def test_hf_latency_static_batching():
    engine = _engine()
    rows = engine.latency(8, 3, num_requests=3, rates=[float("inf"), 1000.0])
    burst = [r for r in rows if r["request_rate"] == float("inf")]
    assert all(r["mean_batch_size"] == 3 for r in burst)  # all arrived at once: one batch
    for r in rows:
        assert r["median_ttft_ms"] > 0 and r["median_tpot_ms"] > 0 and r["median_e2el_ms"] >= r["median_ttft_ms"]
        # every request's own TTFT and TPOT, in arrival order: what the intervals of the latency claims resample
        assert len(r["ttft_ms"]) == len(r["tpot_ms"]) == 3
        assert sorted(r["ttft_ms"])[1] == pytest.approx(r["median_ttft_ms"], abs=1e-3)
    assert {r["variant"] for r in rows} == {"base", "swiftkv", "acrosskv"}


def test_noise_floor_measures_the_reference_again_interleaved():
    """--noise-floor: the reference once more, last, as '<id>-again'; measured in every round like any variant, so
    its speedup over the reference is the spread the machine alone gives."""
    specs = parse_variants(["base", "swiftkv=3"], noise_floor=True)
    assert [(s.id, s.again_of, s.label) for s in specs] == [
        ("base", None, None), ("swiftkv", None, None), ("base-again", "base", "base (again)")]
    engine = HFEngine(tiny_base(num_hidden_layers=6), specs, HFSettings(batch_size=2, warmup=0, repeats=3),
                      progress=False)
    rows = engine.throughput([12], output_len=3, num_requests=2)
    again = next(r for r in rows if r["variant"] == "base-again")
    assert len(again["throughput_runs_tok_s"]) == 3 and again["speedup"] > 0
    assert engine.models["base-again"] is engine.models["base"]  # the same model, timed in its own slot
    assert [s.id for s in parse_variants(["swiftkv=3", "other=2"], noise_floor=True)][-1] == "swiftkv-again"


def test_hf_sharegpt_uses_selected_lengths(word_tokenizer):
    convs = [_conversation(i, 30 + i, 5 + i) for i in range(4)]
    sel = select_sharegpt(word_tokenizer, [0, 5], 3, 64, 6, conversations=convs)
    engine = _engine()
    engine.tokenizer = word_tokenizer
    rows = engine.sharegpt(sel["filters"])
    assert {r["min_ratio"] for r in rows} == {0, 5}
    for r in rows:
        f = next(f for f in sel["filters"] if f["min_ratio"] == r["min_ratio"])
        assert r["total_tokens"] == sum(q["input_len"] + q["output_len"] for q in f["requests"])
        assert r["ratio_of_sums"] == pytest.approx(f["ratio_of_sums"])
    bad = json.loads(json.dumps(sel["filters"][:1]))
    bad[0]["requests"][0]["input_len"] += 1
    with pytest.raises(SwiftKVError, match="tokenises to"):
        engine.sharegpt(bad)


def test_hf_rejects_swiftkv_checkpoint_and_model_field():
    base = tiny_base()
    with pytest.raises(SwiftKVError, match="vllm engine"):
        HFEngine(base, [parse_variant('{"id": "x", "model": "dir"}')], HFSettings(), progress=False)


def test_peak_memory_sees_a_large_allocation():
    large_allocations_unpooled()
    with PeakMemory("cpu") as mem:
        x = torch.ones(16 * 2**20 // 4)  # 16 MiB
        time.sleep(0.05)
        del x
    assert mem.delta >= 12 * 2**20


# -- the analytical model ------------------------------------------------------------------------------------


@pytest.fixture
def stand_in_flops(monkeypatch):
    """A private stand-in for swiftkv.measure.flops (the analysis issue owns the real one): FLOPs counted in layers."""
    from swiftkv.bench.serving import predict

    def prefill_flops(config, num_tokens, num_key_value_layers=None, key_value_group_size=1, logits_to_keep=1):
        L = config.num_hidden_layers
        l = num_key_value_layers or L
        return {"total": num_tokens * l + logits_to_keep * (L - l) + 1.0}

    def decode_flops_per_token(config, context_length=0):
        return {"total": (config.num_hidden_layers + 2.0) / 1e9, "vocab": 2.0 / 1e9}  # head + embedding: 1 + 1

    module = types.ModuleType("swiftkv.measure.flops")
    module.prefill_flops, module.decode_flops_per_token = prefill_flops, decode_flops_per_token
    monkeypatch.setitem(sys.modules, "swiftkv.measure.flops", module)
    predict._flops_functions.cache_clear()
    yield
    predict._flops_functions.cache_clear()


def test_predicted_speedup_grows_with_input_output_ratio(stand_in_flops):
    from swiftkv.bench.serving.predict import predicted_speedup

    cfg = types.SimpleNamespace(num_hidden_layers=30)
    assert predicted_speedup(cfg, [(100, 10)], None) == 1.0
    # base: 100*30 + 1 + 9*31 ; l=15: 100*15 + 15 + 1 + 9*31 (decode: 30 layers + head, embedding not counted)
    assert predicted_speedup(cfg, [(100, 10)], 15) == pytest.approx((3000 + 1 + 279) / (1500 + 16 + 279))
    ratios = [predicted_speedup(cfg, [(n, 64)], 15) for n in (64, 256, 1024, 8192)]
    assert ratios == sorted(ratios) and ratios[-1] < 2.0


def test_engine_rows_carry_predictions(stand_in_flops):
    rows = _engine(memory=False).throughput([16], 4, 2)
    assert rows[0]["predicted_speedup"] == 1.0 and rows[1]["predicted_speedup"] > 1.0


# -- the vLLM driver (stand-in CLI) --------------------------------------------------------------------------


def _vllm(tmp_path, specs, **kw) -> VllmEngine:
    settings = VllmSettings(command=FAKE_VLLM, workdir=str(tmp_path / "runs"), startup_timeout_s=60, **kw)
    return VllmEngine(str(tmp_path), parse_variants(specs), settings, progress=False)


def test_vllm_throughput_and_kv_limit_rows(tmp_path):
    engine = _vllm(tmp_path, ["base", '{"id": "swiftkv-50", "model": "m-swiftkv", "num_key_value_layers": 2}'],
                   repeats=2)
    rows = engine.throughput([16, 32], 4, 3)
    assert engine.version == "0.0-fake"
    assert [r["speedup"] for r in rows] == [1.0, 1.5, 1.0, 1.5]
    assert rows[0]["engine_total_tokens"] == 3 * 20 and len(rows[0]["runs"]) == 2
    assert rows[0]["throughput_runs_tok_s"] == [1000.0, 1000.0] and rows[0]["kv_cache_tokens"] == 4096
    assert len(list((tmp_path / "runs/throughput").glob("*.server.log"))) == 2  # one server per variant, all rounds
    server = (tmp_path / "runs/throughput/base.server.log").read_text().splitlines()[0]
    assert "--no-enable-prefix-caching" in server and "--kv-cache-memory-bytes" in server and "--enforce-eager" in server
    round0 = (tmp_path / "runs/throughput/in16/base/run0.log").read_text().splitlines()[0]
    assert " bench serve " in round0 and "--request-rate inf" in round0 and "--ignore-eos" in round0
    rows = engine.kv_limit(16, 4, 3, [500, 10**6])
    failed = rows[0]
    assert failed["status"] == "not_measured" and "KV cache cannot hold" in failed["reason"]
    assert rows[2]["throughput_tok_s"] == 1000.0 and rows[3]["speedup"] == 1.5
    # the requests run at once, read from each server's /metrics while its rounds ran (the fake's gauge: 8)
    assert [r["max_running"] for r in rows[2]["runs"]] == [8.0, 8.0] and rows[2]["concurrency"] == 8.0
    # every round's variant order is drawn from the seed, recorded per point, and the same in a second run
    orders = rows[2]["round_orders"]
    assert len(orders) == 2 and all(sorted(o) == ["base", "swiftkv-50"] for o in orders)
    assert orders == [round_order(["base", "swiftkv-50"], 0, f"kv-limit/{10**6}", i) for i in range(2)]


def test_round_orders_are_drawn_per_round_and_recorded():
    """No variant always runs first: over 20 rounds of 4 variants every variant leads at least once, and the orders
    follow from (seed, point, round) alone."""
    names = ["base", "swiftkv-50", "swiftkv-50-acrosskv-3", "base-again"]
    orders = [round_order(names, 0, "kv-limit/51 MiB", i) for i in range(20)]
    assert all(sorted(o) == sorted(names) for o in orders) and {o[0] for o in orders} == set(names)
    assert orders == [round_order(names, 0, "kv-limit/51 MiB", i) for i in range(20)]
    assert orders != [round_order(names, 1, "kv-limit/51 MiB", i) for i in range(20)]
    engine = _engine(max_batch=8)
    engine.settings.repeats = 3
    per = expected_cache_bytes(engine.base.config, 10 + 3, 1, 4)
    rows = engine.kv_limit(10, 3, num_requests=4, limits_bytes=[2 * per])
    assert all(r["round_orders"] == rows[0]["round_orders"] for r in rows)
    assert [sorted(o) for o in rows[0]["round_orders"]] == [sorted(r["variant"] for r in rows)] * 3
    assert [r["concurrency"] for r in rows] == [r["batch_size"] for r in rows]


def test_running_requests_are_read_from_prometheus_text():
    text = ("# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n'
            "vllm:num_requests_running_total 9\n"
            'vllm:num_requests_waiting{engine="0",model_name="m"} 5.0\n')
    assert running_requests(text) == 5.0  # summed over engine cores; other metrics ignored
    assert running_requests("# nothing here\n") is None


def test_vllm_marks_arctic_acrosskv_rows(tmp_path):
    arctic = '{"id": "a", "model": "m-swiftkv", "env": {"ARCTIC_INFERENCE_ENABLED": "1"}, ' \
             '"num_key_value_layers": 2, "key_value_group_size": 2}'
    rows = _vllm(tmp_path, ["base", arctic]).throughput([16], 4, 2)
    assert rows[1]["status"] == "not_measured" and "ignores key_value_group_size" in rows[1]["reason"]
    assert rows[1]["throughput_tok_s"] is None and rows[0]["throughput_tok_s"] == 1000.0


def test_vllm_sharegpt_writes_vllm_dataset(tmp_path, word_tokenizer):
    convs = [_conversation(i, 20 + i, 5) for i in range(3)]
    sel = select_sharegpt(word_tokenizer, [0], 3, 64, 4, conversations=convs)
    rows = _vllm(tmp_path, ["base"]).sharegpt(sel["filters"])
    data = json.loads((tmp_path / "runs/sharegpt/ratio0/requests.json").read_text())
    assert [c["conversations"][0]["from"] for c in data] == ["human"] * 3
    assert rows[0]["engine_total_tokens"] == sum(q["input_len"] + q["output_len"] for q in sel["filters"][0]["requests"])


def test_vllm_latency_server_is_stopped(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(pids))
    rows = _vllm(tmp_path, ["base"]).latency(16, 4, 2, [1.0, 4.0])
    assert [r["median_ttft_ms"] for r in rows] == [110.0, 140.0]
    assert rows[0]["ttft_ms"] == [110.0, 111.0] and rows[0]["tpot_ms"] == [11.0, 11.0]  # --save-detailed, per request
    server, child = map(int, pids.read_text().split())
    time.sleep(0.5)
    assert not _alive(server) and not _alive(child)


def test_process_group_ends_grandchildren(tmp_path):
    marker = tmp_path / "child.pid"
    code = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
            f"open({str(marker)!r}, 'w').write(str(p.pid)); time.sleep(600)")
    with process_group([sys.executable, "-c", code], dict(os.environ), tmp_path / "log") as proc:
        for _ in range(100):
            if marker.exists() and marker.read_text():
                break
            time.sleep(0.05)
    child = int(marker.read_text())
    time.sleep(0.2)
    assert proc.poll() is not None and not _alive(child)


def _cli(*args, env=None, **kw):
    return subprocess.Popen([sys.executable, "-m", "swiftkv.cli", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_killed_cli_leaves_no_server(tmp_path):
    """SIGTERM to `swiftkv bench serve` while a server runs: the server and its child end too."""
    pids = tmp_path / "pids"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    env = {**os.environ, "FAKE_VLLM_PIDS": str(pids), "FAKE_VLLM_BENCH_SLEEP": "60",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = _cli("bench", "serve", str(tmp_path), "--engine", "vllm", "--study", "latency", "--input-lens", "8", "--output-len", "2",
                "--request-rates", "1", "--vllm-command", " ".join(FAKE_VLLM), "-o", str(tmp_path / "out.json"),
                env=env)
    for _ in range(3000):  # the CLI imports torch first: slow on a busy machine
        if pids.exists() and pids.read_text().strip():
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    server, child = map(int, pids.read_text().split())
    time.sleep(1.0)  # the bench client is running now
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    time.sleep(0.5)
    assert proc.returncode != 0 and not (tmp_path / "out.json").exists()
    assert not _alive(server) and not _alive(child)


# -- unavailable engines and the command line ----------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_unavailable_engines_are_marked_or_fail_in_one_line(tmp_path):
    from swiftkv.cli import main

    cfg = tmp_path / "tiny.json"
    tiny_base().config.to_json_file(cfg)
    out = tmp_path / "gpu.json"
    assert main(["bench", "serve", str(cfg), "--engine", "hf", "--device", "cuda", "--study", "throughput",
                 "--on-unavailable", "mark", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["status"] == "not_measured" and "CUDA" in data["reason"]
    assert data["results"][0]["status"] == "not_measured"
    out = tmp_path / "vllm.json"
    tiny_base().config.save_pretrained(tmp_path / "model")
    assert main(["bench", "serve", str(tmp_path / "model"), "--engine", "vllm", "--study", "throughput", "--vllm-command",
                 "no-such-vllm", "--on-unavailable", "mark", "-o", str(out)]) == 0
    assert "not found" in json.loads(out.read_text())["reason"]
    assert main(["bench", "serve", str(tmp_path / "model"), "--engine", "vllm", "--study", "throughput",
                 "--vllm-command", "no-such-vllm", "-o", str(out)]) == 2


def test_cli_bench_serve_hf_on_a_config_json(tmp_path, capsys):
    from swiftkv.cli import main

    cfg = tmp_path / "tiny.json"
    tiny_base().config.to_json_file(cfg)
    out = tmp_path / "tput.json"
    assert main(["bench", "serve", str(cfg), "--engine", "hf", "--study", "throughput", "--input-lens", "8",
                 "--output-len", "2", "--num-requests", "2", "--batch-size", "2", "--repeats", "1", "--variant",
                 "base", "--variant", "s=2", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["status"] == "measured" and data["hardware"]["label"] and len(data["results"]) == 2
    assert main(["bench", "serve", str(cfg), "--engine", "hf", "--study", "latency", "-o", str(out)]) == 2
    assert "needs --request-rates" in capsys.readouterr().err


# -- analysis ------------------------------------------------------------------------------------------------


def test_report_tables_and_figures(tmp_path):
    from analysis.paper import paper_table
    from analysis.serving import load_results, table3, table_a3
    from analysis.serving_figures import figure3, figure4

    engine = _vllm(tmp_path, ["base", '{"id": "swiftkv-50", "model": "m-swiftkv", "num_key_value_layers": 2}'])
    hf = _engine(memory=False)
    noisy = HFEngine(tiny_base(num_hidden_layers=6), parse_variants(["base", "swiftkv=3"], noise_floor=True),
                     HFSettings(batch_size=2, warmup=0, repeats=3, memory=False), progress=False)

    def dump(name, engine_name, study, rows, **extra):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"engine": engine_name, "study": study, "model": "tiny", "status": "measured",
                                    "hardware": {"label": "test CPU"}, "results": rows, **extra}))
        return path

    tput = [dump("t1", "vllm", "throughput", engine.throughput([16, 32], 4, 2)),
            dump("t2", "hf", "throughput", noisy.throughput([8, 16], 2, 2),
                 variants=[sp.to_dict() for sp in noisy.specs.values()]),
            dump("t3", "vllm", "throughput", [], status="not_measured", reason="no GPU here", device="cuda")]
    df = load_results(tput)
    assert set(df["status"]) == {"measured", "not_measured"}
    assert df.loc[df["variant"] == "base-again", "again_of"].tolist() == ["base", "base"]  # from the run's variants
    assert df["source"].nunique() == 3 and (df.loc[df["status"] == "not_measured", "hardware"] == "cuda").all()
    figure3(df, paper_table("figure3_throughput.csv"), tmp_path / "f3.png")
    assert (tmp_path / "f3.png").stat().st_size > 10_000
    lat = [dump("l1", "hf", "latency", hf.latency(8, 2, 2, [100.0, 1000.0]))]
    figure4(load_results(lat), paper_table("figure4_latency.csv"), tmp_path / "f4.png")
    assert (tmp_path / "f4.png").stat().st_size > 10_000
    kv = [dump("k1", "vllm", "kv-limit", engine.kv_limit(16, 4, 2, [500, 10**6]))]
    t3 = table3(load_results(kv), paper_table("table3_memory.csv"))
    assert "not measured here: " in " ".join(t3["status"].astype(str))
    paper = t3[t3["source"] == "paper"]
    assert paper.loc[(paper["variant"] == "swiftkv-50") & (paper["kv_limit"] == "80 GB GPU memory"),
                     "speedup"].iloc[0] == pytest.approx(31000 / 22900)
    ta3 = table_a3(load_results([dump("s1", "vllm", "sharegpt", [{"variant": "base", "min_ratio": 2,
                                                                   "ratio_of_sums": 9.0, "throughput_tok_s": 5.0}])]),
                   paper_table("tableA3_sharegpt.csv"))
    assert ta3.iloc[0]["mean_ratio"] == 9.0 and (ta3["source"] == "paper").sum() == 9


# -- the rules -----------------------------------------------------------------------------------------------

SERVE_TARGETS = ["results/reports/figure3_throughput.png", "results/reports/figure4_latency.png",
                 "results/reports/table3.csv", "results/reports/tableA3.csv"]


@pytest.mark.parametrize("profile", ["config/config.yaml", "config/ci.yaml"])
def test_serving_dag_dry_run(profile, tmp_path):
    out = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--cores", "1", f"--configfile={profile}",
                          "--directory", str(tmp_path), "--snakefile", str(REPO / "Snakefile"), "--", *SERVE_TARGETS],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    for engine in ("hf-cpu", "vllm-cpu"):
        for study in ("throughput", "latency", "kv-limit", "sharegpt"):
            assert f"results/bench/serve/{engine}/smollm2-135m/{study}.json" in text
    assert '"num_key_value_layers": 15, "key_value_group_size": 3' in text  # variants.tsv drives the hf rows
    assert "--on-unavailable mark" in text and "bin/vllm-env --check" in text


def test_vllm_kv_capacity_is_read_from_the_engine_log(tmp_path):
    from swiftkv.bench.serving.vllm import kv_capacity

    log = tmp_path / "run0.log"
    log.write_text("(EngineCore pid=1) INFO 11-30 05:51:55 [kv_cache_utils.py:2327] CPU KV cache size: 6,272 tokens, "
                   "Maximum concurrency for 512 tokens per request: 12.25x\n")
    assert kv_capacity(log) == {"kv_cache_tokens": 6272, "kv_cache_max_concurrency": 12.25}
    assert kv_capacity(tmp_path / "missing.log") == {"kv_cache_tokens": None, "kv_cache_max_concurrency": None}


def test_a_serve_request_round_trips_through_its_command_line():
    """ServeRequest.to_args (what the workflow's bench_serve rule runs) parses back to the same request, whatever
    its fields: lists, repeated variants, flags, values that start with a dash, fields left at their defaults."""
    from swiftkv.bench.serving.run import ServeRequest
    from swiftkv.cli import build_parser

    requests = [
        ServeRequest(model="smollm2-135m", engine="hf", study="throughput", output="o.json"),
        ServeRequest(model="m", engine="vllm", study="latency", output="x/y.json", variant=['{"id": "base"}', "s=15,3"],
                     input_lens=[512], request_rates=[0.1, 0.25], threads=2, no_memory=True, kv_cache_mib=64.5,
                     vllm_args="--tensor-parallel-size 2", on_unavailable="mark", workdir="w", max_model_len=640),
        ServeRequest(model="m", engine="hf", study="kv-limit", output="k.json", input_lens=[480], kv_limits_mib=[29, 51]),
    ]
    parser = build_parser()
    for request in requests:
        args = request.to_args()
        assert ServeRequest.from_options(parser.parse_args(["bench", "serve", *args])) == request, args
    assert "--no-memory" in requests[1].to_args() and "--vllm-args=--tensor-parallel-size 2" in requests[1].to_args()
    assert requests[0].to_args() == ["smollm2-135m", "--engine", "hf", "--study", "throughput", "--output", "o.json"]
