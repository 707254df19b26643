"""The eval stage of the DAG (dry runs): every table row is one evaluation job, Table B.1 adds the FP8 rows, the
selection split feeds the reported task list, the paper profile runs the configured lm-eval tasks instead."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("snakemake") is None, reason="snakemake not installed")
TABLES = [f"results/reports/{t}.csv" for t in ("table2", "table4a", "table4b", "tableB1", "tableB2")]


def dry_run(targets: list[str], *configfiles: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", *targets, "-n", "--nolock", "--forceall", *flags]
    if configfiles:
        cmd += ["--configfile", *configfiles]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def job_counts(stdout: str) -> dict[str, int]:
    return {line.split()[0]: int(line.split()[1]) for line in stdout.splitlines()
            if len(line.split()) == 2 and line.split()[1].isdigit()}


# The CI profile runs the sheet's rows its distill.rows names (workflow/rules/common.smk, profile_rows)
CI_ROWS = set(yaml.safe_load((ROOT / "config/ci.yaml").read_text())["distill"]["rows"])


def sheet_rows(table: str) -> list[str]:
    """The CI profile's rows of ``table``."""
    rows = [r.split("\t") for r in (ROOT / "config/variants.tsv").read_text().splitlines()[1:]]
    return [r[1] for r in rows if r[0] == "smollm2-135m" and table in r[-1].split(",") and r[1] in CI_ROWS]


def test_all_five_tables_in_the_ci_profile():
    out = dry_run(TABLES, "config/ci.yaml")
    assert out.returncode == 0, out.stderr
    counts = job_counts(out.stdout)
    native = {v for t in ("table2", "table4a", "table4b", "tableB1", "tableB2") for v in sheet_rows(t)}
    # + the FP8 rows of Table B.1; the base model's native and FP8 evaluations also record the boundary states
    assert counts["eval_base_boundary"] == 2
    assert counts["eval_swiftkv"] + 2 == len(native) + len(sheet_rows("tableB1"))
    # each row's held-out measures in their own job; the base model's also record its states of the bits-per-byte task
    assert counts["heldout_base_boundary"] == 2 and counts["heldout_swiftkv"] == counts["eval_swiftkv"]
    assert counts["fidelity_teacher"] == 1  # the teacher's side of the fidelity measure: once for the model
    assert counts["make_table"] == counts["raw_table"] == 5  # each table from its own raw folder
    assert counts["eval_selection_split"] == counts["select_bigbench_tasks"] == 1


def test_students_take_the_base_models_boundary_states():
    """eval.boundary_states: the base model's native evaluation records the stream at every cut of the sheet's
    SwiftKV rows; each student's native evaluation (the tables' and the seeds study's) reads it; the base model's FP8
    evaluation records the cut of Table B.1's FP8 students, which their FP8 evaluations read; with the key off no job
    does either."""
    out = dry_run(TABLES + ["results/reports/raw/seeds"], "config/ci.yaml", flags=("-p", "--forceall"))
    assert out.returncode == 0, out.stderr
    evals = [line for line in out.stdout.splitlines() if "swiftkv eval" in line and "--tasks-json" in line
             and "/selection" not in line]
    rows = [r.split("\t") for r in (ROOT / "config/variants.tsv").read_text().splitlines()[1:]]
    cuts = sorted({int(r[2]) for r in rows if r[0] == "smollm2-135m" and r[1] != "base" and r[1] in CI_ROWS})
    base = [line for line in evals if "--output-dir results/eval/smollm2-135m/base/native" in line]
    assert len(base) == 1 and ("--save-boundary results/boundary/smollm2-135m/base/native --boundary-layers "
                               + " ".join(map(str, cuts))) in base[0]
    students = [line for line in evals if "--kv-cache native" in line and line not in base]
    assert students and any("results/seeds/" in line for line in students)
    assert all("--boundary results/boundary/smollm2-135m/base/native " in line for line in students)
    fp8_base = [line for line in evals if "--output-dir results/eval/smollm2-135m/base/fp8" in line]
    fp8_cuts = sorted({int(r[2]) for r in rows if r[0] == "smollm2-135m" and r[1] != "base" and r[1] in CI_ROWS
                       and "tableB1" in r[-1].split(",")})
    assert len(fp8_base) == 1 and ("--save-boundary results/boundary/smollm2-135m/base/fp8 --boundary-layers "
                                   + " ".join(map(str, fp8_cuts))) in fp8_base[0]
    fp8_students = [line for line in evals if "--kv-cache fp8" in line and line not in fp8_base]
    assert len(fp8_students) == len(sheet_rows("tableB1")) - 1
    assert all("--boundary results/boundary/smollm2-135m/base/fp8 " in line for line in fp8_students)
    off = dry_run(TABLES, "config/ci.yaml", flags=("-p", "--forceall", "--config", "eval={'boundary_states': False}"))
    assert off.returncode == 0, off.stderr
    assert "-boundary" not in off.stdout and "eval_base_boundary" not in job_counts(off.stdout)
    assert "eval_swiftkv" in job_counts(off.stdout)


def test_students_heldout_bits_per_byte_take_the_base_models_boundary_states():
    """The held-out bits per byte too: the base model's held-out job records the states of that task at the cuts and
    caches its evaluation records them at, each student's held-out job reads them; the seeds study's fidelity-only
    jobs (no task) take none; with the key off no held-out job does either."""
    out = dry_run(TABLES + ["results/reports/raw/seeds"], "config/ci.yaml", flags=("-p", "--forceall"))
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if "swiftkv eval" in line and "--heldout " in line]
    ppl = [line for line in lines if "--task sharegpt_heldout_ppl" in line]
    rows = [r.split("\t") for r in (ROOT / "config/variants.tsv").read_text().splitlines()[1:]]
    mine = [r for r in rows if r[0] == "smollm2-135m" and r[1] != "base" and r[1] in CI_ROWS]
    for kv, cuts in (("native", {int(r[2]) for r in mine}),
                     ("fp8", {int(r[2]) for r in mine if "tableB1" in r[-1].split(",")})):
        base = [line for line in ppl if f"--output-dir results/eval/smollm2-135m/base/{kv} " in line]
        assert len(base) == 1 and (f"--save-boundary results/boundary-heldout/smollm2-135m/base/{kv} "
                                   f"--boundary-layers {' '.join(map(str, sorted(cuts)))} ") in base[0]
        students = [line for line in ppl if f"--kv-cache {kv} " in line and line not in base]
        assert students and all(f"--boundary results/boundary-heldout/smollm2-135m/base/{kv} " in line
                                for line in students)
    fidelity_only = [line for line in lines if "sharegpt_heldout_ppl" not in line]
    assert fidelity_only and not any("boundary" in line for line in fidelity_only)
    off = dry_run(TABLES, "config/ci.yaml", flags=("-p", "--forceall", "--config", "eval={'boundary_states': False}"))
    assert off.returncode == 0, off.stderr
    assert "-boundary" not in off.stdout and "heldout_base_boundary" not in job_counts(off.stdout)
    assert "heldout_swiftkv" in job_counts(off.stdout)


def test_boundary_states_for_a_model_without_students_are_refused(tmp_path):
    sheet = tmp_path / "variants.tsv"
    rows = (ROOT / "config/variants.tsv").read_text().splitlines()
    sheet.write_text("\n".join([rows[0]] + [r for r in rows[1:] if r.split("\t")[1] == "base"]) + "\n")
    out = dry_run(TABLES, "config/ci.yaml", flags=("--config", f"distill={{'variants': '{sheet}', 'rows': ['base']}}"))
    assert out.returncode == 2 and "eval.boundary_states: smollm2-135m has no SwiftKV rows" in out.stderr


def test_eval_jobs_wire_checkpoint_tasks_and_cache():
    out = dry_run(["results/eval/smollm2-135m/swiftkv-50-acrosskv-3/fp8/lm_eval.json",
                   "results/eval/smollm2-135m/swiftkv-50-acrosskv-3/fp8/heldout.json"], "config/ci.yaml", flags=("-p",))
    assert out.returncode == 0, out.stderr
    cmds = [line for line in out.stdout.splitlines() if "swiftkv eval results/" in line]
    tasks = next(c for c in cmds if "--tasks-json" in c)
    heldout = next(c for c in cmds if "--lm-eval-name heldout.json" in c)
    for part in ("swiftkv eval results/checkpoints/smollm2-135m/swiftkv-50-acrosskv-3", "--kv-cache fp8",
                 "--base smollm2-135m"):
        assert part in tasks and part in heldout, (tasks, heldout)
    for part in ("--tasks-json results/eval/smollm2-135m/tasks.json", "--include-path results/tasks/bigbench/report",
                 "--no-fidelity"):
        assert part in tasks and part not in heldout, (tasks, heldout)
    for part in ("--task sharegpt_heldout_ppl", "--fidelity-sequences 2",
                 "--heldout results/tasks/heldout-ppl/smollm2-135m/conversations.jsonl",
                 "--fidelity-teacher results/fidelity_teacher/smollm2-135m"):
        assert part in heldout and part not in tasks, (tasks, heldout)
    teacher = next(line for line in out.stdout.splitlines() if "swiftkv fidelity-teacher" in line)
    fidelity_options = heldout[heldout.index("--fidelity-sequences"):heldout.index(" --fidelity-teacher")]
    assert fidelity_options in teacher and "-o results/fidelity_teacher/smollm2-135m" in teacher  # the same settings


def test_the_default_profile_reads_the_committed_selection_run():
    """The main job re-derives the suite from the committed selection run (eval.bigbench.selection_from) instead of
    the base model's ~18-minute run; with selection_from null it runs the selection, as the CI profile does."""
    out = dry_run(["results/reports/table2.csv"], flags=("-p",))
    assert out.returncode == 0, out.stderr
    counts = job_counts(out.stdout)
    assert counts["committed_selection_run"] == counts["select_bigbench_tasks"] == 1
    assert "eval_selection_split" not in counts
    assert "reports/raw/suite/eval/smollm2-135m/selection/lm_eval.json.gz" in out.stdout


def test_paper_profile_uses_the_papers_tasks():
    out = dry_run(["results/reports/table2.csv"], "config/paper.yaml")
    assert out.returncode == 0, out.stderr
    counts = job_counts(out.stdout)
    assert "write_eval_tasks" in counts and "eval_selection_split" not in counts


def test_each_task_list_is_extracted_into_its_own_folder():
    """resources/ is shared by the profiles (and CI's scratch clones link it): the CI profile's extraction must never
    stand in for the default profile's longer list (it did: the default run then missed a task file)."""
    import yaml

    from swiftkv.data.bigbench import tasks_dir

    lists = {name: yaml.safe_load((ROOT / "config" / f"{name}.yaml").read_text())["eval"]["bigbench"]["candidates"]
             for name in ("config", "ci")}
    assert set(lists["config"]) != set(lists["ci"])
    assert tasks_dir(lists["config"]) != tasks_dir(lists["ci"])
    assert tasks_dir(list(reversed(lists["ci"]))) == tasks_dir(lists["ci"])  # the list, not its order
    for name, configfiles in (("config", ()), ("ci", ("config/ci.yaml",))):
        out = dry_run(["results/tasks/bigbench"], *configfiles, flags=("-p",))
        assert out.returncode == 0, out.stderr
        assert f"--output {tasks_dir(lists[name])}" in out.stdout and f"--tasks-dir {tasks_dir(lists[name])}" in out.stdout
