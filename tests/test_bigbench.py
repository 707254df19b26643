"""BIG-bench -> lm-eval conversion on a fixture task (no download): cloze prompts, gold sets, disjoint stable splits,
task YAMLs lm-eval loads, and reading task.json straight from an sdist-shaped tarball."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml

from swiftkv.data.bigbench import (
    TASKS_PREFIX,
    ClozeFormat,
    extract_tasks,
    multiple_choice_docs,
    read_task_jsons,
    split_docs,
    split_of_example,
    write_lm_eval_tasks,
)
from swiftkv.errors import SwiftKVError

FIXTURE = {
    "name": "fixture_capitals",
    "task_prefix": "Name the capital.\n\n",
    "examples": [
        {"input": f"What is the capital of country {i}? ", "target_scores": {f"City {i}": 1, f"Town {i}": 0, "Nowhere": 0}}
        for i in range(40)
    ] + [
        {"input": "Pick both.", "target_scores": {"a": 1, "b": 1, "c": 0, "d": 0}},  # two correct choices
        {"input": "No answer.", "target_scores": {"a": 0, "b": 0}},  # nothing correct: dropped
        {"input": "Generative only.", "target": "x"},  # not multiple choice: dropped
        {"input": "What is the capital of country 0? ", "target_scores": {"City 0": 1, "Town 0": 0, "Nowhere": 0}},  # dup
    ],
}
CUSTOM = {"name": "custom", "example_input_prefix": "\nHuman: ", "example_output_prefix": "\nAssistant:",
          "examples": [{"input": "Hi", "target_scores": {"Hello": 1, "Go away": 0}}]}
NEWLINE = {"name": "nl", "example_input_prefix": "\n\nFind a movie similar to ", "example_output_prefix": "\n",
           "examples": [{"input": "Up, Cars:", "target_scores": {"Toy Story": 1, "Heat": 0}}]}


def test_cloze_prompt_and_gold():
    docs = multiple_choice_docs("fixture_capitals", FIXTURE)
    assert len(docs) == 41  # 40 + the two-correct example; no-answer, generative and duplicate dropped
    first = docs[0]
    assert first["query"] == "Name the capital.\n\nQ: What is the capital of country 0?\nA:"
    assert first["choices"] == ["City 0", "Town 0", "Nowhere"] and first["gold"] == [0]
    assert first["chance"] == pytest.approx(1 / 3)
    both = next(d for d in docs if d["query"].endswith("Pick both.\nA:"))
    assert both["gold"] == [0, 1] and both["chance"] == 0.5
    assert "City 0" not in first["query"]  # choices are never listed in the prompt


def test_task_prefixes_are_kept():
    fmt = ClozeFormat.of(CUSTOM)
    assert fmt.prompt("Hi") == "Human: Hi\nAssistant:" and fmt.target_delimiter == " "
    fmt = ClozeFormat.of(NEWLINE)
    assert fmt.prompt("Up, Cars:") == "Find a movie similar to Up, Cars:\n" and fmt.target_delimiter == ""


def test_splits_are_disjoint_stable_and_balanced():
    docs = multiple_choice_docs("fixture_capitals", FIXTURE)
    sel, rep = split_docs(docs, "selection"), split_docs(docs, "report")
    assert {d["id"] for d in sel}.isdisjoint({d["id"] for d in rep})
    assert len(sel) + len(rep) == len(docs) and 10 <= len(sel) <= 31
    assert all(split_of_example(d["id"]) == "selection" for d in sel)
    # the split of an example does not depend on which other examples exist or their order
    again = multiple_choice_docs("fixture_capitals", {**FIXTURE, "examples": FIXTURE["examples"][::-1][:20]})
    assert {d["id"] for d in split_docs(again, "report")} <= {d["id"] for d in rep}
    assert split_docs(docs, "report", 5) == rep[:5]


def test_written_tasks_load_in_lm_eval(tmp_path):
    from lm_eval.tasks import TaskManager

    manifest = write_lm_eval_tasks({"fixture_capitals": FIXTURE, "custom": CUSTOM}, tmp_path, {"report": 8})
    entry = manifest["tasks"]["fixture_capitals"]
    assert entry["splits"]["report"]["n"] == 8 and entry["splits"]["report"]["task"] == "bb_fixture_capitals_report"
    config = yaml.safe_load((tmp_path / "report" / "bb_fixture_capitals.yaml").read_text())
    assert config["output_type"] == "multiple_choice" and config["doc_to_target"] == "gold"
    lines = (tmp_path / "report" / "bb_fixture_capitals.jsonl").read_text().splitlines()
    assert len(lines) == 8 and all(split_of_example(json.loads(x)["id"]) == "report" for x in lines)
    manager = TaskManager(include_path=[manifest["splits"]["report"]], include_defaults=False)
    task = manager.load(["bb_fixture_capitals_report"])["tasks"]["bb_fixture_capitals_report"]
    doc = next(iter(task.eval_docs))
    assert task.doc_to_choice(doc) == doc["choices"] and task.doc_to_target(doc) == doc["gold"]


def test_tasks_built_in_one_checkout_load_from_a_copy_and_a_moved_folder_is_one_clear_line(tmp_path, monkeypatch):
    """Task YAMLs name their data relative to the folder the workflow runs from (the repository root), so results/
    copied to another checkout still evaluates there; run from elsewhere, the missing data is named before lm-eval
    starts, with where the file is now."""
    import shutil

    from lm_eval.tasks import TaskManager

    from swiftkv.data.heldout import write_perplexity_task
    from swiftkv.data.task_files import missing_data_files
    from swiftkv.measure.evaluate import TaskSpec, run_suite

    first, second = tmp_path / "checkout-a", tmp_path / "checkout-b"
    first.mkdir()
    monkeypatch.chdir(first)
    write_lm_eval_tasks({"fixture_capitals": FIXTURE}, Path("results/tasks"), {"report": 8})
    write_perplexity_task([{"id": "c1", "text": "a held-out conversation", "tokens": 4}], Path("results/tasks/ppl"))
    config = yaml.safe_load((first / "results/tasks/report/bb_fixture_capitals.yaml").read_text())
    assert config["dataset_kwargs"]["data_files"]["test"] == "results/tasks/report/bb_fixture_capitals.jsonl"
    shutil.copytree(first / "results", second / "results")
    shutil.rmtree(first / "results")
    monkeypatch.chdir(second)
    assert missing_data_files(["results/tasks/report", "results/tasks/ppl"]) == []
    task = TaskManager(include_path=["results/tasks/report"], include_defaults=False).load(
        ["bb_fixture_capitals_report"])["tasks"]["bb_fixture_capitals_report"]
    assert len(list(task.eval_docs)) == 8
    monkeypatch.chdir(tmp_path)  # not where the tasks were built: the data is not found from here
    folder = second / "results/tasks/report"
    assert len(missing_data_files([second / "results/tasks/ppl"])) == 1
    [line] = missing_data_files([folder])
    assert "data file results/tasks/report/bb_fixture_capitals.jsonl is missing" in line
    assert f"beside the YAML, at {folder / 'bb_fixture_capitals.jsonl'}" in line
    with pytest.raises(SwiftKVError, match="is missing .*build them again here"):
        run_suite(None, [TaskSpec("bb_fixture_capitals_report")], [folder])


def _sdist(tmp_path, tasks: dict[str, dict]):
    path = tmp_path / "bigbench-1.0.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, task in {"unused": {"examples": []}, **tasks}.items():
            data = json.dumps(task).encode()
            info = tarfile.TarInfo(f"{TASKS_PREFIX}{name}/task.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_read_and_extract_from_tarball(tmp_path):
    tarball = _sdist(tmp_path, {"fixture_capitals": FIXTURE, "group/sub": CUSTOM})
    found = read_task_jsons(tarball, ["fixture_capitals", "group/sub"])
    assert found["group/sub"] == CUSTOM
    paths = extract_tasks(tarball, ["group/sub"], tmp_path / "cache")
    assert [p.relative_to(tmp_path / "cache").as_posix() for p in paths] == ["group/sub/task.json"]
    assert not (tmp_path / "cache" / "unused").exists()  # only what is used
    with pytest.raises(SwiftKVError, match="no task.json for nope"):
        read_task_jsons(tarball, ["nope"])


# -- the generated stand-in (the CI profile's tasks) and fetching a copy of the sdist ------------------------------


def test_generated_tasks_are_right_and_the_same_on_every_call(tmp_path):
    import re

    from swiftkv.data.generated_tasks import generate_task, task_names, write_generated_tasks

    ops = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}
    for name in task_names():
        task = generate_task(name)
        assert task == generate_task(name)  # seeded by the name: nothing left to chance
        docs = multiple_choice_docs(name, task)
        assert len(docs) == len(task["examples"]) >= 100  # every example multiple choice, none a duplicate
        for doc, ex in zip(docs, task["examples"]):
            assert len(doc["gold"]) == 1 and all(c.isdigit() for c in doc["choices"])
            answer = int(doc["choices"][doc["gold"][0]])
            numbers = [int(x) for x in re.findall(r"\d+", ex["input"])]
            op = next((o for o in ops if f" {o} " in ex["input"]), None)
            if op:
                truth = ops[op](*numbers)
            elif "after" in ex["input"]:
                truth = numbers[0] + 1
            elif "before" in ex["input"]:
                truth = numbers[0] - 1
            else:
                truth = max(numbers)
            assert answer == truth, ex
        assert {len(d["choices"]) for d in docs} == {{"generated/larger": 2, "generated/successor": 4, "generated/predecessor": 4}.get(name, 5)}
        assert split_docs(docs, "selection") and split_docs(docs, "report")
    paths = write_generated_tasks(task_names(), tmp_path / "tasks")
    assert [p.relative_to(tmp_path / "tasks").as_posix() for p in paths] == [f"{n}/task.json" for n in task_names()]
    assert json.loads(paths[0].read_text()) == generate_task(task_names()[0])
    manifest = write_lm_eval_tasks({n: generate_task(n) for n in task_names()}, tmp_path / "lm", {"report": 4})
    entry = manifest["tasks"]["generated/addition"]
    assert entry["generated"] is True and entry["splits"]["report"]["n"] == 4
    assert abs(entry["splits"]["report"]["chance"] - 0.2) < 1e-9
    config = yaml.safe_load((tmp_path / "lm" / "report" / "bb_generated_addition.yaml").read_text())
    assert config["metadata"]["source"] == "generated by swiftkv"
    # a BIG-bench task keeps its manifest entry and its source as before
    plain = write_lm_eval_tasks({"fixture_capitals": FIXTURE}, tmp_path / "bb")["tasks"]["fixture_capitals"]
    assert "generated" not in plain
    assert yaml.safe_load((tmp_path / "bb" / "report" / "bb_fixture_capitals.yaml").read_text())["metadata"][
        "source"] == "BIG-bench 1.0.0 sdist"


def test_an_unknown_generated_task_writes_nothing(tmp_path):
    from swiftkv.data.generated_tasks import write_generated_tasks

    with pytest.raises(SwiftKVError, match="'generated/nope' is not a generated task; the generated tasks are"):
        write_generated_tasks(["generated/addition", "generated/nope"], tmp_path / "tasks")
    assert not (tmp_path / "tasks").exists()


def test_fetch_copies_a_verified_copy_and_says_what_to_do_when_pypi_has_none(tmp_path, monkeypatch):
    import hashlib
    import subprocess

    from swiftkv.data import bigbench

    copy = tmp_path / "copy.tar.gz"
    copy.write_bytes(b"a stand-in for the sdist")
    with pytest.raises(SwiftKVError, match=r"--from .*copy.tar.gz is not bigbench-1.0.0.tar.gz: its sha256 is"):
        bigbench.fetch_sdist(tmp_path / "dest", copy)
    assert not (tmp_path / "dest").exists() and copy.is_file()  # nothing written, the user's file kept
    with pytest.raises(SwiftKVError, match="no such file"):
        bigbench.fetch_sdist(tmp_path / "dest", tmp_path / "absent.tar.gz")
    monkeypatch.setattr(bigbench, "SDIST_SHA256", hashlib.sha256(copy.read_bytes()).hexdigest())
    path = bigbench.fetch_sdist(tmp_path / "dest", copy)
    assert path == tmp_path / "dest" / bigbench.SDIST and path.read_bytes() == copy.read_bytes()
    assert bigbench.fetch_sdist(tmp_path / "dest") == path  # a verified file is kept: no download
    # pip finds nothing (PyPI stopped serving 1.0.0): one error naming both ways out, nothing left behind
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(
        cmd, 1, "", "ERROR: No matching distribution found for bigbench==1.0.0\n"))
    with pytest.raises(SwiftKVError) as err:
        bigbench.fetch_sdist(tmp_path / "empty")
    assert calls and "pip" in calls[0] and "download" in calls[0]
    message = str(err.value)
    assert "No matching distribution found" in message and "swiftkv bigbench fetch --from PATH" in message
    assert "eval.bigbench.source: generated" in message and "\n" not in message
    assert list((tmp_path / "empty").iterdir()) == []
