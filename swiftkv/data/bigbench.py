"""BIG-bench multiple-choice tasks as offline lm-eval tasks (the default profile's benchmark suite).

BIG-bench 1.0.0 ships every task as ``bigbench/benchmark_tasks/<task>[/<subtask>]/task.json`` inside its source
distribution on PyPI. We fetch that sdist once (``pip download``, sha256-verified), read only the ``task.json``
files we use straight from the tarball (never installing the package: its dependencies are heavy), and write
each task as JSONL + an lm-eval task YAML.

Prompt format (cloze): the task's own prefix, the example's input after the task's input prefix (default
``Q: ``), then the task's output prefix (default ``A:``); each choice is scored as the continuation. The choices
are *not* listed in the prompt: a 135M model is at chance on most tasks when they are, and well above chance on
several in this format.

Every example gets a stable id (a hash of task, input and choices) and lands in one of two halves by that hash:
``selection`` (used only to decide which tasks the base model is above chance on) and ``report`` (the numbers in
the tables), so that choosing tasks does not bias the reported scores.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from swiftkv.data.task_files import data_file_path
from swiftkv.errors import SwiftKVError
from swiftkv.io import atomic_path, write_text

logger = logging.getLogger(__name__)

SDIST = "bigbench-1.0.0.tar.gz"
SDIST_SPEC = "bigbench==1.0.0"
SDIST_SHA256 = "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2"
TASKS_PREFIX = "bigbench-1.0.0/bigbench/benchmark_tasks/"
SPLITS = ("selection", "report")


def tasks_dir(names: list[str], root: str | Path = "resources/bigbench") -> str:
    """Where the tasks ``names`` are extracted: keyed by the list (order and repeats aside), so that profiles sharing
    ``resources/`` (default, CI, a CI scratch clone's link) never read a folder extracted for another list."""
    key = hashlib.sha256("\n".join(sorted(set(names))).encode()).hexdigest()[:12]
    return f"{Path(root).as_posix()}/tasks-{key}"


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist(dest: str | Path, source: str | Path | None = None) -> Path:
    """Put the BIG-bench 1.0.0 sdist into ``dest``: copied from ``source`` (a copy of the file) if given, else
    downloaded with pip (no install, no dependencies); verified by sha256 either way. An existing verified file
    is kept."""
    dest = Path(dest)
    path = dest / SDIST
    if source is not None:
        source = Path(source)
        if not source.is_file():
            raise SwiftKVError(f"--from {source}: no such file; give the path of a copy of {SDIST}")
        got = sha256_of(source)
        if got != SDIST_SHA256:
            raise SwiftKVError(f"--from {source} is not {SDIST}: its sha256 is {got}, expected {SDIST_SHA256}")
        if not path.is_file():
            dest.mkdir(parents=True, exist_ok=True)
            with atomic_path(path) as tmp:
                shutil.copyfile(source, tmp)
    elif not path.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
               SDIST_SPEC, "-d", str(dest)]
        logger.info("downloading %s (358 MB): %s", SDIST_SPEC, " ".join(cmd))
        done = subprocess.run(cmd, capture_output=True, text=True)
        if not path.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SwiftKVError(
                f"pip could not download {SDIST_SPEC} ({tail[0].removeprefix('ERROR: ')}); PyPI may no longer serve "
                f"it: copy {SDIST} (sha256 {SDIST_SHA256[:16]}...) from a machine that has it with "
                f"`swiftkv bigbench fetch --from PATH --dest {dest}`, or evaluate on the generated tasks "
                "(eval.bigbench.source: generated, as config/ci.yaml does)")
    verify_sdist(path)
    return path


def verify_sdist(path: str | Path) -> None:
    got = sha256_of(path)
    if got != SDIST_SHA256:
        raise SwiftKVError(f"{path} has sha256 {got}, expected {SDIST_SHA256}; delete it and fetch again")


def read_task_jsons(tarball: str | Path, names: list[str]) -> dict[str, dict]:
    """Parse ``task.json`` of each task name (``task`` or ``task/subtask``) from the sdist, in one pass."""
    wanted = {f"{TASKS_PREFIX}{name}/task.json": name for name in names}
    found: dict[str, dict] = {}
    with tarfile.open(tarball, "r:*") as tar:
        for member in tar:
            name = wanted.get(member.name)
            if name is not None and member.isfile():
                found[name] = json.load(tar.extractfile(member))
                if len(found) == len(wanted):
                    break
    missing = sorted(set(names) - set(found))
    if missing:
        raise SwiftKVError(f"BIG-bench has no task.json for {', '.join(missing)}; check the task names in the config")
    return found


def extract_tasks(tarball: str | Path, names: list[str], out_dir: str | Path) -> list[Path]:
    """Cache ``out_dir/<name>/task.json`` for each task (only those), reading the tarball once."""
    out_dir = Path(out_dir)
    paths = []
    for name, task in read_task_jsons(tarball, names).items():
        path = out_dir / name / "task.json"
        write_text(path, json.dumps(task, ensure_ascii=False))
        paths.append(path)
    return paths


# -- conversion -------------------------------------------------------------------------------------------------


@dataclass
class ClozeFormat:
    """How a task's examples become prompts: BIG-bench's own prefixes where the task sets them."""

    task_prefix: str = ""
    input_prefix: str = "Q: "
    output_prefix: str = "\nA:"

    @classmethod
    def of(cls, task: dict) -> "ClozeFormat":
        fmt = cls(task_prefix=task.get("task_prefix") or "")
        if task.get("example_input_prefix") is not None:
            fmt.input_prefix = task["example_input_prefix"]
        if task.get("example_output_prefix") is not None:
            fmt.output_prefix = task["example_output_prefix"]
        return fmt

    def prompt(self, text: str) -> str:
        head = (self.task_prefix + self.input_prefix).lstrip()
        return head + text.strip() + self.output_prefix.rstrip(" ")

    @property
    def target_delimiter(self) -> str:
        """A space before each choice unless the prompt ends in a line break."""
        return "" if self.output_prefix.rstrip(" ").endswith("\n") else " "


def task_slug(name: str) -> str:
    return "bb_" + name.replace("/", "_").replace("-", "_")


def example_id(name: str, text: str, choices: list[str]) -> str:
    key = json.dumps([name, text, sorted(choices)], ensure_ascii=False)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def split_of_example(doc_id: str) -> str:
    """``selection`` or ``report``: half of the examples each, by the example's hash (stable, order-free)."""
    return SPLITS[int(doc_id[:8], 16) % 2]


def multiple_choice_docs(name: str, task: dict) -> list[dict]:
    """The task's multiple-choice examples as lm-eval docs (dedupe by id; examples without a unique best choice
    set are kept with every top-scored choice counted correct, as BIG-bench's multiple_choice_grade does)."""
    fmt = ClozeFormat.of(task)
    docs, seen = [], set()
    for ex in task.get("examples", []):
        scores = ex.get("target_scores")
        if not isinstance(scores, dict) or len(scores) < 2:
            continue
        choices = [str(c).strip() for c in scores]
        values = [float(v) for v in scores.values()]
        best = max(values)
        if best <= 0 or len(set(choices)) != len(choices):
            continue
        doc_id = example_id(name, ex["input"], choices)
        if doc_id in seen:
            continue
        seen.add(doc_id)
        gold = [i for i, v in enumerate(values) if v == best]
        docs.append({
            "id": doc_id,
            "query": fmt.prompt(ex["input"]),
            "choices": choices,
            "gold": gold,
            "chance": len(gold) / len(choices),
        })
    return docs


def split_docs(docs: list[dict], split: str, limit: int | None = None) -> list[dict]:
    """The docs of one split in a fixed pseudo-random order (by id), at most ``limit`` of them."""
    chosen = sorted((d for d in docs if split_of_example(d["id"]) == split), key=lambda d: d["id"])
    return chosen[:limit] if limit else chosen


def task_source(task: dict) -> str:
    """Where a task.json came from: as the file says (``swiftkv_source``: MMLU, swiftkv.data.mmlu), swiftkv's
    generator (swiftkv.data.generated_tasks), or else BIG-bench's sdist."""
    if task.get("swiftkv_source"):
        return task["swiftkv_source"]
    return "generated by swiftkv" if task.get("generated_by") else "BIG-bench 1.0.0 sdist"


def task_yaml(task_name: str, data_file: Path, delimiter: str, source: str = "BIG-bench 1.0.0 sdist") -> dict:
    return {
        "task": task_name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": data_file_path(data_file)}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "{{query}}",
        "doc_to_choice": "choices",
        "doc_to_target": "gold",
        "target_delimiter": delimiter,
        "metric_list": [
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
        ],
        "metadata": {"version": 1.0, "source": source, "format": "cloze"},
    }


def write_split_task(out_dir: Path, split: str, slug: str, docs: list[dict], delimiter: str, source: str) -> dict:
    """Write one task's split as ``<out_dir>/<split>/<slug>.{jsonl,yaml}`` (lm-eval task ``<slug>_<split>``); return
    its manifest entry (task name, examples, mean chance)."""
    task_name = f"{slug}_{split}"
    data_file = out_dir / split / f"{slug}.jsonl"
    with atomic_path(data_file) as tmp:
        tmp.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
    write_text(out_dir / split / f"{slug}.yaml",
               yaml.safe_dump(task_yaml(task_name, data_file, delimiter, source), sort_keys=False))
    return {"task": task_name, "n": len(docs), "chance": sum(d["chance"] for d in docs) / max(1, len(docs))}


def write_lm_eval_tasks(
    task_jsons: dict[str, dict], out_dir: str | Path, limits: dict[str, int | None] | None = None
) -> dict:
    """Write ``<out_dir>/<split>/<slug>.{jsonl,yaml}`` for every task and split; return a manifest.

    ``limits`` caps the number of examples per split (``{"selection": n, "report": m}``; None = all).
    """
    out_dir = Path(out_dir)
    limits = limits or {}
    manifest = {"format": "cloze", "splits": {}, "tasks": {}}
    for name, task in sorted(task_jsons.items()):
        docs = multiple_choice_docs(name, task)
        if not docs:
            raise SwiftKVError(f"BIG-bench task {name} has no multiple-choice examples (target_scores); drop it")
        fmt = ClozeFormat.of(task)
        entry = {"slug": task_slug(name), "examples": len(docs), "splits": {}}
        if task.get("generated_by"):
            entry["generated"] = True
        for split in SPLITS:
            entry["splits"][split] = write_split_task(out_dir, split, task_slug(name),
                                                      split_docs(docs, split, limits.get(split)),
                                                      fmt.target_delimiter, task_source(task))
        manifest["tasks"][name] = entry
    for split in SPLITS:
        manifest["splits"][split] = str((out_dir / split).resolve())
    return manifest


def tasks_from_record(record: dict, out_dir: str | Path) -> dict:
    """Rebuild the BIG-bench tasks of a recorded lm-eval run (``lm_eval.json`` of ``swiftkv eval``: every example's
    doc is logged with its requests) as ``<out_dir>/<split>/<slug>.{jsonl,yaml}``, the layout and manifest that
    ``write_lm_eval_tasks`` writes, for the splits the record holds. Each rebuilt task must ask exactly the recorded
    requests (prompt, then delimiter + choice), or nothing is written. Other tasks in the record are skipped."""
    return write_record_tasks(record_tasks(record), out_dir)


def record_tasks(record: dict) -> dict[str, tuple[str, str, list[dict], str]]:
    """The BIG-bench tasks of a record, checked: task -> (split, delimiter, docs in id order, source)."""
    rebuilt: dict[str, tuple[str, str, list[dict], str]] = {}
    for task, samples in sorted(record.get("samples", {}).items()):
        if not task.startswith("bb_") or not task.endswith(tuple(f"_{s}" for s in SPLITS)) or not samples:
            continue
        split = task.rsplit("_", 1)[1]
        docs, delimiters = [], set()
        for sample in samples:
            doc = sample.get("doc") or {}
            if not {"id", "query", "choices", "gold", "chance"} <= set(doc):
                raise SwiftKVError(f"the record's task {task} logs no BIG-bench cloze docs; only tasks of `swiftkv "
                                   "bigbench build` can be rebuilt")
            args = sample.get("arguments") or []
            if len(args) != len(doc["choices"]):
                raise SwiftKVError(f"the record's task {task}, doc {sample.get('doc_id')}: {len(args)} requests for "
                                   f"{len(doc['choices'])} choices; not a cloze multiple-choice task")
            for (context, continuation), choice in zip(args, doc["choices"]):
                if context != doc["query"] or not continuation.endswith(choice):
                    raise SwiftKVError(f"the record's task {task}, doc {sample.get('doc_id')}: a request is not the "
                                       "doc's prompt and choice; it cannot be rebuilt from its docs")
                delimiters.add(continuation[: len(continuation) - len(choice)])
            docs.append(doc)
        if len(delimiters) != 1:
            raise SwiftKVError(f"the record's task {task} puts {sorted(delimiters)} between prompt and choice; "
                               "one delimiter per task is needed")
        source = ((record.get("configs", {}).get(task) or {}).get("metadata") or {}).get("source", "unknown")
        rebuilt[task] = (split, delimiters.pop(), sorted(docs, key=lambda d: d["id"]), source)
    if not rebuilt:
        raise SwiftKVError("the record holds no BIG-bench task (bb_<name>_selection or bb_<name>_report) with "
                           "logged samples; pass an lm_eval.json written by `swiftkv eval`")
    return rebuilt


def write_record_tasks(rebuilt: dict[str, tuple[str, str, list[dict], str]], out_dir: str | Path) -> dict:
    """Write ``record_tasks``' tasks as ``<out_dir>/<split>/<slug>.{jsonl,yaml}``; return their manifest."""
    out_dir = Path(out_dir)
    manifest = {"format": "cloze", "rebuilt_from_record": True, "splits": {}, "tasks": {}}
    for task, (split, delimiter, docs, source) in rebuilt.items():
        slug = task[: -len(split) - 1]
        entry = manifest["tasks"].setdefault(slug, {"slug": slug, "examples": 0, "splits": {}})
        entry["examples"] += len(docs)
        entry["splits"][split] = write_split_task(out_dir, split, slug, docs, delimiter,
                                                  f"{source}, rebuilt from a recorded run")
        manifest["splits"][split] = str((out_dir / split).resolve())
    return manifest
