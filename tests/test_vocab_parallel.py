"""The embedding and the LM-head losses split by vocabulary over 2 CPU ranks (``swiftkv.distill.vocab``, what FSDP
runs) equal the whole-vocabulary ones of one process: the distillation KL and its gradient (T = 1 and 2), the
cross-entropy and its gradient, the held-out metrics, the embedding lookup, and the slices gathered and scattered.
Rows per rank are unequal (and none on one rank); the vocabulary (37) does not split evenly over 2 ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("rows", [[5, 3], [0, 6]])
def test_sharded_losses_equal_the_whole_vocabulary_ones(tmp_path, rows):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "tests.vocab_parallel_worker", str(tmp_path), json.dumps(rows)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    expected = {"kl_T1", "kl_grad_T1", "kl_T2", "kl_grad_T2", "cross_entropy", "cross_entropy_grad", "embedding", "embedding_chunked",
                "gathered", "scattered"} | {f"{m}_{k}" for m in ("metrics", "metrics_close") for k in
                                             ("kl_sum", "top1_sum", "positions", "student_nll_sum", "teacher_nll_sum",
                                              "labelled")}
    for r in ranks:
        assert r["world"] == 2 and set(r["diff"]) == expected
        assert max(r["diff"].values()) < 1e-4, {k: v for k, v in r["diff"].items() if v >= 1e-4}
