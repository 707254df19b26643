"""Bad input, table-driven: every user error across the command line and the workflow ends with exactly one
``error: ...`` line on stderr, exit status 2, no traceback — and the file system around it is exactly as it was.

Each case runs the real entry point in a subprocess, in a fresh workspace holding copies of small fixtures (a tiny
plain Llama with a tokenizer, the same damaged in several ways, swiftkv's own outputs of several kinds, a foreign
directory, a git repository, links ...); the whole workspace (home directory included) is snapshotted before and after.

A run that starts and then fails (a diverged distillation, ``FAILED_RUNS``) exits with status 1: its last stderr line is
the one ``error: ...`` line, every planted file is as it was, and it leaves nothing that looks like a result. Mistakes
made through the Python API (``LIBRARY_CASES``) raise ``SwiftKVError`` with a one-line message.
"""

from __future__ import annotations

import json
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
    # -- one output never replaces another, nor the command's own input ----------------------------------------------
    Case("convert-onto-distilled-student", ["convert", "plain", "-l", "2", "-o", "distilled"],
         "holds a distilled SwiftKV student"),
    Case("convert-onto-teacher-cache", ["convert", "plain", "-l", "2", "-o", "cache"], "holds a teacher cache"),
    Case("fidelity-teacher-onto-teacher-cache", ["fidelity-teacher", "plain", "-o", "cache"], "holds a teacher cache"),
    Case("fidelity-teacher-boundary-not-a-cut", ["fidelity-teacher", "plain", "--boundary-layers", "0", "-o", "ft"],
         "0 is not a positive integer"),
    Case("eval-fidelity-teacher-not-one", ["eval", "student", "--base", "plain", "--fidelity-teacher", "foreign",
                                           "--output-dir", "out"], "foreign is not a fidelity teacher"),
    Case("eval-boundary-not-one", ["eval", "student", "--task", "x", "--boundary", "foreign", "--output-dir", "out"],
         "foreign holds no boundary states"),
    Case("eval-save-boundary-onto-teacher-cache", ["eval", "plain", "--task", "x", "--save-boundary", "cache",
                                                   "--boundary-layers", "2", "--output-dir", "out"],
         "holds a teacher cache"),
    Case("eval-save-boundary-without-layers", ["eval", "plain", "--task", "x", "--save-boundary", "b",
                                               "--output-dir", "out"], "--save-boundary needs --boundary-layers"),
    Case("eval-boundary-chunked", ["eval", "student", "--task", "x", "--boundary", "foreign", "--scorer", "chunked",
                                   "--output-dir", "out"], "packed scorer only"),
    Case("teacher-cache-onto-student", ["teacher-cache", "plain", "--layers", "2", "--tokens", "100", "-o", "student"],
         "holds a converted (untrained) SwiftKV student"),
    Case("export-onto-its-input", ["export", "student", "--format", "arctic-inference", "-o", "student"],
         "it is the command's input student"),
    Case("export-onto-its-input-overwrite", ["export", "student", "--format", "arctic-inference", "-o", "student",
                                             "--overwrite"], "--overwrite cannot allow this"),
    Case("convert-rerun-with-user-file", ["convert", "plain", "-l", "2", "-o", "studentnotes"],
         "holds my-notes.txt, which swiftkv did not write there"),
    Case("convert-onto-itself-overwrite", ["convert", "plain", "-l", "2", "-o", "plain", "--overwrite"],
         "it is the command's input plain"),
    Case("convert-into-its-input", ["convert", "plain", "-l", "2", "-o", "plain/student"],
         "it lies inside the command's input plain"),
    Case("convert-around-its-input", ["convert", "box/m", "-l", "2", "-o", "box", "--overwrite"],
         "it contains the command's input box/m"),
    Case("eval-onto-its-checkpoint", ["eval", "student", "--task", "x", "--output-dir", "student"],
         "it is the command's input student"),
    Case("simscore-onto-its-input", ["simscore", "plain", "-o", "plain/config.json"], "it lies inside the command's"),
    # -- a diverging or damaged distillation is refused before any work --------------------------------------------
    Case("distill-lr-nan", ["distill", "plain", "-l", "2", "--lr", "nan", "-o", "out"], "nan is not a finite number"),
    Case("distill-lr-negative", ["distill", "plain", "-l", "2", "--lr=-0.001", "-o", "out"], "is outside (0, inf)"),
    Case("distill-warmup-ratio-one", ["distill", "plain", "-l", "2", "--warmup-ratio", "1", "-o", "out"],
         "1 is outside [0, 1)"),
    Case("distill-grad-norm-inf", ["distill", "plain", "-l", "2", "--max-grad-norm", "inf", "-o", "out"],
         "inf is not a finite number"),
    Case("distill-nan-teacher-cache", ["distill", "plain", "-l", "2", *"--teacher-cache nancache --tokens 1500 "
                                       "--max-length 96 --heldout-tokens 200 -o out".split()], "holds non-finite values"),
    # -- damaged or mismatched checkpoints ----------------------------------------------------------------------------
    Case("generate-missing-swiftkv-weight", ["generate", "nokv", "--prompt", "w1"],
         "lacks 1 of the 7 SwiftKV weights its config implies"),
    Case("eval-base-unrelated", ["eval", "student", "--base", "other", "--output-dir", "out"],
         "--base other is not the model student was made from"),
    Case("eval-base-other-vocabulary", ["eval", "student", "--base", "vocab", "--output-dir", "out"],
         "has a vocabulary of 120 tokens"),
    Case("generate-without-tokenizer", ["generate", "bare", "--prompt", "w1"], "bare has no tokenizer"),
    # -- ordinary mistakes, each before any work ------------------------------------------------------------------------
    Case("distill-sheet-without-loss", ["distill", "plain", "--variant", "swiftkv-50", "--variants", "noloss.tsv",
                                        "--model-id", "smollm2-135m", "-o", "out"], "has no column loss"),
    Case("bigbench-generate-unknown-task", ["bigbench", "generate", "--tasks", "generated/nope", "-o", "out"],
         "'generated/nope' is not a generated task"),
    Case("bigbench-fetch-missing-copy", ["bigbench", "fetch", "--from", "absent.tar.gz", "--dest", "out"],
         "--from absent.tar.gz: no such file"),
    Case("eval-malformed-tasks-json", ["eval", "plain", "--tasks-json", "badtasks.json", "--output-dir", "out"],
         "badtasks.json is not valid JSON"),
    Case("advise-tolerance-nan", ["advise", "plain", "--tolerance", "nan", "-o", "a.json"], "not a finite number"),
    Case("convert-g-zero", ["convert", "plain", "-l", "2", "-g", "0", "-o", "out"], "0 is not a positive integer"),
    Case("distill-g-zero", ["distill", "plain", "-l", "2", "-g", "0", "-o", "out"], "0 is not a positive integer"),
    Case("serve-vllm-missing", ["bench", "serve", "plain", "--engine", "vllm", "--study", "throughput",
                                "--vllm-command", "/nonexistent/vllm", "-o", "s.json"], "not found"),
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
    Case("from-record-not-json", ["bigbench", "from-record", "data.json", "-o", "rebuilt"],
         "is not a JSON record of an lm-eval run"),
    Case("from-record-no-bigbench", ["bigbench", "from-record", "plain/config.json", "-o", "rebuilt"],
         "holds no BIG-bench task"),
    Case("from-record-missing", ["bigbench", "from-record", "nowhere.json.gz", "-o", "rebuilt"], "does not exist"),
    Case("mmlu-unknown-subject", ["bigbench", "extract-mmlu", "--tasks", "mmlu/anatomy", "mmlu/cooking", "-o", "mm"],
         "no MMLU subject mmlu/cooking"),
    Case("mmlu-no-tasks", ["bigbench", "extract-mmlu", "-o", "mm"], "give --tasks mmlu/<subject>"),
    Case("olmes-unknown-task", ["bigbench", "extract-olmes", "--tasks", "olmes/piqa", "olmes/sciq", "-o", "ol"],
         "no OLMES task olmes/sciq"),
    Case("olmes-no-tasks", ["bigbench", "extract-olmes", "-o", "ol"], "give --tasks olmes/<task>"),
    Case("installed-other-source", ["bigbench", "extract-installed", "--tasks", "olmes/piqa", "generated/addition",
                                    "-o", "ol"], "takes mmlu/<subject> and olmes/<task> names"),
    Case("bench-eval-no-tasks", ["bench", "eval", "plain", "-o", "e.json"], "nothing to time"),
    Case("bench-eval-scorer-twice", ["bench", "eval", "plain", "--task", "t", "--scorers", "packed", "packed",
                                     "-o", "e.json"], "names a scorer twice"),
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
    Case("sheet-unknown-row", [*SNAKE, "{ws}/rows-unknown.yaml", "--", "results/distill/summary.csv"],
         "distill.rows names ['swiftkv-51']", program="snakemake"),
    Case("sheet-bad-kv-heads", [*SNAKE, "{ws}/sheet-kv.yaml", "--", "results/distill/summary.csv"],
         "kv_heads=2 must divide the model's 9 attention heads and 3 KV heads", program="snakemake"),
    Case("config-override-not-a-number", [*SNAKE, "{ws}/empty.yaml", "--config", "distill={tokens: many}", "--",
                                          "results/distill/summary.csv"],
         "put `{distill: {tokens: many}}` (with the value you mean) in a YAML file and pass it with --configfile",
         program="snakemake"),
    # -- bin/ci-figures replaces its work directory: only one it made itself ----------------------------------------
    Case("ci-figures-foreign-workdir", ["{ws}/foreign"], "was not made by bin/ci-figures", program="ci-figures"),
    Case("ci-figures-over-checkout", ["."], "contains this checkout", program="ci-figures"),
    # -- lm-eval's command line through swiftkv.measure.harness ------------------------------------------------------------
    Case("harness-shadowed-by-a-folder", ["--help"], "found the folder", program="harness", cwd="shadow"),
]


@pytest.fixture(scope="module")
def material(tmp_path_factory) -> Path:
    """Fixtures the workspaces copy: models (good and damaged), configs and sheets for the workflow cases."""
    return build_material(tmp_path_factory.mktemp("material"))


def build_material(root: Path) -> Path:
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
    bad_kv = sheet.replace("swiftkv-50-mqa-1\t15\t1\t1\t", "swiftkv-50-mqa-1\t15\t1\t2\t")
    assert bad_loss != sheet and bad_g != sheet and bad_kv != sheet
    (root / "loss.tsv").write_text(bad_loss)
    (root / "g.tsv").write_text(bad_g)
    (root / "kv.tsv").write_text(bad_kv)
    (root / "noloss.tsv").write_text("\n".join("\t".join(c for i, c in enumerate(line.split("\t")) if i != 5)
                                               for line in sheet.splitlines()) + "\n")
    own_outputs(root)
    return root


def own_outputs(root: Path) -> None:
    """swiftkv's own outputs of several kinds, as its commands write them (marker and all), some damaged."""
    import numpy as np
    from safetensors.torch import load_file, save_file

    from swiftkv.cli import main
    from swiftkv.distill.teacher_cache import TeacherCacheSettings, build_teacher_cache
    from swiftkv.models.convert import convert_to_swiftkv, save_model_dir
    from tests.conftest import tiny_conversations

    assert main(["convert", str(root / "plain"), "-l", "2", "-o", str(root / "student")]) == 0
    shutil.copytree(root / "student", root / "studentnotes")
    (root / "studentnotes" / "my-notes.txt").write_text("what I found\n")
    save_model_dir(convert_to_swiftkv(tiny_base(), 2), tiny_tokenizer(), root / "distilled",
                   files={"distill.json": '{"heldout_final": {"heldout_kl": 0.05}}\n', "train_log.jsonl": "{}\n"},
                   what="distilled checkpoint")
    build_teacher_cache(tiny_base(), tiny_tokenizer(), root / "cache", TeacherCacheSettings(
        layers=[2], data="sharegpt", seed=0, max_length=96, tokens=1500, heldout_tokens=200),
        train_conversations=tiny_conversations(120), heldout_conversations=tiny_conversations(15, 1, "h"),
        progress=False)
    shutil.copytree(root / "cache", root / "nancache")
    planted = np.memmap(root / "nancache" / "train.h2.bin", dtype=np.float32, mode="r+")
    planted[1000] = np.nan
    planted.flush()
    shutil.copytree(root / "student", root / "nokv")
    weights = load_file(root / "nokv" / "model.safetensors")
    del weights["model.layers.3.self_attn.q_proj_swiftkv.weight"]
    save_file(weights, root / "nokv" / "model.safetensors", metadata={"format": "pt"})
    for name, model in (("other", tiny_base(seed=7)), ("vocab", tiny_base(vocab_size=120)), ("bare", tiny_base())):
        model.save_pretrained(root / name)
        if name != "bare":
            tiny_tokenizer().save_pretrained(root / name)
    (root / "badtasks.json").write_text('{"tasks": [{"name": "arc_easy",\n')


OWN_OUTPUTS = ("student", "studentnotes", "distilled", "cache", "nancache", "nokv", "other", "vocab", "bare")


def workspace(tmp_path: Path, material: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("plain", "badcfg", "trunc", "garbage", *OWN_OUTPUTS):
        shutil.copytree(material / name, ws / name)
    for name in ("noloss.tsv", "badtasks.json"):
        shutil.copyfile(material / name, ws / name)
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
    (ws / "rows-unknown.yaml").write_text("distill:\n  rows: [swiftkv-50, swiftkv-51]\n")
    (ws / "kv.tsv").write_text((material / "kv.tsv").read_text())
    (ws / "sheet-kv.yaml").write_text(f"distill:\n  variants: {ws / 'kv.tsv'}\n")
    (ws / "empty.yaml").write_text("{}\n")
    shutil.copytree(material / "plain", ws / "box" / "m")
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
    return [sys.executable, "-m", "swiftkv.measure.harness", *argv]


def run_case(case: Case, ws: Path) -> tuple[subprocess.CompletedProcess, dict, dict]:
    """The case's command in its own workspace: (the finished process, the workspace before, after)."""
    before = snapshot(ws)
    # HOME in the workspace for our commands (the home-directory case); Snakemake keeps a source cache under $HOME
    home = {"HOME": str(ws / "home")} if case.program == "swiftkv" else {}
    env = {**os.environ, **home, **case.env}
    out = subprocess.run(command(case, ws), cwd=ws / case.cwd, env=env, capture_output=True, text=True, timeout=300)
    return out, before, snapshot(ws)


@pytest.fixture(scope="module")
def case_runs(request, material, tmp_path_factory) -> dict:
    """Every selected case run once, two at a time: each starts Python and imports torch (~4 s of one CPU), so the
    83 cases took ~350 s one after another. Each has its own workspace; the Snakemake, CI-figures and harness cases
    run one at a time among themselves (they share $HOME's caches), beside the swiftkv ones."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Lock

    name = "test_bad_input_is_one_line_and_changes_nothing"
    wanted = [item.callspec.params["case"] for item in request.session.items
              if getattr(item, "originalname", None) == name and hasattr(item, "callspec")]
    shared = Lock()

    def one(case: Case):
        ws = workspace(tmp_path_factory.mktemp(case.id), material)
        if case.program == "swiftkv":
            return run_case(case, ws)
        with shared:
            return run_case(case, ws)

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {case.id: pool.submit(one, case) for case in wanted}
        return {cid: future.exception() or future.result() for cid, future in futures.items()}  # one case's own failure


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_changes_nothing(case, case_runs):
    if isinstance(case_runs[case.id], BaseException):
        raise case_runs[case.id]
    out, before, after = case_runs[case.id]
    err = out.stderr.strip()
    assert out.returncode == 2, (out.returncode, err[-2000:])
    assert len(err.splitlines()) == 1, err[-2000:]
    assert err.startswith("error: ") and case.message in err, err
    assert "Traceback" not in out.stdout + out.stderr
    assert after == before


def test_at_least_thirty_cases_across_cli_and_workflow():
    programs = [c.program for c in CASES]
    assert len(CASES) >= 30 and programs.count("snakemake") >= 5 and programs.count("swiftkv") >= 25


# -- a run that starts and fails: exit 1, one error line last, nothing that looks like a result --------------------

DISTILL_FROM_CACHE = "distill plain -l 2 --teacher-cache cache --tokens 1500 --max-length 96 --heldout-tokens 200 " \
    "--batch-size 2 --checkpoint-every 2 --mixed-precision no --no-progress -o out"

FAILED_RUNS = [
    Case("distill-lr-3e4", [*DISTILL_FROM_CACHE.split(), "--lr", "3e4"], "lr 30000 is likely too high"),
]


@pytest.mark.parametrize("case", FAILED_RUNS, ids=[c.id for c in FAILED_RUNS])
def test_failed_run_is_exit_1_one_line_and_saves_no_result(case, material, tmp_path):
    ws = workspace(tmp_path, material)
    before = snapshot(ws)
    out = subprocess.run(command(case, ws), cwd=ws, env={**os.environ, "HOME": str(ws / "home")},
                         capture_output=True, text=True, timeout=300)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
    assert lines[-1].startswith("error: training diverged at step ") and case.message in lines[-1], lines[-1]
    assert "the last good checkpoint (step 2) stays in out.ckpt for --resume" in lines[-1]
    assert [x for x in lines if x.startswith("error:")] == lines[-1:]
    assert "Traceback" not in out.stdout + out.stderr
    after = snapshot(ws)
    assert {k: after.get(k) for k in before} == before  # nothing planted lost or changed
    left = sorted(str(Path(k).relative_to(ws)) for k in set(after) - set(before))
    # no student and no distill.json: only the checkpoint folder, with the last good checkpoint for --resume
    assert left == ["out.ckpt", "out.ckpt/.swiftkv-output.json", "out.ckpt/checkpoint.pt", "out.ckpt/train_log.jsonl"]
    import torch

    checkpoint = torch.load(ws / "out.ckpt" / "checkpoint.pt", weights_only=False)
    assert checkpoint["step"] == 2 and all(bool(torch.isfinite(t).all()) for t in checkpoint["trainable"].values())


# -- the same kind of output is replaced, and --overwrite replaces another kind ----------------------------------------


def test_own_output_of_the_same_kind_is_replaced_and_overwrite_allows_another_kind(material, tmp_path, monkeypatch):
    from swiftkv.cli import main
    from swiftkv.io import MARKER, read_marker

    ws = workspace(tmp_path, material)
    monkeypatch.chdir(ws)
    for argv in (["convert", "plain", "-l", "3", "-o", "student"],  # its own earlier output: replaced
                 ["convert", "plain", "-l", "2", "-o", "distilled", "--overwrite"],  # another kind, with --overwrite
                 ["convert", "plain", "-l", "2", "-o", "studentnotes", "--overwrite"]):  # a user's file, likewise
        assert main(argv) == 0
    assert json.loads((ws / "student" / "config.json").read_text())["num_key_value_layers"] == 3
    marker = read_marker(ws / "distilled")
    assert marker["kind"] == "converted (untrained) SwiftKV student"
    assert marker["command"] == "swiftkv convert plain -l 2 -o distilled --overwrite"
    assert sorted(marker["files"]) == sorted(p.name for p in (ws / "distilled").iterdir() if p.name != MARKER)
    assert not (ws / "distilled" / "distill.json").exists() and not (ws / "studentnotes" / "my-notes.txt").exists()


# -- mistakes made through the Python API: one SwiftKVError line -------------------------------------------------


def _forward_no_positions(material):
    import torch

    from swiftkv.models.convert import convert_to_swiftkv

    convert_to_swiftkv(tiny_base(), 2)(torch.empty(1, 0, dtype=torch.long))


def _auto_model(name):
    def load(material):
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(material / name)

    return load


def _truncated_student(material):
    from transformers import AutoModelForCausalLM

    damaged = material.parent / "trunc-student"
    if not damaged.exists():
        shutil.copytree(material / "student", damaged)
        weights = damaged / "model.safetensors"
        with open(weights, "r+b") as f:
            f.truncate(weights.stat().st_size // 2)
    AutoModelForCausalLM.from_pretrained(damaged)


LIBRARY_CASES = {
    "load-model-none": (lambda m: __import__("swiftkv.loading").loading.load_model(None), "the model to load must be"),
    "convert-a-model-name": (lambda m: __import__("swiftkv.models.convert").models.convert.convert_to_swiftkv("smollm2-135m", 2),
                             "load it first: model, tokenizer = swiftkv.loading.load_model('smollm2-135m')"),
    "forward-without-positions": (_forward_no_positions, "input_ids holds no positions (shape (1, 0))"),
    "auto-model-missing-swiftkv-weight": (_auto_model("nokv"), "lacks 1 of the 7 SwiftKV weights"),
    "auto-model-truncated-student": (_truncated_student, "is damaged"),
    "teacher-cache-with-nan": (lambda m: __import__("swiftkv.distill.teacher_cache").distill.teacher_cache.TeacherCache(m / "nancache"),
                               "nancache/train.h2.bin holds non-finite values (token row 15): the cache is damaged"),
    "distill-settings-lr-nan": (lambda m: __import__("swiftkv.distill").distill.DistillSettings(
        num_key_value_layers=2, lr=float("nan")).validate(), "lr must be a finite number > 0, got nan"),
}


@pytest.mark.parametrize("case", list(LIBRARY_CASES))
def test_library_mistake_is_one_line(case, material):
    from swiftkv.errors import SwiftKVError

    call, message = LIBRARY_CASES[case]
    with pytest.raises(SwiftKVError) as caught:
        call(material)
    assert message in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    assert "SwiftKVError(" not in str(caught.value)  # one message, not one wrapped in another


# -- the workflow keeps embedded models in its own resources/, whatever the shell exports ------------------------------


def snakemake(ws: Path, *argv: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(ws),
                           "--configfile", str(ROOT / "config/ci.yaml"), *argv], cwd=ws, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=600)


def test_prepare_model_passes_its_resources_folder(tmp_path):
    run = snakemake(tmp_path, "-n", "-p", "--", "resources/models/smollm2-135m",
                    env={"SWIFTKV_RESOURCES": str(tmp_path / "elsewhere")})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "swiftkv prepare-model smollm2-135m --resources resources --force" in run.stdout


@pytest.mark.slow
def test_jobs_read_embedded_models_from_the_workflows_resources(tmp_path):
    """A job given an embedded id finds the model in the workflow's resources/ with SWIFTKV_RESOURCES pointing
    elsewhere (without the fix: "embedded model smollm2-135m is not prepared yet")."""
    model = tmp_path / "resources" / "models" / "smollm2-135m"  # a tiny stand-in, already prepared
    tiny_base().save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    run = snakemake(tmp_path, "--cores", "1", "--", "results/tasks/heldout-ppl/smollm2-135m",
                    env={"SWIFTKV_RESOURCES": str(tmp_path / "elsewhere"), "PATH": f"{Path(sys.executable).parent}:"
                         f"{os.environ['PATH']}"})
    assert run.returncode == 0, (run.stderr + "".join(p.read_text() for p in tmp_path.glob("logs/**/*.log")))[-3000:]
    assert (tmp_path / "results/tasks/heldout-ppl/smollm2-135m/manifest.json").is_file()
    assert not (tmp_path / "elsewhere").exists()
    assert (tmp_path / "results/PROFILE").read_text() == "ci\n"  # which profile's run results/ holds


def test_a_run_of_another_profile_is_refused_before_any_job(tmp_path):
    """results/ of one profile's run is not overwritten by another profile's run (one line, exit 2, no job run);
    a dry run, which writes nothing, still shows the plan."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results/PROFILE").write_text("default\n")
    target = "results/tasks/heldout-ppl/smollm2-135m"
    run = snakemake(tmp_path, "--cores", "1", "--", target, env={})
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 2 and last.startswith("error: results/ holds a default profile run"), run.stderr[-2000:]
    assert "git worktree add ../swiftkv-ci" in last
    assert not (tmp_path / "resources").exists() and not (tmp_path / target).exists()
    assert (tmp_path / "results/PROFILE").read_text() == "default\n"
    dry = snakemake(tmp_path, "-n", "--", target, env={})
    assert dry.returncode == 0, dry.stderr[-2000:]


def test_a_default_run_without_bigbench_says_what_to_do_on_the_console(tmp_path):
    """PyPI stopped serving bigbench==1.0.0: rule fetch_bigbench (of a profile reading the sdist) fails, and its one
    error line (naming --from and the generated tasks) reaches the console, not only the log; nothing is left at the
    target. Here pip reads no index at all, so the test does not depend on what PyPI serves."""
    (tmp_path / "links").mkdir()
    (tmp_path / "sdist.yaml").write_text("eval: {bigbench: {source: sdist}}\n")  # merged over the default profile
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "links"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    target = "resources/bigbench/bigbench-1.0.0.tar.gz"
    run = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path),
                          "--configfile", str(ROOT / "config/config.yaml"), str(tmp_path / "sdist.yaml"), "--cores", "1", "--", target],
                         cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode != 0, run.stderr[-2000:]
    line = next((x for x in run.stderr.splitlines() if x.startswith("error: pip could not download bigbench")), None)
    assert line is not None, run.stderr[-3000:]
    assert "swiftkv bigbench fetch --from PATH" in line and "eval.bigbench.source: generated" in line
    assert not (tmp_path / target).exists()


def test_convert_and_export_of_a_tokenizer_less_checkpoint_say_so_in_one_line(material, tmp_path, monkeypatch, capsys):
    from swiftkv.cli import main
    from swiftkv.loading import TOKENIZER_FILES

    monkeypatch.chdir(tmp_path)
    for argv in (["convert", str(material / "bare"), "-l", "2", "-o", "student"],
                 ["export", "student", "--format", "arctic-inference", "-o", "served"]):
        assert main(argv) == 0
        notes = [x for x in capsys.readouterr().err.splitlines() if x.startswith("note:")]
        assert len(notes) == 1 and "has no tokenizer" in notes[-1], notes
    for out in ("student", "served"):
        assert (tmp_path / out / "model.safetensors").is_file()
        assert not any((tmp_path / out / f).exists() for f in TOKENIZER_FILES)


def test_base_check_accepts_the_students_own_base_in_any_precision(material, tmp_path):
    """The --base check refuses other models (CASES), not the real teacher: a distilled student saved in bfloat16
    (mixed-precision training) against its float32 base, and a student of another l and g."""
    import torch

    from swiftkv.loading import check_base_loaded, check_base_model
    from swiftkv.models.convert import convert_to_swiftkv

    student = convert_to_swiftkv(tiny_base(), 3, 1).to(torch.bfloat16)
    student.save_pretrained(tmp_path / "bf16")
    check_base_model(str(tmp_path / "bf16"), str(material / "plain"))
    check_base_model(str(material / "student"), str(material / "plain"))
    check_base_loaded(student, tiny_base(), "bf16", "plain")
