"""The committed GPU-check runs (reports/gpu/<date>-<gpu>/<run>/): every file as its manifest says, and each
folder's README.md what ``python -m analysis.gpu_check render`` makes of them; a collected run is never written over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis import gpu_check

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = sorted(p for p in (ROOT / "reports" / "gpu").glob("*") if p.is_dir())


@pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])
def test_committed_gpu_runs_verify_and_their_page_is_rendered(folder):
    assert gpu_check.main(["render", "--check", str(folder)]) == 0


def test_the_committed_runs_hold_the_gpu_sections():
    runs = [p.parent for f in FOLDERS for p in f.glob("*/manifest.json")]
    assert runs, "no GPU-check run is committed"
    ok = {name for run in runs for name, s in json.loads((run / "sections.json").read_text()).items()
          if s["status"] == "ok"}
    assert {"distill", "prefill"} <= ok


def test_collect_never_writes_over_a_run_and_verify_sees_a_changed_file(tmp_path, capsys):
    src = tmp_path / "out"
    src.mkdir()
    (src / "sections.json").write_text(json.dumps({"prefill": {"status": "ok", "seconds": 1, "detail": ""}}))
    (src / "environment.txt").write_text("# a machine\n")
    (src / "sections.tsv").write_text("prefill\tok\t1\t\n")
    run = tmp_path / "gpu" / "run1"
    assert gpu_check.main(["collect", str(run), str(src), "--commit", "c0ffee", "--command", "bin/gpu-bench"]) == 0
    assert sorted(p.name for p in run.iterdir()) == ["environment.txt", "manifest.json", "sections.json"]
    with pytest.raises(SystemExit, match="exists"):
        gpu_check.main(["collect", str(run), str(src), "--commit", "c0ffee", "--command", "x"])
    assert gpu_check.main(["render", str(run.parent)]) == 0
    assert gpu_check.main(["render", "--check", str(run.parent)]) == 0
    (run / "environment.txt").write_text("# another machine\n")
    assert gpu_check.main(["render", "--check", str(run.parent)]) == 1
    assert "run1/environment.txt: changed" in capsys.readouterr().err
