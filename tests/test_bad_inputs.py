"""Bad input, table-driven: every user error across the command line and the workflow ends with exactly one
``error: ...`` line on stderr, exit status 2, no traceback — and the file system around it is exactly as it was.

Each case runs the real entry point in a subprocess, in a fresh workspace holding copies of small fixtures (a tiny
plain Llama with a tokenizer, the same damaged in several ways, a foreign directory, a git repository, links ...);
the whole workspace (home directory included) is snapshotted before and after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import tiny_base, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Case:
    id: str
    argv: list[str]  # after the program ("swiftkv", "snakemake", "harness"); "{ws}" / "{root}" are filled in
    message: str  # a part of the one error line
    program: str = "swiftkv"
    cwd: str = "."  # relative to the workspace
    env: dict[str, str] = field(default_factory=dict)


SNAKE = ["-n", "-s", "{root}/Snakefile", "-d", "{ws}", "--configfile", "{root}/config/ci.yaml"]

CASES = [
    # -- output paths: never replace what swiftkv did not write, never the protected places ------------------------
    Case("convert-into-foreign-dir", ["convert", "plain", "-l", "2", "-o", "foreign"], "was not written by swiftkv"),
    Case("convert-into-cwd", ["convert", "plain", "-l", "2", "-o", "."], "it is the working directory"),
    Case("convert-over-cwd", ["convert", "plain", "-l", "2", "-o", ".", "--overwrite"], "it is the working directory"),
    Case("convert-over-cwd-parent", ["convert", "../plain", "-l", "2", "-o", "..", "--overwrite"],
         "it contains the working directory", cwd="sub"),
    Case("convert-through-link", ["convert", "plain", "-l", "2", "-o", "link", "--overwrite"], "is a symbolic link"),
    Case("convert-over-home", ["convert", "plain", "-l", "2", "-o", "home", "--overwrite"], "your home directory"),
    Case("convert-over-repo", ["convert", "plain", "-l", "2", "-o", "repo", "--overwrite"], "it is a git repository"),
    Case("convert-onto-file", ["convert", "plain", "-l", "2", "-o", "notes.txt"], "is a file, not a directory"),
    Case("convert-read-only", ["convert", "plain", "-l", "2", "-o", "/sys/swiftkv-out"], "is not writable"),
    Case("distill-into-foreign-dir", ["distill", "plain", "-l", "2", "-o", "foreign"], "was not written by swiftkv"),
    Case("prefill-onto-dir", ["bench", "prefill", "plain", "-o", "foreign"], "is a directory"),
    Case("prefill-onto-text", ["bench", "prefill", "plain", "-o", "data.json"], "is not a swiftkv .json file"),
    Case("prefill-through-link", ["bench", "prefill", "plain", "-o", "filelink.json"], "is a symbolic link"),
    Case("flops-onto-text", ["flops", "--model-config", "plain", "-o", "data.json"], "is not a swiftkv .json file"),
    Case("eval-into-foreign-dir", ["eval", "plain", "--task", "x", "--output-dir", "foreign"],
         "was not written by swiftkv"),
    Case("serve-onto-dir", ["bench", "serve", "plain", "--engine", "hf", "--study", "throughput", "-o", "foreign"],
         "is a directory"),
    # -- damaged models -------------------------------------------------------------------------------------------
    Case("generate-corrupt-config", ["generate", "badcfg", "--prompt", "hi"], "is not valid JSON"),
    Case("generate-truncated-weights", ["generate", "trunc", "--prompt", "hi"], "is damaged"),
    Case("convert-truncated-weights", ["convert", "trunc", "-l", "2", "-o", "out"], "is damaged"),
    Case("convert-garbage-weights", ["convert", "garbage", "-l", "2", "-o", "out"], "is damaged"),
    Case("eval-truncated-weights", ["eval", "trunc", "--task", "x", "--output-dir", "out"], "is damaged"),
    Case("distill-corrupt-config", ["distill", "badcfg", "-l", "2", "-o", "out"], "is not valid JSON"),
    Case("bench-distill-truncated", ["bench", "distill", "trunc", "-o", "out.json"], "is damaged"),
    Case("bench-prefill-corrupt-config", ["bench", "prefill", "badcfg", "-o", "out.json"], "is not valid JSON"),
    Case("serve-hf-truncated", ["bench", "serve", "trunc", "--engine", "hf", "--study", "throughput", "-o", "s.json"],
         "is damaged"),
    Case("serve-vllm-truncated", ["bench", "serve", "trunc", "--engine", "vllm", "--study", "throughput",
                                  "-o", "s.json"], "is damaged"),
    Case("flops-corrupt-config", ["flops", "--model-config", "badcfg"], "not a valid JSON"),
    Case("model-is-a-file", ["generate", "notes.txt", "--prompt", "hi"], "is a file; point at a model directory"),
    Case("hub-offline", ["generate", "someone/model", "--prompt", "hi"], "the hub is unreachable",
         env={"HF_HUB_OFFLINE": "1"}),
    # -- arguments -------------------------------------------------------------------------------------------------
    Case("empty-prompt", ["generate", "plain", "--prompt", " "], "must not be empty"),
    Case("zero-new-tokens", ["generate", "plain", "--prompt", "hi", "--max-new-tokens", "0"], "not a positive integer"),
    Case("negative-new-tokens", ["generate", "plain", "--prompt", "hi", "--max-new-tokens", "-3"],
         "not a positive integer"),
    Case("teacher-of-plain-model", ["generate", "plain", "--prompt", "hi", "--teacher"], "needs a SwiftKV checkpoint"),
    Case("prefill-zero-length", ["bench", "prefill", "plain", "--lengths", "0", "-o", "p.json"],
         "not a positive integer"),
    Case("prefill-fraction-above-one", ["bench", "prefill", "plain", "--fractions", "1.5", "-o", "p.json"],
         "outside (0, 1]"),
    Case("prefill-fraction-zero", ["bench", "prefill", "plain", "--fractions", "0", "-o", "p.json"], "outside (0, 1]"),
    Case("prefill-zero-repeats", ["bench", "prefill", "plain", "--repeats", "0", "-o", "p.json"],
         "not a positive integer"),
    Case("convert-bad-g", ["convert", "plain", "-l", "2", "-g", "4", "-o", "out"], "does not divide"),
    Case("convert-bad-l", ["convert", "plain", "-l", "9", "-o", "out"], "is outside [1, 4]"),
    Case("distill-bad-g", ["distill", "plain", "-l", "1", "-g", "2", "-o", "out"], "does not divide"),
    Case("distill-no-student", ["distill", "plain", "-o", "out"], "say which student to train"),
    Case("unknown-embedded-model", ["prepare-model", "nope"], "unknown embedded model"),
    Case("missing-prompt", ["generate", "plain"], "required: --prompt"),
    Case("unknown-command", ["frobnicate"], "invalid choice"),
    # -- the workflow ----------------------------------------------------------------------------------------------
    Case("config-misspelled-top-key", [*SNAKE, "{ws}/typo.yaml", "--", "reports/table2.csv"], "'distil' was unexpected",
         program="snakemake"),
    Case("config-bad-type", [*SNAKE, "{ws}/badtype.yaml", "--", "reports/table2.csv"], "is not of type 'integer'",
         program="snakemake"),
    Case("config-bad-dtype", [*SNAKE, "{ws}/baddtype.yaml", "--", "reports/table2.csv"], "'float16' is not one of",
         program="snakemake"),
    Case("sheet-bad-loss", [*SNAKE, "{ws}/sheet-loss.yaml", "--", "results/distill/summary.csv"],
         "'mse' is not one of", program="snakemake"),
    Case("sheet-bad-g", [*SNAKE, "{ws}/sheet-g.yaml", "--", "results/distill/summary.csv"], "invalid for L=30",
         program="snakemake"),
    Case("sheet-missing", [*SNAKE, "{ws}/sheet-missing.yaml", "--", "results/distill/summary.csv"], "not found",
         program="snakemake"),
    # -- bin/ci-figures replaces its work directory: only one it made itself ----------------------------------------
    Case("ci-figures-foreign-workdir", ["{ws}/foreign"], "was not made by bin/ci-figures", program="ci-figures"),
    Case("ci-figures-over-checkout", ["."], "contains this checkout", program="ci-figures"),
    # -- lm-eval's command line through swiftkv.harness ------------------------------------------------------------
    Case("harness-shadowed-by-a-folder", ["--help"], "found the folder", program="harness", cwd="shadow"),
]


@pytest.fixture(scope="module")
def material(tmp_path_factory) -> Path:
    """Fixtures the workspaces copy: models (good and damaged), configs and sheets for the workflow cases."""
    root = tmp_path_factory.mktemp("material")
    plain = root / "plain"
    tiny_base().save_pretrained(plain)
    tiny_tokenizer().save_pretrained(plain)
    for name in ("badcfg", "trunc", "garbage"):
        shutil.copytree(plain, root / name)
    (root / "badcfg" / "config.json").write_text('{"model_type": "llama", ')
    weights = root / "trunc" / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    (root / "garbage" / "model.safetensors").write_bytes(b"not safetensors" * 64)
    sheet = (ROOT / "config/variants.tsv").read_text()
    bad_loss = sheet.replace("swiftkv-62\t11\t1\t\tkl", "swiftkv-62\t11\t1\t\tmse")
    bad_g = sheet.replace("swiftkv-50-acrosskv-3\t15\t3", "swiftkv-50-acrosskv-3\t15\t4")
    assert bad_loss != sheet and bad_g != sheet
    (root / "loss.tsv").write_text(bad_loss)
    (root / "g.tsv").write_text(bad_g)
    return root


def workspace(tmp_path: Path, material: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("plain", "badcfg", "trunc", "garbage"):
        shutil.copytree(material / name, ws / name)
    (ws / "foreign").mkdir()
    (ws / "foreign" / "thesis.tex").write_text("years of work\n")
    (ws / "notes.txt").write_text("my notes\n")
    (ws / "data.json").write_text("not json, but mine\n")
    (ws / "target.json").write_text('{"mine": true}\n')
    (ws / "link").symlink_to(ws / "foreign")
    (ws / "filelink.json").symlink_to(ws / "target.json")
    (ws / "home").mkdir()
    (ws / "home" / ".profile").write_text("# mine\n")
    (ws / "repo" / ".git").mkdir(parents=True)
    (ws / "repo" / "code.py").write_text("print('mine')\n")
    (ws / "sub").mkdir()
    (ws / "shadow" / "swiftkv").mkdir(parents=True)  # a folder named like the package (e.g. a clone)
    (ws / "typo.yaml").write_text("distil:\n  tokens: 100\n")
    (ws / "badtype.yaml").write_text("distill:\n  tokens: many\n")
    (ws / "baddtype.yaml").write_text("dtype: float16\n")
    (ws / "loss.tsv").write_text((material / "loss.tsv").read_text())
    (ws / "g.tsv").write_text((material / "g.tsv").read_text())
    (ws / "sheet-loss.yaml").write_text(f"distill:\n  variants: {ws / 'loss.tsv'}\n")
    (ws / "sheet-g.yaml").write_text(f"distill:\n  variants: {ws / 'g.tsv'}\n")
    (ws / "sheet-missing.yaml").write_text(f"distill:\n  variants: {ws / 'nowhere.tsv'}\n")
    return ws


def snapshot(top: Path) -> dict:
    """Every entry under ``top``: kind, mode, and for files size, mtime and content (directory mtimes left out: a
    write probe that creates and removes a file changes nothing a user has)."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            if path.is_symlink():
                state[str(path)] = ("link", os.readlink(path))
            elif path.is_dir():
                state[str(path)] = ("dir", st.st_mode)
            else:
                state[str(path)] = ("file", st.st_mode, st.st_size, st.st_mtime_ns, path.read_bytes())
    return state


def command(case: Case, ws: Path) -> list[str]:
    argv = [a.replace("{ws}", str(ws)).replace("{root}", str(ROOT)) for a in case.argv]
    if case.program == "swiftkv":
        return [sys.executable, "-m", "swiftkv.cli", *argv]
    if case.program == "snakemake":
        return [sys.executable, "-m", "snakemake", *argv]
    if case.program == "ci-figures":
        return ["bash", str(ROOT / "bin" / "ci-figures"), *argv]
    return [sys.executable, "-m", "swiftkv.harness", *argv]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_changes_nothing(case, material, tmp_path):
    ws = workspace(tmp_path, material)
    before = snapshot(ws)
    # HOME in the workspace for our commands (the home-directory case); Snakemake keeps a source cache under $HOME
    home = {"HOME": str(ws / "home")} if case.program == "swiftkv" else {}
    env = {**os.environ, **home, **case.env}
    out = subprocess.run(command(case, ws), cwd=ws / case.cwd, env=env, capture_output=True, text=True, timeout=300)
    err = out.stderr.strip()
    assert out.returncode == 2, (out.returncode, err[-2000:])
    assert len(err.splitlines()) == 1, err[-2000:]
    assert err.startswith("error: ") and case.message in err, err
    assert "Traceback" not in out.stdout + out.stderr
    assert snapshot(ws) == before


def test_at_least_thirty_cases_across_cli_and_workflow():
    programs = [c.program for c in CASES]
    assert len(CASES) >= 30 and programs.count("snakemake") >= 5 and programs.count("swiftkv") >= 25
