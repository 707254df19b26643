"""Serving intervals (issue 16, item 5): every speedup from its interleaved repeats, every latency ratio from its
requests, each beside the noise floor measured by the reference's second copy."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.serving import latency_intervals, repeat_ratio, request_ratio, speedup_intervals


def test_repeat_ratio_is_the_median_of_same_round_ratios():
    base = [100.0, 90.0, 110.0, 100.0, 95.0]  # a drifting machine: every variant of a round drifts together
    fast = [b * r for b, r in zip(base, [1.5, 1.4, 1.6, 1.5, 1.45])]
    est = repeat_ratio(fast, base)
    assert est.value == pytest.approx(1.5)
    assert 1.4 - 1e-9 <= est.low <= est.value <= est.high <= 1.6 + 1e-9
    assert math.isnan(repeat_ratio(fast, None).value) and math.isnan(repeat_ratio(fast[:3], base).value)


def test_request_ratio_pairs_requests_and_skips_missing_ones():
    ref = [100.0 + i for i in range(50)]
    half = [v / 2 for v in ref]
    est = request_ratio(half, ref)
    assert est.value == pytest.approx(0.5) and est.low == pytest.approx(0.5) and est.high == pytest.approx(0.5)
    assert request_ratio([None, 2.0, 4.0], [1.0, 1.0, 2.0]).value == pytest.approx(3.0 / 1.5)


def _rows(study, key, point, runs_by_variant, column):
    return [{"source": "s", "study": study, key: point, "variant": v, "status": "measured",
             "again_of": "base" if v == "base-again" else None, column: runs} for v, runs in runs_by_variant.items()]


def test_speedup_intervals_give_every_row_its_interval_and_the_points_noise_floor():
    rows = _rows("throughput", "input_len", 1024, {
        "base": [100.0, 100, 100, 100, 100], "swiftkv": [150.0, 140, 160, 150, 150],
        "base-again": [101.0, 99, 100, 102, 98]}, "throughput_runs_tok_s")
    rows += _rows("throughput", "input_len", 256, {"base": [50.0], "swiftkv": [55.0]}, "throughput_runs_tok_s")
    out = speedup_intervals(pd.DataFrame(rows)).set_index(["input_len", "variant"])
    s = out.loc[(1024, "swiftkv")]
    assert s.speedup_paired == pytest.approx(1.5) and s.speedup_paired_lo >= 1.4 - 1e-9 and s.n_repeats == 5
    assert s.speedup_paired_noise_lo == pytest.approx(out.loc[(1024, "base-again")].speedup_paired_lo)
    assert 0.97 <= s.speedup_paired_noise_lo < 1.0 < s.speedup_paired_noise_hi <= 1.03
    one = out.loc[(256, "swiftkv")]  # one round: an estimate, no interval, no noise floor
    assert one.speedup_paired == pytest.approx(1.1) and one.speedup_paired_lo == pytest.approx(1.1)
    assert math.isnan(one.speedup_paired_noise_lo)


def test_latency_intervals_are_ratios_of_medians_over_the_same_requests():
    ref = [200.0 + 3 * i for i in range(50)]
    rows = _rows("latency", "request_rate", 0.5, {"base": ref, "swiftkv": [v * 0.6 for v in ref],
                                                  "base-again": [v * (1 + 0.01 * (-1) ** i) for i, v in enumerate(ref)]},
                 "ttft_ms")
    for r in rows:
        r["tpot_ms"] = [10.0] * 50
    out = latency_intervals(pd.DataFrame(rows)).set_index("variant")
    assert out.loc["swiftkv"].ttft_ratio == pytest.approx(0.6) and out.loc["swiftkv"].n_requests_timed == 50
    assert out.loc["swiftkv"].ttft_ratio_noise_lo < 1.0 < out.loc["swiftkv"].ttft_ratio_noise_hi
    assert out.loc["swiftkv"].tpot_ratio == 1.0


# -- the registered serving claims on raw serving results -------------------------------------------------------


def _commit_raw(tmp_path, study: str, rows: list[dict], variants: list[dict]) -> None:
    """A serving result as the pipeline commits it: results/... collected into reports/raw/serving/<study>."""
    import json

    from analysis.raw import collect

    src = f"results/bench/serve/hf-cpu/tiny/{study}.json"
    (tmp_path / src).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / src).write_text(json.dumps({"engine": "hf", "study": study, "model": "tiny", "status": "measured",
                                            "hardware": {"label": "test CPU"}, "variants": variants,
                                            "results": rows}))
    collect([src], tmp_path / "reports/raw/serving" / study, "hash", "abc123", repo=tmp_path)


VARIANTS = [{"id": "base"}, {"id": "swiftkv-50", "num_key_value_layers": 2},
            {"id": "base-again", "again_of": "base"}]


def _throughput_rows(rounds: int, gain: float, noise: float = 0.01) -> list[dict]:
    rows = []
    for length in (512, 1024, 2048):
        base = [100.0 + 5 * (i % 3) for i in range(rounds)]
        runs = {"base": base, "swiftkv-50": [b * (gain + 0.02 * (i % 2)) for i, b in enumerate(base)],
                "base-again": [b * (1 + noise * (-1) ** i) for i, b in enumerate(base)]}
        rows += [{"variant": v, "input_len": length, "output_len": 64, "throughput_tok_s": sorted(r)[len(r) // 2],
                  "throughput_runs_tok_s": r} for v, r in runs.items()]
    return rows


def test_throughput_gain_is_decided_on_every_long_input_point_with_5_repeats(tmp_path, monkeypatch):
    from analysis.claims import DECIDED, PROVISIONAL, evaluate
    from analysis.rules import HOLDS, UNCLEAR

    monkeypatch.chdir(tmp_path)
    _commit_raw(tmp_path, "throughput", _throughput_rows(5, 1.5), VARIANTS)
    row = evaluate(tmp_path / "reports", registered_points=False).set_index("id").loc["throughput-gain"]
    assert (row.status, row.verdict, row.n_points) == (DECIDED, HOLDS, 2)  # 1024 and 2048 in; 512 is not a point
    assert "noise [" in row.points and "1024 tokens in" in row.points and "512 tokens in" not in row.points
    # fewer rounds than registered: estimates, no interval, not decided
    _commit_raw(tmp_path, "throughput", _throughput_rows(3, 1.5), VARIANTS)
    row = evaluate(tmp_path / "reports", registered_points=False).set_index("id").loc["throughput-gain"]
    assert (row.status, row.verdict) == (PROVISIONAL, UNCLEAR) and "fewer than 5 interleaved repeats" in row.why
    # a gain inside the noise floor cannot hold
    _commit_raw(tmp_path, "throughput", _throughput_rows(5, 1.02, noise=0.2), VARIANTS)
    assert evaluate(tmp_path / "reports", registered_points=False).set_index("id").loc["throughput-gain"].verdict == UNCLEAR


def test_latency_claims_use_every_rate_and_report_the_lowest_tpot_rate_apart(tmp_path, monkeypatch):
    from analysis.claims import DECIDED, evaluate
    from analysis.rules import FAILS, HOLDS

    monkeypatch.chdir(tmp_path)
    rows = []
    for rate, tpot_gain in ((0.1, 1.0), (0.4, 0.8)):
        ttft = [300.0 + 7 * i for i in range(50)]
        tpot = [20.0 + (i % 5) for i in range(50)]
        for v, t_gain, p_gain in (("base", 1, 1), ("swiftkv-50", 0.6, tpot_gain), ("base-again", 1.01, 0.99)):
            rows.append({"variant": v, "request_rate": rate, "input_len": 512, "output_len": 32,
                         "ttft_ms": [x * t_gain for x in ttft], "tpot_ms": [x * p_gain for x in tpot]})
    _commit_raw(tmp_path, "latency", rows, VARIANTS)
    frame = evaluate(tmp_path / "reports", registered_points=False).set_index("id")
    assert (frame.loc["ttft-lower", "status"], frame.loc["ttft-lower", "verdict"]) == (DECIDED, HOLDS)
    assert frame.loc["ttft-lower", "n_points"] == 2
    tpot = frame.loc["tpot-lower"]
    assert (tpot.verdict, tpot.n_points) == (HOLDS, 1) and "0.1 req/s" in tpot.why and "not deciding" in tpot.why
    slower = [dict(r, tpot_ms=[x * 1.3 for x in r["tpot_ms"]]) if r["variant"] == "swiftkv-50" else r for r in rows]
    _commit_raw(tmp_path, "latency", slower, VARIANTS)
    assert evaluate(tmp_path / "reports", registered_points=False).set_index("id").loc["tpot-lower", "verdict"] == FAILS


def _memory_and_sharegpt(tmp_path, ratios=(0, 2, 5, 20, 100), drift: float = 0.0, binds: bool = True):
    """kv-limit and sharegpt studies with 5 rounds and the base-again noise floor; ``drift``: how much the base
    model's second measurement moves with the limit and the ratio (a noise floor the effect may not clear);
    ``binds``: whether AcrossKV ran more requests at once than SwiftKV at the smallest limit (3 vs 2, else 2 vs 2)."""
    variants = [*VARIANTS, {"id": "swiftkv-50-acrosskv-3", "num_key_value_layers": 2, "key_value_group_size": 3}]
    rows = []
    for k, (limit, gain) in enumerate(((51 * 2**20, 1.3), (186 * 2**20, 1.02))):  # AcrossKV fits more at 51 MiB
        swift = [150.0 + i for i in range(5)]
        at_once = (3 if binds else 2, 2) if k == 0 else (8, 8)
        rows += [{"variant": "swiftkv-50", "kv_limit_bytes": limit, "throughput_runs_tok_s": swift,
                  "concurrency": at_once[1]},
                 {"variant": "swiftkv-50-acrosskv-3", "kv_limit_bytes": limit, "concurrency": at_once[0],
                  "throughput_runs_tok_s": [s * (gain + 0.01 * (i % 2)) for i, s in enumerate(swift)]},
                 {"variant": "base", "kv_limit_bytes": limit, "throughput_runs_tok_s": [100.0] * 5},
                 {"variant": "base-again", "kv_limit_bytes": limit,
                  "throughput_runs_tok_s": [100.0 * (1 + drift * (1 - k) + 0.01 * (-1) ** i) for i in range(5)]}]
    _commit_raw(tmp_path, "kv-limit", rows, variants)
    sharegpt = []
    for k, ratio in enumerate(ratios):
        base = [80.0 + i for i in range(5)]
        gain = 1.05 + 0.15 * k
        sharegpt += [{"variant": "base", "min_ratio": ratio, "throughput_runs_tok_s": base},
                     {"variant": "base-again", "min_ratio": ratio,
                      "throughput_runs_tok_s": [b * (1 + drift * k + 0.01 * (-1) ** i) for i, b in enumerate(base)]},
                     {"variant": "swiftkv-50", "min_ratio": ratio,
                      "throughput_runs_tok_s": [b * (gain + 0.02 * (i % 2)) for i, b in enumerate(base)]}]
    _commit_raw(tmp_path, "sharegpt", sharegpt, VARIANTS)
    from analysis.claims import evaluate

    return evaluate(tmp_path / "reports", registered_points=False).set_index("id")


def test_memory_limit_and_sharegpt_claims_read_the_rounds_of_every_point(tmp_path, monkeypatch):
    from analysis.claims import DECIDED, PROVISIONAL
    from analysis.rules import HOLDS, UNCLEAR

    monkeypatch.chdir(tmp_path)
    frame = _memory_and_sharegpt(tmp_path)
    mem = frame.loc["acrosskv-helps-under-memory-limits"]
    assert (mem.status, mem.verdict) == (DECIDED, HOLDS)
    assert "51 vs 186 MiB (5 repeats, 3 vs 2 requests at once)" in mem.points
    assert mem.estimate == pytest.approx(0.28, abs=0.02) and "noise [" in mem.points
    trend = frame.loc["speedup-grows-with-input-output-ratio"]
    assert (trend.status, trend.verdict, trend.estimate) == (DECIDED, HOLDS, pytest.approx(1.0))
    # three ratios: a rank correlation over 3 points takes 4 values; it is reported but cannot decide
    (tmp_path / "few").mkdir()
    monkeypatch.chdir(tmp_path / "few")
    few = _memory_and_sharegpt(tmp_path / "few", ratios=(0, 2, 100)).loc["speedup-grows-with-input-output-ratio"]
    assert (few.status, few.verdict) == (PROVISIONAL, UNCLEAR) and "(3 ratios, 5 repeats)" in few.points


def test_the_memory_limit_claim_decides_only_where_the_smallest_limit_binds(tmp_path, monkeypatch):
    """Registered amendment 2026-12-05: where AcrossKV ran no more requests at once than SwiftKV at the smallest limit,
    the limit did not bind and the throughput difference cannot speak for the mechanism: no verdict, and why."""
    from analysis.rules import UNCLEAR

    monkeypatch.chdir(tmp_path)
    mem = _memory_and_sharegpt(tmp_path, binds=False).loc["acrosskv-helps-under-memory-limits"]
    assert mem.verdict == UNCLEAR and "(5 repeats, 2 vs 2 requests at once)" in mem.points
    assert "does not bind" in mem.why and "at 51 MiB AcrossKV ran 2 and SwiftKV 2 requests at once" in mem.why


def test_memory_limit_and_sharegpt_effects_must_clear_their_noise_floor(tmp_path, monkeypatch):
    """The planted violation: the base model measured twice drifts with the limit and the ratio as much as the
    effect does; neither claim may hold on effects its own noise floor matches."""
    from analysis.rules import HOLDS

    monkeypatch.chdir(tmp_path)
    frame = _memory_and_sharegpt(tmp_path, drift=0.3)
    for cid in ("acrosskv-helps-under-memory-limits", "speedup-grows-with-input-output-ratio"):
        assert frame.loc[cid, "verdict"] != HOLDS, cid


def test_the_readme_serving_summary_is_generated_from_the_raw_folders(tmp_path, monkeypatch):
    from analysis.raw import serving_raw
    from analysis.serving import load_study, serving_markdown

    monkeypatch.chdir(tmp_path)
    _commit_raw(tmp_path, "throughput", _throughput_rows(5, 1.5), VARIANTS)
    rows = [{"variant": v, "request_rate": 0.5, "ttft_ms": [k * (100.0 + i) for i in range(50)],
             "tpot_ms": [20.0 * k] * 50} for v, k in (("base", 1), ("swiftkv-50", 0.5), ("base-again", 1))]
    _commit_raw(tmp_path, "latency", rows, VARIANTS)
    studies = {s: load_study(serving_raw(s)) for s in ("throughput", "latency", "kv-limit", "sharegpt")}
    assert studies["kv-limit"].empty  # no raw folder: no rows, no table line
    md = serving_markdown(studies)
    lines = md.splitlines()
    row = next(x for x in lines if x.startswith("| throughput | 1024 in / 64 out |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[3] == "5" and cells[4].startswith("1.5") and cells[5] == "–"  # no AcrossKV row in this run
    low, high = (float(x) for x in cells[6].strip("[]").split(","))
    assert 0.98 <= low < 1.0 < high <= 1.02  # base against itself
    rate = next(x for x in lines if x.startswith("| 0.5 req/s |"))
    cells = [c.strip() for c in rate.split("|")[1:-1]]
    assert cells[2] == "50" and cells[3].startswith("0.5") and cells[6] == "0.50 [0.50, 0.50]"
    assert "kv-limit" not in md and sum(x.startswith("| throughput |") for x in lines) == 3

