"""BIG-bench -> lm-eval conversion on a fixture task (no download): cloze prompts, gold sets, disjoint stable splits,
task YAMLs lm-eval loads, and reading task.json straight from an sdist-shaped tarball."""

from __future__ import annotations

import io
import json
import tarfile

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
