"""``swiftkv bench eval``: examples/s of an lm-eval suite under each log-likelihood scorer, interleaved in one
process on one loaded model, and whether the scorers agree on every logged log-likelihood."""

from __future__ import annotations

import copy
import logging
import math
import statistics
import time
from pathlib import Path

from swiftkv.bench.speed import hardware
from swiftkv.measure.evaluate import TaskSpec, run_suite
from swiftkv.measure.lm import SCORERS, SwiftKVLM

logger = logging.getLogger(__name__)


def logged_answers(result: dict) -> dict[tuple, tuple[float, bool]]:
    """(log-likelihood, is-greedy) of every request lm-eval logged, keyed by (task, doc_id, request index)."""
    out = {}
    for task, samples in result.get("samples", {}).items():
        for sample in samples:
            for k, resp in enumerate(sample["resps"]):
                ll, greedy = resp[0]
                out[(task, sample["doc_id"], k)] = (float(ll), bool(greedy))
    return out


def examples_of(result: dict) -> int:
    return sum(int(n["effective"]) for n in result.get("n-samples", {}).values())


def bench_eval(model, tokenizer, tasks: list[TaskSpec], include_paths: list[str | Path], *,
               scorers: tuple[str, ...] = SCORERS[::-1], repeats: int = 3, warmup_limit: int = 4,
               batch_size: int = 16, positions_per_forward: int = 1024, kv_cache: str = "native",
               seed: int = 1234, boundary=None) -> dict:
    """Each repeat runs the whole suite once per scorer (the order alternates between repeats) after one untimed
    warm-up pass per scorer over ``warmup_limit`` examples a task. Reports examples/s per run and their median
    per scorer, the ratio of each scorer's median to the first scorer's, the time inside the scorer versus
    lm-eval's own, and the largest log-likelihood difference from the first scorer over every logged request.
    ``boundary``: a base model's recorded boundary states (``swiftkv.measure.boundary``) for the scorer named
    ``boundary``, the packed scorer given them."""
    def run(scorer: str, suite: list[TaskSpec]) -> tuple[dict, SwiftKVLM, float]:
        given = boundary if scorer == "boundary" else None
        lm = SwiftKVLM(model, tokenizer=tokenizer, batch_size=batch_size, kv_cache=kv_cache,
                       scorer="packed" if scorer == "boundary" else scorer,
                       positions_per_forward=positions_per_forward, boundary=given)
        t0 = time.perf_counter()
        result = run_suite(lm, suite, include_paths, seed=seed)
        return result, lm, time.perf_counter() - t0

    warm = copy.deepcopy(tasks)
    for spec in warm:
        spec.limit = min(spec.limit or warmup_limit, warmup_limit)
    for scorer in scorers:
        run(scorer, warm)
    runs, answers, scores = [], {}, {}
    for repeat in range(repeats):
        for scorer in (scorers if repeat % 2 == 0 else scorers[::-1]):
            result, lm, seconds = run(scorer, tasks)
            examples = examples_of(result)
            runs.append({
                "repeat": repeat, "scorer": scorer, "path": lm.last_path, "seconds": seconds, "examples": examples,
                "examples_per_s": examples / seconds, "seconds_scoring": lm.seconds_scoring,
                "forwards": lm.forwards, "positions": dict(lm.tokens_run),
                **({"boundary_forwards": dict(lm.boundary_forwards)} if scorer == "boundary" else {}),
            })
            logger.info("repeat %d %-8s %.1f s  %.2f examples/s", repeat, scorer, seconds, examples / seconds)
            answers.setdefault(scorer, logged_answers(result))
            scores.setdefault(scorer, {t: {k: v for k, v in r.items() if k.endswith(",none") and "stderr" not in k}
                                       for t, r in result["results"].items()})
    first = scorers[0]
    summary = {}
    for scorer in scorers:
        mine = [r for r in runs if r["scorer"] == scorer]
        summary[scorer] = {
            "median_examples_per_s": statistics.median(r["examples_per_s"] for r in mine),
            "examples_per_s": [r["examples_per_s"] for r in mine],
            "median_seconds": statistics.median(r["seconds"] for r in mine),
            "median_seconds_scoring": statistics.median(r["seconds_scoring"] for r in mine),
        }
    agreement = {}
    for scorer in scorers[1:]:
        a, b = answers[first], answers[scorer]
        diffs = [abs(a[k][0] - b[k][0]) for k in a if k in b]
        agreement[scorer] = {
            "requests": len(a),
            "same_requests": set(a) == set(b),
            "max_abs_loglikelihood_diff": max(diffs) if diffs else math.nan,
            "greedy_flags_equal": all(a[k][1] == b[k][1] for k in a if k in b),
            "scores_equal": scores[first] == scores[scorer],
        }
    return {
        "hardware": hardware(),
        "settings": {"scorers": list(scorers), "repeats": repeats, "warmup_limit": warmup_limit,
                     "batch_size": batch_size, "positions_per_forward": positions_per_forward, "kv_cache": kv_cache,
                     "tasks": [vars(t) for t in tasks]},
        "runs": runs,
        "summary": summary,
        "reference": first,  # speedup and agreement are relative to it
        "speedup": {s: summary[s]["median_examples_per_s"] / summary[first]["median_examples_per_s"] for s in scorers},
        "agreement": agreement,
    }
