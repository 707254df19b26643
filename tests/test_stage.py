"""Staged results (analysis/stage.py): a long run's finished outputs kept between sessions and put back under
results/ on a new machine, newest copy first, never over a different file, run directories without their weights
marked so that loading one is refused in one line; and Snakemake skips the restored jobs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import stage
from analysis.raw import RawError, read_manifest
from swiftkv.errors import SwiftKVError
from swiftkv.loading import RESTORED_WITHOUT_WEIGHTS, check_model_dir

ROOT = Path(__file__).resolve().parents[1]


def _checkout(tmp_path: Path) -> Path:
    """A run's checkout: an evaluation, a held-out file and a finished student (summary, log and weights)."""
    run = tmp_path / "run"
    (run / "results/eval/m/v/native").mkdir(parents=True)
    (run / "results/eval/m/v/native/lm_eval.json").write_text(json.dumps({"results": {"t": {"acc": 0.5}},
                                                                          "pad": "x" * 70_000}))
    (run / "results/eval/m/v/native/fidelity.json").write_text('{"kl": 0.25}\n')
    ckpt = run / "results/checkpoints/m/v"
    ckpt.mkdir(parents=True)
    (ckpt / "distill.json").write_text('{"steps": 3}\n')
    (ckpt / "train_log.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    (ckpt / "config.json").write_text('{"model_type": "llama"}\n')
    (ckpt / "model.safetensors").write_bytes(b"\0" * 64)
    (run / "config").mkdir()
    (run / "config/config.yaml").write_text("a: 1\n")
    return run


PATHS = ["results/eval/m/v/native/lm_eval.json", "results/eval/m/v/native/fidelity.json", "results/checkpoints/m/v"]


def test_save_then_restore_gives_back_the_files_and_a_run_directory_that_refuses_to_load(tmp_path):
    run = _checkout(tmp_path)
    area = tmp_path / "staging/power"
    manifest = stage.save(area, "s1", run, PATHS, ["config/config.yaml"])
    stored = set(manifest["files"])
    assert stored == {"eval/m/v/native/lm_eval.json.gz", "eval/m/v/native/fidelity.json",
                      "checkpoints/m/v/distill.json", "checkpoints/m/v/train_log.jsonl"}  # never the weights
    block = manifest[stage.STAGED]
    assert block["session"] == "s1" and block["cpu"] and block["supersedes"] == {}
    assert set(block["configfiles"]) == {"config/config.yaml"}

    fresh = tmp_path / "fresh"
    written = stage.restore(area, fresh)
    assert len(written) == 4
    ckpt, ev = fresh / "results/checkpoints/m/v", fresh / "results/eval/m/v/native/lm_eval.json"
    newest_in_ckpt = max(p.stat().st_mtime for p in [ckpt, *ckpt.iterdir()])
    assert newest_in_ckpt <= ev.stat().st_mtime  # else Snakemake takes the student for an updated input
    for rel in ("results/eval/m/v/native/lm_eval.json", "results/checkpoints/m/v/train_log.jsonl"):
        assert (fresh / rel).read_bytes() == (run / rel).read_bytes()
    assert (fresh / "results/checkpoints/m/v" / RESTORED_WITHOUT_WEIGHTS).is_file()
    assert not (fresh / "results/eval/m/v/native" / RESTORED_WITHOUT_WEIGHTS).exists()
    with pytest.raises(SwiftKVError, match="summary and log, not its weights"):
        check_model_dir(fresh / "results/checkpoints/m/v")
    assert stage.restore(area, fresh) == []  # again: everything is there with the same bytes


def test_a_second_session_stages_only_what_is_new_or_changed_and_its_copy_wins(tmp_path):
    run = _checkout(tmp_path)
    area = tmp_path / "staging/power"
    stage.save(area, "s1", run, PATHS, [])
    assert stage.save(area, "s2", run, PATHS, []) is None  # nothing new
    (run / "results/eval/m/v/native/fidelity.json").write_text('{"kl": 0.5}\n')  # recomputed on another machine
    (run / "results/eval/m/w/native").mkdir(parents=True)
    (run / "results/eval/m/w/native/fidelity.json").write_text('{"kl": 0.75}\n')
    manifest = stage.save(area, "s2", run, [*PATHS, "results/eval/m/w/native/fidelity.json"], [])
    assert set(manifest["files"]) == {"eval/m/v/native/fidelity.json", "eval/m/w/native/fidelity.json"}
    assert manifest[stage.STAGED]["supersedes"] == {"results/eval/m/v/native/fidelity.json":
                                                    "s1/eval/m/v/native/fidelity.json"}
    fresh = tmp_path / "fresh"
    stage.restore(area, fresh)
    assert json.loads((fresh / "results/eval/m/v/native/fidelity.json").read_text()) == {"kl": 0.5}
    assert [f.name for f in stage.folders(area)] == ["s1", "s2"]


def test_saving_a_session_again_keeps_what_it_held(tmp_path):
    run = _checkout(tmp_path)
    area = tmp_path / "staging/power"
    stage.save(area, "s1", run, PATHS[:1], [])
    manifest = stage.save(area, "s1", run, PATHS[1:2], [])
    assert set(manifest["files"]) == {"eval/m/v/native/lm_eval.json.gz", "eval/m/v/native/fidelity.json"}
    before = (area / "s1/manifest.json").stat().st_mtime_ns
    assert stage.save(area, "s1", run, PATHS[:2], []) is None  # all held already: the folder is not rewritten
    assert (area / "s1/manifest.json").stat().st_mtime_ns == before


def test_restore_never_replaces_a_different_file_and_writes_nothing_then(tmp_path):
    run = _checkout(tmp_path)
    area = tmp_path / "staging/power"
    stage.save(area, "s1", run, PATHS, [])
    fresh = tmp_path / "fresh"
    (fresh / "results/eval/m/v/native").mkdir(parents=True)
    (fresh / "results/eval/m/v/native/fidelity.json").write_text('{"kl": 9}\n')
    with pytest.raises(RawError, match="exists and differs"):
        stage.restore(area, fresh)
    assert not (fresh / "results/checkpoints").exists()
    assert json.loads((fresh / "results/eval/m/v/native/fidelity.json").read_text()) == {"kl": 9}


def test_a_damaged_staging_folder_is_refused(tmp_path):
    run = _checkout(tmp_path)
    area = tmp_path / "staging/power"
    stage.save(area, "s1", run, PATHS, [])
    (area / "s1/eval/m/v/native/fidelity.json").write_text("{}")
    with pytest.raises(RawError, match="damaged"):
        stage.restore(area, tmp_path / "fresh")


@pytest.mark.parametrize("paths, message", [
    (["results/checkpoints/m/unfinished"], "not a finished run directory"),
    (["results/eval/m/v/native/missing.json"], "does not exist"),
    (["elsewhere/file.json"], "under results/"),
])
def test_bad_paths_are_refused_before_anything_is_written(tmp_path, paths, message):
    run = _checkout(tmp_path)
    (run / "results/checkpoints/m/unfinished").mkdir(parents=True)
    with pytest.raises(RawError, match=message):
        stage.save(tmp_path / "staging/power", "s1", run, paths, [])
    assert not (tmp_path / "staging").exists()


def test_the_command_line_saves_lists_and_restores_with_one_line_errors(tmp_path):
    run = _checkout(tmp_path)
    area = tmp_path / "staging/power"
    cli = [sys.executable, "-m", "analysis.stage"]

    def call(*args):
        return subprocess.run([*cli, *args], capture_output=True, text=True, cwd=ROOT)

    out = call("save", str(area), *PATHS, "--session", "20261205T2307Z", "--root", str(run))
    assert out.returncode == 0 and "4 files staged" in out.stdout, out.stderr
    out = call("list", str(area))
    assert out.returncode == 0 and out.stdout.startswith("20261205T2307Z: 4 files")
    out = call("restore", str(area), "--root", str(tmp_path / "fresh"))
    assert out.returncode == 0 and "4 files restored" in out.stdout
    out = call("list", str(tmp_path / "nothing"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "holds no staged session" in out.stderr
    out = call("save", str(area), "results/nope.json", "--session", "s", "--root", str(run))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "does not exist" in out.stderr


@pytest.mark.skipif(shutil.which("snakemake") is None and not (Path(sys.executable).parent / "snakemake").exists(),
                    reason="snakemake not installed")
def test_snakemake_skips_the_jobs_whose_outputs_were_restored(tmp_path):
    """The premise: a job whose output is back is not rerun, although its run directory holds no weights and an
    input it reads is missing; when an input was rebuilt after the restore, --touch (every unit done) settles it."""
    run = tmp_path / "run"
    run.mkdir()
    snakefile = """
rule table:
    input: "results/eval/v/lm_eval.json", "results/checkpoints/v"
    output: "results/table.txt"
    shell: "cat {input[0]} {input[1]}/distill.json > {output}"
rule evaluate:
    input: "results/checkpoints/v"
    output: "results/eval/v/lm_eval.json"
    shell: "cat {input}/weights > {output}"
rule distill:
    input: "cache.txt"
    output: directory("results/checkpoints/v")
    shell: "mkdir -p {output} && cp {input} {output}/weights && echo '{{}}' > {output}/distill.json"
rule cache:
    output: "cache.txt"
    shell: "echo teacher > {output}"
"""
    (run / "Snakefile").write_text(snakefile)
    snakemake = str(Path(sys.executable).parent / "snakemake")

    def run_snakemake(cwd, target, *options):
        return subprocess.run([snakemake, target, "--cores", "1", *options], cwd=cwd, check=True, capture_output=True,
                              text=True).stdout

    run_snakemake(run, "results/eval/v/lm_eval.json")
    area = tmp_path / "staging/toy"
    stage.save(area, "s1", run, ["results/eval/v/lm_eval.json", "results/checkpoints/v"], [])

    fresh = tmp_path / "fresh"  # a new machine: the checkout, the staged outputs, and a rebuilt (newer) cache
    fresh.mkdir()
    (fresh / "Snakefile").write_text(snakefile)
    stage.restore(area, fresh)
    def jobs(dry):
        return {line.split()[0] for line in dry.splitlines()
                if len(line.split()) == 2 and line.split()[0] in ("table", "evaluate", "distill", "cache")}

    fresh_cache = tmp_path / "fresh-cache"  # the teacher cache still missing: nothing upstream is rebuilt
    shutil.copytree(fresh, fresh_cache)
    assert jobs(run_snakemake(fresh_cache, "results/table.txt", "-n")) == {"table"}
    run_snakemake(fresh, "cache.txt")  # rebuilt after the restore: the restored outputs are older
    assert jobs(run_snakemake(fresh, "results/table.txt", "-n")) == {"table", "evaluate", "distill"}
    run_snakemake(fresh, "results/table.txt", "--touch")  # every unit done: the outputs are up to date
    assert not (fresh / "results/table.txt").exists()  # --touch creates nothing missing
    assert jobs(run_snakemake(fresh, "results/table.txt", "-n")) == {"table"}
    run_snakemake(fresh, "results/table.txt")
    assert (fresh / "results/table.txt").read_text() == "teacher\n{}\n"
    assert read_manifest(area / "s1")["files"]


def test_units_group_a_run_by_the_model_evaluated_seed_by_seed_base_first():
    outputs = ["results/seeds/m/v/seed-1/native/lm_eval.json", "results/eval/m/v/fp8/lm_eval.json",
               "results/eval/m/v/native/lm_eval.json", "results/eval/m/base/native/heldout.json",
               "results/seeds/m/v/seed-1/native/fidelity.json", "results/eval/m/a/native/lm_eval.json"]
    got = stage.units(outputs)
    assert [u["key"] for u in got] == ["m/base/seed-0", "m/a/seed-0", "m/v/seed-0", "m/v/seed-1"]
    assert got[2] == {"key": "m/v/seed-0", "run_dir": "results/checkpoints/m/v",
                      "outputs": ["results/eval/m/v/fp8/lm_eval.json", "results/eval/m/v/native/lm_eval.json"]}
    assert got[3]["run_dir"] == "results/seeds/m/v/seed-1/checkpoint"
    with pytest.raises(RawError, match="not an evaluation output"):
        stage.units(["results/checkpoints/m/v"])


def test_units_of_the_extended_suite_take_the_tables_student_at_the_profiles_seed():
    ext = "results/extended/m/{}/seed-{}/{}/lm_eval.json"
    outputs = [ext.format("v", 1, "native"), ext.format("v", 2, "native"), ext.format("v", 2, "fp8"),
               ext.format("base", 2, "fp8"), ext.format("base", 2, "native")]
    assert not stage.is_unit_output("results/extended/m/selection/lm_eval.json")  # the published choice
    got = stage.units(outputs, own_seed=2)
    assert [u["key"] for u in got] == ["m/v/seed-1", "m/base/seed-2", "m/v/seed-2"]
    assert got[0]["run_dir"] == "results/seeds/m/v/seed-1/checkpoint"
    assert got[2] == {"key": "m/v/seed-2", "run_dir": "results/checkpoints/m/v",
                      "outputs": [ext.format("v", 2, "fp8"), ext.format("v", 2, "native")]}


def test_power_run_refuses_a_folder_that_is_no_checkout_and_a_bad_stop_time_in_one_line(tmp_path):
    script = str(ROOT / "bin" / "power-run")
    out = subprocess.run([sys.executable, script, "--checkout", str(tmp_path), "--dry-run"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "is not a checkout with config/config.yaml" in out.stderr
    assert out.stderr.count("\n") == 1
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text("profile: default\n")
    out = subprocess.run([sys.executable, script, "--study", "extended", "--checkout", str(tmp_path), "--dry-run"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "config/config.yaml) has no extended_suite block (the extended study's settings)" in out.stderr
    (tmp_path / "config" / "extended-suite.yaml").write_text("extended_suite: null\n")
    out = subprocess.run([sys.executable, script, "--study", "extended", "--checkout", str(tmp_path), "--dry-run"],
                         capture_output=True, text=True)  # an overlay that leaves it out still has none
    assert out.returncode == 2 and "has no extended_suite block" in out.stderr
    out = subprocess.run([sys.executable, script, "--checkout", str(ROOT), "--stop-at", "25h", "--dry-run"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "give a UTC time as HH:MM" in out.stderr


@pytest.mark.skipif(shutil.which("snakemake") is None and not (Path(sys.executable).parent / "snakemake").exists(),
                    reason="snakemake not installed")
def test_a_published_choice_is_put_back_on_the_tasks_built_here_and_never_computed_again(tmp_path, monkeypatch):
    """The extended study's choice (a committed raw folder) on a new machine: the tasks are built here (their manifest
    names the checkout's absolute path), the choice is written back, the suite it was made from is built, and the
    choice is marked up to date, so that the evaluation that reads it runs alone; tasks other than the published ones
    are refused."""
    from analysis.raw import collect

    snakefile = """
import json, os
rule build:
    output: directory("results/tasks/x")
    params: size=config.get("size", 3)
    run:
        os.makedirs(output[0])
        json.dump({"splits": {"report": os.path.abspath(output[0])}, "size": params.size},
                  open(f"{output[0]}/manifest.json", "w"))
rule suite:
    output: "results/suite.txt"
    shell: "echo suite > {output}"
rule choose:
    input: "results/tasks/x", "results/suite.txt"
    output: "results/ext/tasks.json"
    shell: "echo chosen > {output}"
rule evaluate:
    input: "results/ext/tasks.json", "results/tasks/x"
    output: "results/ext/v/lm_eval.json"
    shell: "cat {input[0]} > {output}"
"""
    exe = str(Path(sys.executable).parent / "snakemake")

    def checkout(name, *config):
        root = tmp_path / name
        root.mkdir()
        (root / "Snakefile").write_text(snakefile)

        def run(targets, *options):
            return subprocess.run([exe, *targets, "--cores", "1", *options, *config], cwd=root, capture_output=True,
                                  text=True)
        return root, run

    first, run = checkout("first")
    assert run(["results/ext/tasks.json"]).returncode == 0
    monkeypatch.chdir(first)
    published = tmp_path / "reports/raw/choice"
    collect(["results/ext/tasks.json", "results/tasks/x/manifest.json"], published, "h", "c", repo=first)
    monkeypatch.chdir(tmp_path)

    fresh, run = checkout("fresh")  # a new machine: nothing built, nothing chosen, the suite it extends not there
    written = stage.put_back_published(published, fresh, run)
    assert [p.relative_to(fresh).as_posix() for p in written] == ["results/ext/tasks.json"]
    assert (fresh / "results/suite.txt").is_file()  # built here, after the choice was written back
    assert (fresh / "results/ext/tasks.json").read_text() == "chosen\n"
    dry = run(["results/ext/v/lm_eval.json"], "-n")
    assert {line.split()[1].rstrip(":") for line in dry.stdout.splitlines() if line.startswith("rule ")} == \
        {"evaluate"}
    assert run(["results/ext/v/lm_eval.json"]).returncode == 0
    made = (fresh / "results/ext/v/lm_eval.json").stat().st_mtime
    assert stage.put_back_published(published, fresh, run) == []  # again: nothing to write, nothing redated
    assert (fresh / "results/ext/tasks.json").stat().st_mtime <= made
    assert run(["results/ext/v/lm_eval.json"], "-n").stdout.count("rule ") == 0

    other, run = checkout("other", "--config", "size=4")  # other tasks: refused, nothing written
    with pytest.raises(RawError, match="differs from the published"):
        stage.put_back_published(published, other, run)
    assert not (other / "results/ext/tasks.json").exists()
