"""bin/gpu-bench's structure (issue 32, item 7), checked on the CPU with its --smoke mode (tiny random config): every
section prints a header and one result line, the CUDA-only sections are skipped with their reason, the others write
their JSON, and sections.json sums them up. What the sections measure on a GPU is not checked here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _gpu_bench(*args: str, **env: str) -> subprocess.CompletedProcess:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # python3 = this interpreter
    return subprocess.run([str(ROOT / "bin" / "gpu-bench"), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": path, "PYTHONPATH": str(ROOT), **env})


def _distill_cli_reason() -> str:
    """What the distill section says on a machine without CUDA: this CLI has every flag it uses."""
    proc = subprocess.run([sys.executable, "-m", "swiftkv.cli", "bench", "distill-memory", "--help"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and all(f in proc.stdout for f in ("--device", "--shape", "--output")), proc.stdout
    return "needs CUDA (bf16 + checkpointing peak GPU memory of an 8B-shaped step)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="--smoke skips the CUDA sections only on a machine without CUDA")
def test_smoke_runs_every_default_section(tmp_path):
    proc = _gpu_bench("--smoke", str(tmp_path / "out"))
    out = tmp_path / "out"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("serve", "distill", "prefill"):
        assert f"=== {name} ===" in proc.stdout
    summary = json.loads((out / "sections.json").read_text())
    assert list(summary) == ["serve", "distill", "prefill"]
    assert summary["serve"]["status"] == "skipped" and summary["serve"]["detail"].startswith("needs CUDA")
    assert summary["distill"] == {"status": "skipped", "seconds": 0, "detail": _distill_cli_reason()}
    assert "== distill: skipped: " + _distill_cli_reason() in proc.stdout
    assert summary["prefill"]["status"] == "ok" and "== prefill: ok" in proc.stdout
    prefill = json.loads((out / "prefill.json").read_text())
    assert prefill["num_hidden_layers"] == 4 and prefill["device"] == "cpu"
    assert {r["variant"] for r in prefill["results"]} == {"base", "swiftkv-l2", "swiftkv-l3"}
    assert "no section failed" in proc.stdout and (out / "environment.txt").exists()


def test_a_failing_section_is_reported_and_the_rest_still_run(tmp_path):
    """A section that fails (here: the prefill benchmark stopped by a 1 s section limit) is recorded as failed with
    its log, the script goes on to the next section, and exits 1 naming it."""
    proc = _gpu_bench("--smoke", str(tmp_path), SECTIONS="prefill serve", SECTION_TIMEOUT="1")
    summary = json.loads((tmp_path / "sections.json").read_text())
    assert proc.returncode == 1 and summary["prefill"]["status"] == "failed", proc.stdout[-3000:]
    assert summary["prefill"]["detail"] == f"timed out after 1s (log: {tmp_path}/prefill.log)"
    assert summary["serve"]["status"] == "skipped" and "FAILED: prefill" in proc.stdout


def test_unknown_section_and_option_are_one_line(tmp_path):
    proc = _gpu_bench("--smoke", str(tmp_path), SECTIONS="nonsense")
    assert proc.returncode == 2 and proc.stderr.strip() == "gpu-bench: unknown section nonsense"
    proc = _gpu_bench("--fast", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.strip() == "usage: bin/gpu-bench [--smoke] [OUTDIR]"


def test_total_time_limit_skips_what_does_not_fit(tmp_path):
    """TOTAL_TIMEOUT bounds the whole check (8 minutes by default): a section with under 10 s left is skipped, saying
    why, instead of starting."""
    proc = _gpu_bench("--smoke", str(tmp_path), SECTIONS="prefill", TOTAL_TIMEOUT="5")
    summary = json.loads((tmp_path / "sections.json").read_text())
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert summary["prefill"] == {"status": "skipped", "seconds": 0, "detail": "no time left of TOTAL_TIMEOUT=5 s"}
    assert not (tmp_path / "prefill.json").exists()
