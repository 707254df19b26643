"""The extended-suite study (issue 34, item 2; analysis/claims.yaml extended_suite): the task average over benchmarks
(MMLU's subjects one benchmark), the task list that keeps the suite's choice, the study's tables from a raw folder,
the claims' second reading beside the first, and its rules in the DAG."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.seeds import SeedRun, benchmark_of, build_seeds_table, pool_benchmarks
from analysis.selection import extend_tasks
from analysis.stats import BootstrapSettings
from tests.test_analysis_eval import fake_result
from tests.test_workflow_eval import dry_run, job_counts

ROOT = Path(__file__).resolve().parents[1]
FAST = BootstrapSettings(resamples=500, seed=1)
MODEL = "smollm2-135m"  # the registry's points name the default profile's model


def test_mmlu_subjects_are_one_benchmark_and_the_average_is_over_benchmarks(tmp_path):
    tasks = [{"name": "bb_mmlu_a_report", "source": "mmlu/a", "metric": "acc,none"},
             {"name": "bb_mmlu_b_report", "source": "mmlu/b", "metric": "acc,none"},
             {"name": "bb_olmes_x_report", "source": "olmes/x", "metric": "acc,none"}]
    assert [benchmark_of(t) for t in tasks] == ["mmlu", "mmlu", "olmes/x"]
    pooled = pool_benchmarks([np.zeros((2, 10)), np.ones((2, 30)), np.ones((2, 5))], tasks)
    assert [m.shape for m in pooled] == [(2, 40), (2, 5)]
    # a small subject at 0 and a large one at 1: over tasks (0 + 1 + 1) / 3, over benchmarks (30/40 + 1) / 2
    correct = {"bb_mmlu_a_report": [0] * 10, "bb_mmlu_b_report": [1] * 30, "bb_olmes_x_report": [1] * 5}
    path = tmp_path / "base.json"
    path.write_text(json.dumps(fake_result(correct)))
    base = SeedRun(MODEL, "base", None, path)
    by_task = build_seeds_table([], base, tasks, {"default": "swiftkv-50"}, FAST)
    by_benchmark = build_seeds_table([base], base, tasks, {"default": "swiftkv-50"}, FAST, by_benchmark=True)
    assert by_benchmark[by_benchmark.seed == "all"].average.iloc[0] == pytest.approx(100 * (0.75 + 1) / 2)
    assert by_task.empty  # no runs, no rows: the base model's own average is not a row of the seeds table


def test_the_extended_task_list_keeps_the_suite_as_it_was_chosen():
    fixed = {"tasks": [{"name": "bb_mmlu_a_report", "metric": "acc_norm,none", "source": "mmlu/a", "n": 9,
                        "selected_by": "interval above chance"}]}
    chosen = {"rule": "r", "candidates": [{"source": "olmes/x"}],
              "tasks": [{"name": "bb_olmes_x_report", "metric": "acc,none", "source": "olmes/x", "n": 5,
                         "selected_by": "interval above chance"}]}
    out = extend_tasks(fixed, chosen, ["suite/report", "extended/report"])
    assert [t["name"] for t in out["tasks"]] == ["bb_mmlu_a_report", "bb_olmes_x_report"]
    assert out["tasks"][0]["metric"] == "acc_norm,none" and out["tasks"][0]["selected_by"].startswith("fixed")
    assert out["fixed"] == 1 and out["candidates"] == chosen["candidates"]
    with pytest.raises(ValueError, match="repeat tasks of the fixed suite: bb_mmlu_a_report"):
        extend_tasks(fixed, {**chosen, "tasks": fixed["tasks"]}, [])


def _raw_study(raw: Path, rng) -> list[dict]:
    """A raw folder of the study for MODEL: base, two trained rows at 5 seeds, an untrained row, FP8 of two rows."""
    n = {"mmlu/a": 120, "mmlu/b": 300, "olmes/x": 400}
    tasks = [{"name": f"bb_{s.replace('/', '_')}_report", "source": s, "metric": "acc,none", "n": k}
             for s, k in n.items()]
    base = {t["name"]: (rng.random(t["n"]) < 0.6).astype(int) for t in tasks}
    (raw / "extended" / MODEL).mkdir(parents=True)
    (raw / "extended" / MODEL / "tasks.json").write_text(json.dumps({"tasks": tasks, "fixed": 2}))
    runs = []

    def put(variant, seed, kv, flips, trained=True):
        res = {t: np.where(rng.random(len(v)) < flips, 0, v).tolist() for t, v in base.items()}  # answers lost
        rel = f"extended/{MODEL}/{variant}/seed-{seed}/{kv}/lm_eval.json"
        (raw / rel).parent.mkdir(parents=True)
        (raw / rel).write_text(json.dumps(fake_result(res)))
        runs.append({"variant": variant, "seed": seed, "kv_cache": kv, "trained": trained, "lm_eval": f"results/{rel}"})

    put("base", 0, "native", 0.0, trained=False)
    for seed in range(5):
        put("swiftkv-50", seed, "native", 0.01)
        put("swiftkv-62", seed, "native", 0.25)
    put("swiftkv-50-nodistill", 0, "native", 0.45, trained=False)
    put("base", 0, "fp8", 0.005, trained=False)
    put("swiftkv-50", 0, "fp8", 0.01)
    return [{"model": MODEL, "own_seed": 0, "fp8_variants": ["base", "swiftkv-50"], "runs": runs}]


def test_the_study_gives_each_judged_claim_a_second_verdict_beside_the_first(tmp_path):
    from analysis.claims import evaluate
    from analysis.extended import extended_judged
    from analysis.extended import FOLDER, extended_tables

    raw = tmp_path / "reports" / "raw" / "extended_suite"
    models = _raw_study(raw, np.random.default_rng(4))
    seeds, fp8, summary = extended_tables(raw, models, {"default": "swiftkv-50"}, FAST)
    pooled = seeds[seeds.seed == "all"].set_index("variant")
    assert pooled.loc["swiftkv-50", "n_seeds"] == 5 and pooled.loc["swiftkv-50-nodistill", "seeds"] == "untrained"
    assert list(fp8.variant) == ["base", "swiftkv-50"] and (fp8.delta_ref_row == fp8.variant + " (native KV)").all()
    suite = summary[summary.row == "suite"].iloc[0]
    assert (suite.tasks, suite.fixed_tasks, suite.benchmarks, suite.report_examples) == (3, 2, 2, 820)
    rows = summary[summary.row != "suite"].set_index("row")
    assert rows.loc["swiftkv-62", "mdd_base"] > 0 and rows.loc["swiftkv-62", "delta_base"] < -10

    reports = tmp_path / "reports"
    before = evaluate(reports)
    assert "extended_verdict" not in before  # no study, no columns: the committed page is unchanged
    (reports / FOLDER).mkdir()
    seeds.to_csv(reports / FOLDER / "seeds.csv", index=False)
    fp8.to_csv(reports / FOLDER / "tableB1.csv", index=False)
    after = evaluate(reports).set_index("id")
    assert (after.verdict == before.set_index("id").verdict).all()  # the first reading never changes
    judged = extended_judged()
    assert set(after.index[after.extended_verdict != ""]) == set(judged)
    assert after.loc["quality-loss-50", "extended_verdict"] == "holds"  # ~1% of answers lost, 5 seeds
    assert after.loc["quality-loss-50", "extended_status"] == "decided"
    assert after.loc["quality-cliff-beyond-50", "extended_verdict"] == "holds"  # 62.5% loses a quarter
    assert after.loc["distillation-needed", "extended_verdict"] == "holds"
    assert after.loc["quality-loss-25", "extended_status"] == "awaiting"  # no swiftkv-25 in this study
    assert after.loc["fp8-costs-little", "extended_status"] == "provisional"  # a registered FP8 row is missing
    assert "not measured" in after.loc["fp8-costs-little", "extended_points"]

    from analysis.disagreements import measures_text, suites_disagree
    row = next(r for r in after.reset_index().itertuples() if r.id == "quality-loss-50")
    assert suites_disagree(row)  # no first reading here (cannot tell), the extended one holds: both on the page
    assert "extended suite (MMLU + OLMES, over benchmarks): holds (decided) at" in measures_text(row)
    assert "the suites disagree: cannot tell on the power run's suite, holds on the extended one" in measures_text(row)
    awaiting = next(r for r in after.reset_index().itertuples() if r.id == "quality-loss-25")
    assert not suites_disagree(awaiting)


def _scored(lls: dict[str, list[list[float]]], metric: str = "acc_norm") -> dict:
    """An lm-eval result whose samples carry each choice's log-likelihood (gold: the first choice)."""
    samples = {task: [{"doc_id": i, "doc": {"id": f"d{i}"}, "filter": "none", metric: float(np.argmax(ll) == 0),
                       "filtered_resps": [[x, False] for x in ll]} for i, ll in enumerate(rows)]
               for task, rows in lls.items()}
    return {"results": {t: {} for t in samples}, "samples": samples}


def test_the_mmlu_part_is_checked_against_the_power_runs_evaluations(tmp_path):
    from analysis.extended import mmlu_agreement

    rng = np.random.default_rng(7)
    mmlu = rng.normal(size=(30, 4)).tolist()
    olmes = rng.normal(size=(20, 2)).tolist()
    raw, reports = tmp_path / "raw" / "extended_suite", tmp_path / "raw"
    tasks = [{"name": "bb_mmlu_a_report", "source": "mmlu/a", "metric": "acc_norm,none", "n": 30},
             {"name": "bb_olmes_x_report", "source": "olmes/x", "metric": "acc,none", "n": 20}]
    (raw / "extended" / MODEL).mkdir(parents=True)
    (raw / "extended" / MODEL / "tasks.json").write_text(json.dumps({"tasks": tasks, "fixed": 1}))

    def put(path: Path, result: dict):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))

    runs = []
    for variant, seed in (("base", 0), ("swiftkv-50", 1)):
        rel = f"extended/{MODEL}/{variant}/seed-{seed}/native/lm_eval.json"
        put(raw / rel, _scored({"bb_mmlu_a_report": mmlu, "bb_olmes_x_report": olmes}))
        runs.append({"variant": variant, "seed": seed, "kv_cache": "native", "lm_eval": f"results/{rel}"})
    # the power run: the base model in Table 2's folder (the profile's seed), the seed-1 student in the seeds study's,
    # where one question's gold choice moved by 3 nats (its score flips), another by 1e-6, and one question is absent
    put(reports / "table2" / "eval" / MODEL / "base" / "native" / "lm_eval.json", _scored({"bb_mmlu_a_report": mmlu}))
    changed = [list(ll) for ll in mmlu]
    first = int(np.argmax(np.argmax(mmlu, axis=1) == 0))  # a question the student answers right
    assert np.argmax(mmlu[first]) == 0 and first < 28
    changed[first][0] -= 3.0 + max(changed[first]) - min(changed[first])
    changed[first + 1][2] += 1e-6
    student = _scored({"bb_mmlu_a_report": changed})
    student["samples"]["bb_mmlu_a_report"].pop()
    put(reports / "seeds" / MODEL / "swiftkv-50" / "seed-1" / "native" / "lm_eval.json", student)
    models = [{"model": MODEL, "own_seed": 0, "fp8_variants": [], "runs": runs}]
    folders = [reports / name for name in ("seeds", "table2")]

    out = mmlu_agreement(raw, folders, models).set_index("variant")
    assert out.loc["base", "power_run"] == f"table2/eval/{MODEL}/base/native/lm_eval.json"
    assert out.loc["swiftkv-50", "power_run"] == f"seeds/{MODEL}/swiftkv-50/seed-1/native/lm_eval.json"
    assert (out.tasks == 1).all()  # the OLMES task is the study's own: nothing to compare it with
    assert out.loc["base", ["questions", "only_one", "score_differs", "largest_ll_difference"]].tolist() == [30, 0, 0, 0]
    assert out.loc["swiftkv-50", ["questions", "only_one", "score_differs"]].tolist() == [29, 1, 1]
    assert out.loc["swiftkv-50", "largest_ll_difference"] == pytest.approx(mmlu[first][0] - changed[first][0])
    runs.append({"variant": "swiftkv-62", "seed": 2, "kv_cache": "native", "lm_eval": runs[0]["lm_eval"]})
    with pytest.raises(ValueError, match=f"results/seeds/{MODEL}/swiftkv-62/seed-2/native/lm_eval.json"):
        mmlu_agreement(raw, folders, models)


def test_the_extended_rules_in_the_dag():
    out = dry_run(["results/reports/extended_suite.csv"], "config/config.yaml", flags=("-p",))
    assert out.returncode == 0, out.stderr
    counts = job_counts(out.stdout)
    # 8 trained rows x 5 seeds, 2 untrained rows, 4 FP8 rows; the base model's native and FP8 ones record boundary
    # states (the FP8 ones for the three FP8 students)
    assert counts["eval_extended"] + counts["eval_extended_base"] == 46 and counts["eval_extended_base"] == 2
    assert counts["eval_extended_selection"] == counts["select_extended_tasks"] == counts["make_extended"] == 1
    assert counts["raw_seeds"] == 1 and counts["raw_table"] == 5  # the power run's folders: the MMLU part's check
    cmds = [line for line in out.stdout.splitlines() if "swiftkv eval results/seeds/" in line and "seed-3" in line
            and "--tasks-json results/extended/" in line]
    assert cmds and "--include-path results/tasks/bigbench/report --include-path results/tasks/bigbench-extended/report" \
        in cmds[0]
    build = next(line for line in out.stdout.splitlines() if "swiftkv bigbench build" in line
                 and "bigbench-extended" in line)
    assert "--selection-examples 1000 --report-examples 1000" in build and "mmlu/" not in build
    choice = dry_run(["results/reports/raw/extended_selection"], "config/config.yaml")
    assert choice.returncode == 0, choice.stderr
    assert "eval_extended" not in job_counts(choice.stdout)  # the choice is collected before any student is scored
    from analysis.raw import RUN, STUDIES

    # the study's raw folders are among those the layout check accepts (analysis.raw_summary.layout_problems)
    assert job_counts(choice.stdout)["raw_extended_selection"] == counts["raw_extended"] == 1
    assert all(f"output: {RUN}/raw/{s}" in out.stdout + choice.stdout for s in ("extended_selection", "extended_suite"))
    assert {"extended_selection", "extended_suite"} <= set(STUDIES)
    default = dry_run(["results/reports/claims.csv"], "config/config.yaml")
    assert default.returncode == 0 and job_counts(default.stdout)["make_extended"] == 1  # the claims' second reading


def test_the_readme_section_states_the_suite_every_row_and_the_mmlu_agreement():
    from analysis.extended import extended_markdown

    summary = pd.DataFrame([
        {"model": MODEL, "row": "suite", "tasks": 3, "fixed_tasks": 2, "benchmarks": 2, "report_examples": 1234,
         "benchmark_list": "mmlu olmes/piqa", "seeds": None},
        {"model": MODEL, "row": "base", "seeds": "untrained", "average": 40.0, "average_lo": 39.0, "average_hi": 41.0},
        {"model": MODEL, "row": "swiftkv-50", "seeds": "0 1 2", "average": 38.0, "average_lo": 37.0,
         "average_hi": 39.0, "delta_base": -2.0, "delta_base_lo": -2.5, "delta_base_hi": -1.5, "mdd_base": 1.25}])
    agreement = pd.DataFrame([
        {"kv_cache": "native", "questions": 10, "only_one": 0, "score_differs": 0, "largest_ll_difference": 1e-5},
        {"kv_cache": "native", "questions": 10, "only_one": 1, "score_differs": 0, "largest_ll_difference": 2e-5},
        {"kv_cache": "fp8", "questions": 10, "only_one": 0, "score_differs": 2, "largest_ll_difference": 0.3}])
    text = extended_markdown(summary, agreement, {"swiftkv-50": "SwiftKV 50%"})
    assert "3 tasks (2 of the power run's suite, 1 added by the suite rule) in 2 benchmarks (mmlu, olmes/piqa)" in text
    assert "1,234 report examples" in text
    assert "| Base (teacher) |" not in text and "| base | untrained | 40.0 [39.0, 41.0] |  |  |" in text
    assert "| SwiftKV 50% | 3 | 38.0 [37.0, 39.0] | −2.0 [−2.5, −1.5] | 1.2 |" in text
    assert ("native KV cache, 2 row-seeds: 20 question scores compared, 1 in one run only, 0 scored differently, "
            "largest log-likelihood difference 2e-05; fp8 KV cache, 1 row-seeds: 10 question scores compared, 0 in one "
            "run only, 2 scored differently, largest log-likelihood difference 0.3.") in text
