"""Evaluation through lm-eval: a suite of tasks (``run_suite``), the tasks of a command line (``collect_tasks``) and
one model end to end with its fidelity to the teacher (``evaluate_model``, what ``swiftkv eval`` runs). The model
side, ``SwiftKVLM`` and its log-likelihood scorers, is ``swiftkv.measure.lm``; importing either module registers it
with lm-eval as model ``swiftkv``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swiftkv.errors import SwiftKVError
from swiftkv.measure.lm import SwiftKVLM, is_student
from swiftkv.models.kvquant import make_cache_factory

logger = logging.getLogger(__name__)


# -- running a suite -----------------------------------------------------------------------------------------------


@dataclass
class TaskSpec:
    """One lm-eval task as the config names it: shots, the metric the tables report, chat template or not."""

    name: str
    num_fewshot: int | None = None
    metric: str = "acc"
    chat_template: bool = False
    fewshot_as_multiturn: bool = False
    limit: int | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str | dict) -> "TaskSpec":
        if isinstance(spec, str):
            return cls(name=spec)
        known = {k: spec[k] for k in ("name", "num_fewshot", "metric", "chat_template", "fewshot_as_multiturn", "limit")
                 if k in spec}
        return cls(**known, extra={k: v for k, v in spec.items() if k not in known})


def run_suite(
    lm: SwiftKVLM,
    tasks: list[TaskSpec],
    include_paths: list[str | Path] | None = None,
    seed: int = 1234,
    bootstrap_iters: int = 1000,
) -> dict:
    """Run lm-eval's ``simple_evaluate`` over ``tasks`` (grouped by shots / chat settings) and merge the results.

    Returns lm-eval's result dict (``results``, ``configs``, ``versions``, ``n-shot``, ``n-samples``,
    ``higher-is-better``, ``samples`` per task) plus ``swiftkv`` (what was run, how long, metric per task).
    """
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from swiftkv.data.task_files import missing_data_files

    paths = [str(p) for p in include_paths or []]
    missing = missing_data_files(paths)
    if missing:
        raise SwiftKVError(f"{missing[0]}{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; run from "
                           "the folder the tasks were built from, or build them again here (swiftkv bigbench build, "
                           "or the workflow's task rule)")
    # Indexing lm-eval's thousands of built-in task YAMLs takes a while: skip it when our own folders hold them all.
    manager = TaskManager(include_path=paths, include_defaults=False) if paths else None
    if manager is None or any(s.name not in manager.all_tasks for s in tasks):
        manager = TaskManager(include_path=paths or None)
    groups: dict[tuple, list[TaskSpec]] = defaultdict(list)
    for spec in tasks:
        groups[(spec.num_fewshot, spec.chat_template, spec.fewshot_as_multiturn, spec.limit)].append(spec)
    merged: dict[str, Any] = {}
    timings = {}
    for (shots, chat, multiturn, limit), specs in groups.items():
        names = [s.name for s in specs]
        unknown = [n for n in names if n not in manager.all_tasks]
        if unknown:
            raise SwiftKVError(f"lm-eval does not know task(s) {', '.join(unknown)}; check the config and include paths")
        logger.info("lm-eval: %s (shots=%s, chat=%s)", ", ".join(names), shots, chat)
        t0 = time.perf_counter()
        out = simple_evaluate(
            model=lm,
            tasks=names,
            num_fewshot=shots,
            limit=limit,
            log_samples=True,
            apply_chat_template=chat,
            fewshot_as_multiturn=multiturn,
            task_manager=manager,
            bootstrap_iters=bootstrap_iters,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
        elapsed = time.perf_counter() - t0
        for name in names:
            timings[name] = elapsed / len(names)
        _merge(merged, out)
    merged["swiftkv"] = {
        "tasks": [vars(s) for s in tasks],
        "metric": {s.name: s.metric for s in tasks},
        "seconds_per_task_group_share": timings,
        "tokens_run": dict(getattr(lm, "tokens_run", {})),
        "scorer": getattr(lm, "scorer", None),
        "forwards": getattr(lm, "forwards", None),
        "seconds_scoring": getattr(lm, "seconds_scoring", None),
        "kv_cache": getattr(lm, "kv_cache", "native"),
        "prefill_skip": bool(getattr(lm, "prefill_skip", False)) and is_student(lm.model),
    }
    return merged


def _merge(into: dict, out: dict) -> None:
    for key, value in out.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            into[key].update(value)
        elif key not in into:
            into[key] = value


# -- one model end to end (what ``swiftkv eval`` runs) -------------------------------------------------------------


def tasks_from_manifest(manifest: dict, split: str) -> list[TaskSpec]:
    """Every task of a BIG-bench manifest (``swiftkv bigbench build``) on one split."""
    return [TaskSpec(name=entry["splits"][split]["task"]) for _, entry in sorted(manifest["tasks"].items())]


def _read_json(path: str | Path, option: str):
    """A JSON file a command reads, or one line saying why it cannot."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SwiftKVError(f"{option} {path} does not exist") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise SwiftKVError(f"{option} {path} is not valid JSON ({err}); fix or re-create the file") from None


def collect_tasks(tasks_json: str | Path | None = None, bigbench_manifest: str | Path | None = None,
                  bigbench_split: str = "report", names: list[str] = (), include_paths: list[str | Path] = (),
                  limit: int | None = None) -> tuple[list[TaskSpec], list[str | Path]]:
    """The tasks of an evaluation and the folders lm-eval finds their YAMLs in: those of a task list (a JSON list,
    or ``{"tasks": [...]}`` as the task selection writes), every task of a BIG-bench manifest on one split, and
    tasks by name; ``limit`` caps the examples of every task that has no limit of its own."""
    tasks, include = [], list(include_paths)
    if tasks_json:
        spec = _read_json(tasks_json, "--tasks-json")
        entries = spec.get("tasks") if isinstance(spec, dict) else spec
        if not isinstance(entries, list) or not all(isinstance(t, str) or (isinstance(t, dict) and "name" in t)
                                                    for t in entries):
            raise SwiftKVError(f"--tasks-json {tasks_json}: expected a list of task names or objects with a 'name' "
                               '(or {"tasks": [...]}), e.g. [{"name": "arc_easy", "num_fewshot": 0}]')
        tasks += [TaskSpec.parse(t) for t in entries]
    if bigbench_manifest:
        manifest = _read_json(bigbench_manifest, "--bigbench-manifest")
        try:
            tasks += tasks_from_manifest(manifest, bigbench_split)
            include.append(manifest["splits"][bigbench_split])
        except (KeyError, TypeError, AttributeError) as err:
            raise SwiftKVError(f"--bigbench-manifest {bigbench_manifest} is not a manifest of `swiftkv bigbench "
                               f"build` (no {err}); build it again") from None
    tasks += [TaskSpec(name=name) for name in names]
    if limit:
        for t in tasks:
            t.limit = t.limit or limit
    return tasks, include


def evaluate_model(
    model,
    tokenizer,
    tasks: list[TaskSpec],
    include_paths: list[str | Path],
    *,
    teacher_model=None,
    kv_cache: str = "native",
    batch_size: int = 16,
    fidelity=None,
    heldout=None,
    seed: int = 1234,
    scorer: str = "packed",
    positions_per_forward: int = 1024,
    fidelity_teacher=None,
    boundary=None,
    boundary_recorder=None,
) -> tuple[dict | None, dict | None]:
    """lm-eval results (with samples) of ``model`` as the student (None without ``tasks``), and its fidelity to
    ``teacher_model``.

    ``fidelity`` is a ``swiftkv.measure.fidelity.FidelitySettings`` (None: skip); ``heldout`` the held-out conversations
    it uses (default: ``swiftkv.data.heldout.heldout_sample()``); ``fidelity_teacher`` the teacher's side of it computed
    once (``swiftkv.measure.fidelity_teacher.TeacherOutputs``), or None to compute it here. ``boundary`` /
    ``boundary_recorder``: the base model's boundary states taken by a student, or recorded by the base model
    (``swiftkv.measure.boundary``).
    """
    from swiftkv.measure.fidelity import measure_fidelity
    from swiftkv.models.kvquant import kv_memory

    result = None
    if tasks:
        lm = SwiftKVLM(model, tokenizer=tokenizer, batch_size=batch_size, kv_cache=kv_cache, scorer=scorer,
                       positions_per_forward=positions_per_forward, boundary=boundary,
                       boundary_recorder=boundary_recorder)
        t0 = time.perf_counter()
        result = run_suite(lm, tasks, include_paths, seed=seed)
        result["swiftkv"]["seconds_lm_eval"] = time.perf_counter() - t0
        if boundary is not None:
            result["swiftkv"]["boundary"] = {"path": str(boundary.path), "layer": lm.boundary_layer,
                                             "forwards": dict(lm.boundary_forwards)}
            if lm.boundary_forwards["run"]:
                logger.warning("boundary states: %d of %d forwards ran in full (rows the folder lacks)",
                               lm.boundary_forwards["run"], sum(lm.boundary_forwards.values()))
        if boundary_recorder is not None:
            result["swiftkv"]["boundary_recorded"] = {"layers": boundary_recorder.layers,
                                                      "rows": boundary_recorder.rows}
        if (boundary is not None or boundary_recorder is not None) and lm.last_path != "packed":
            logger.warning("boundary states: none %s, since the requests were scored by the %s path (the packed "
                           "scorer needs sdpa or eager attention and no request past a sliding window)",
                           "recorded" if boundary_recorder is not None else "used", lm.last_path)
        result["swiftkv"]["kv_memory"] = kv_memory(model.config, kv_cache)
        result["swiftkv"]["model_config"] = {k: getattr(model.config, k, None) for k in (
            "model_type", "num_hidden_layers", "num_key_value_layers", "key_value_group_size",
            "swiftkv_key_value_heads", "num_key_value_heads")}
        result["swiftkv"]["dtype"] = str(next(model.parameters()).dtype).replace("torch.", "")
    fid = None
    if fidelity is not None:
        from swiftkv.data.heldout import heldout_sample

        t0 = time.perf_counter()
        conversations = heldout if heldout is not None else heldout_sample()
        fid = measure_fidelity(teacher_model if teacher_model is not None else model, model, tokenizer, conversations,
                               fidelity, cache_factory=make_cache_factory(kv_cache), cached=fidelity_teacher)
        fid["seconds"] = time.perf_counter() - t0
        fid["kv_cache"] = kv_cache
    return result, fid
