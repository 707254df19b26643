"""Bootstrap intervals on data with known answers; task selection and the tables on small fixture results."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis.selection import select_tasks
from analysis.stats import BootstrapSettings, macro_mean_ci, mean_ci, paired_difference_ci, ratio_ci
from analysis.accuracy import Row, build_table, task_label, to_markdown

FAST = BootstrapSettings(resamples=2000, seed=1)


def test_mean_ci_matches_the_binomial_interval():
    rng = np.random.default_rng(0)
    x = (rng.random(4000) < 0.3).astype(float)
    ci = mean_ci(x, FAST)
    half = 1.96 * np.sqrt(x.mean() * (1 - x.mean()) / len(x))
    assert ci.value == pytest.approx(x.mean())
    assert ci.low == pytest.approx(x.mean() - half, abs=0.15 * half)
    assert ci.high == pytest.approx(x.mean() + half, abs=0.15 * half)
    assert ci.excludes(0.25) and not ci.excludes(0.3)


def test_macro_mean_is_stratified():
    """Mean of two task means; its standard error is half the root of the summed squared task errors."""
    rng = np.random.default_rng(1)
    a = (rng.random(3000) < 0.8).astype(float)
    b = (rng.random(500) < 0.4).astype(float)
    ci = macro_mean_ci([a, b], FAST)
    assert ci.value == pytest.approx((a.mean() + b.mean()) / 2)  # not the pooled mean
    se = 0.5 * np.sqrt(a.var() / len(a) + b.var() / len(b))
    assert ci.high - ci.low == pytest.approx(2 * 1.96 * se, rel=0.15)


def test_paired_difference():
    rng = np.random.default_rng(2)
    base = (rng.random(1000) < 0.5).astype(float)
    flip = rng.random(1000) < 0.1  # 10% of answers change, half each way: no real difference
    other = np.where(flip, 1 - base, base)
    ci = paired_difference_ci([other], [base], FAST)
    assert not ci.excludes(0)
    better = np.maximum(base, (rng.random(1000) < 0.2).astype(float))  # only ever gains
    assert paired_difference_ci([better], [base], FAST).low > 0
    with pytest.raises(ValueError):
        paired_difference_ci([base[:10]], [base[:11]], FAST)


def test_constant_data_gives_a_point_interval():
    ci = mean_ci(np.ones(50), FAST)
    assert (ci.value, ci.low, ci.high) == (1.0, 1.0, 1.0)
    ci = ratio_ci(np.full(20, 3.0), np.full(20, 2.0), FAST)
    assert ci.value == pytest.approx(1.5) and ci.low == pytest.approx(1.5) and ci.high == pytest.approx(1.5)


# -- fixture results ----------------------------------------------------------------------------------------------


def fake_result(task_correct: dict[str, list[int]], chance: float = 0.25, ppl=None, kv=0.0) -> dict:
    samples = {}
    for task, correct in task_correct.items():
        samples[task] = [{"doc_id": i, "doc": {"id": f"d{i}", "chance": chance}, "filter": "none",
                          "acc": float(c), "acc_norm": float(c)} for i, c in enumerate(correct)]
    if ppl is not None:
        samples["sharegpt_heldout_ppl"] = [
            {"doc_id": i, "doc": {"id": f"c{i}"}, "filter": "none", "word_perplexity": [ll, 10],
             "byte_perplexity": [ll, 50], "bits_per_byte": [ll, 50]} for i, ll in enumerate(ppl)]
    return {"results": {t: {} for t in samples}, "samples": samples,
            "swiftkv": {"kv_memory": {"reduction": kv, "reduction_with_scales": kv}}}


def test_selection_keeps_tasks_above_chance_only():
    rng = np.random.default_rng(3)
    result = fake_result({"bb_easy_selection": (rng.random(200) < 0.7).astype(int).tolist(),
                          "bb_chance_selection": (rng.random(200) < 0.25).astype(int).tolist()})
    manifest = {"tasks": {
        name: {"splits": {"selection": {"task": f"bb_{name}_selection", "n": 200, "chance": 0.25},
                          "report": {"task": f"bb_{name}_report", "n": 150, "chance": 0.25}}}
        for name in ("easy", "chance")}}
    out = select_tasks(result, manifest, settings=FAST)
    assert [t["name"] for t in out["tasks"]] == ["bb_easy_report"]
    assert {c["source"] for c in out["candidates"]} == {"easy", "chance"}
    assert out["tasks"][0]["selected_by"] == "interval above chance"
    filled = select_tasks(result, manifest, min_tasks=2, settings=FAST)["tasks"]
    assert [t["selected_by"].startswith("min_tasks") for t in filled] == [True, False]  # sorted by name: chance, easy


def test_a_committed_selection_run_must_have_scored_this_builds_selection_half(tmp_path):
    """analysis.selection.check_same_questions: the same question ids task by task, or one line saying what differs."""
    from analysis.selection import check_same_questions

    result = fake_result({"bb_easy_selection": [1, 0, 1], "bb_hard_selection": [0, 0]})
    manifest = {"tasks": {name: {"slug": f"bb_{name}", "splits": {"selection": {"task": f"bb_{name}_selection"}}}
                          for name in ("easy", "hard")}}
    for name, ids in (("easy", ["d0", "d1", "d2"]), ("hard", ["d0", "d1"])):
        (tmp_path / f"bb_{name}.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    check_same_questions(result, manifest, tmp_path)
    (tmp_path / "bb_hard.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in ("d0", "d7")))
    with pytest.raises(ValueError, match="scored 2 questions of hard and this build's selection half has 2 "
                                         r"\(1 in both\): it was run on other questions"):
        check_same_questions(result, manifest, tmp_path)
    del manifest["tasks"]["hard"]
    with pytest.raises(ValueError, match="scored tasks this build does not have: bb_hard_selection"):
        check_same_questions(result, manifest, tmp_path)


def test_tables_from_fixture_results(tmp_path):
    rng = np.random.default_rng(4)
    n = 300
    base_a = (rng.random(n) < 0.7).astype(int)
    base_b = (rng.random(n) < 0.5).astype(int)
    worse_a = np.where(rng.random(n) < 0.3, 0, base_a)  # loses ~20 points on task a
    results = {
        "base": fake_result({"bb_a_report": base_a.tolist(), "bb_b_report": base_b.tolist()}, ppl=[-30.0] * 20),
        "swiftkv-50": fake_result({"bb_a_report": worse_a.tolist(), "bb_b_report": base_b.tolist()},
                                  ppl=[-33.0] * 20, kv=0.0),
    }
    rows = []
    for variant, res in results.items():
        path = tmp_path / f"{variant}.json"
        path.write_text(json.dumps(res))
        fid = None
        if variant != "base":
            fid = tmp_path / f"{variant}-fid.json"
            fid.write_text(json.dumps({"teacher_forced": [{"tokens": 10, "kl_sum": 1.0, "top1_agree": 9}] * 5,
                                       "greedy_rows": [{"agreement": 0.5}] * 5}))
        rows.append(Row("tiny", variant, "native", {"label": variant, "loss": "kl", "scope": "partial",
                                                     "key_value_group_size": "1"}, path, fid))
    tasks = {"tiny": [{"name": "bb_a_report", "metric": "acc,none"}, {"name": "bb_b_report", "metric": "acc,none"}]}
    df = build_table("table2", rows, tasks, FAST)
    base, student = df.iloc[0], df.iloc[1]
    assert base["average"] == pytest.approx(100 * (base_a.mean() + base_b.mean()) / 2)
    assert student["delta_base"] == pytest.approx(100 * (worse_a.mean() - base_a.mean()) / 2)
    assert student["delta_base_sig"] and student["a_delta_base_sig"] and not student["b_delta_base_sig"]
    # bits per byte: -log-likelihood (nats) over bytes, in bits; 20 documents of 50 bytes each
    assert base["bpb"] == pytest.approx(30 / 50 / np.log(2)) and student["bpb"] == pytest.approx(33 / 50 / np.log(2))
    assert student["bpb_delta_base"] == pytest.approx(3 / 50 / np.log(2)) and student["bpb_delta_base_sig"]
    assert student["bpb_documents"] == 20
    # the minimum detectable difference (80% power) is 1.43x the 95% interval's half-width
    half = (student["delta_base_hi"] - student["delta_base_lo"]) / 2
    assert student["delta_base_mdd"] == pytest.approx(half * (1.959964 + 0.841621) / 1.959964)
    assert "delta_base_mdd" not in base or np.isnan(base["delta_base_mdd"])
    assert student["kl"] == pytest.approx(0.1) and student["top1"] == pytest.approx(90.0)
    assert student["paper_average"] == pytest.approx(72.70)  # the paper's Llama-3.1-8B 50% row
    md = to_markdown(df, [task_label(t["name"]) for t in tasks["tiny"]], "Table 2")
    assert "| tiny: swiftkv-50 |" in md and " *" in md
    assert f"with 600 examples per row: {student['delta_base_mdd']:.1f} points." in md and "ShareGPT bits/byte" in md
