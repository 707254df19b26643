"""The distill stage of the DAG: the variants sheet is validated when the DAG is built (dry runs, no training)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("snakemake") is None, reason="snakemake not installed")


def dry_run(target: str | list[str], *configfiles: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    # --configfile takes a list
    targets = [target] if isinstance(target, str) else target
    cmd = [sys.executable, "-m", "snakemake", *targets, "-n", "--nolock", *flags, "--configfile", *configfiles]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def test_every_trainable_row_is_a_distill_job():
    out = dry_run("results/distill/summary.csv", "config/ci.yaml", flags=("--forceall",))
    assert out.returncode == 0, out.stderr
    rows = [r.split("\t") for r in (ROOT / "config/variants.tsv").read_text().splitlines()[1:]]
    chosen = set(yaml.safe_load((ROOT / "config/ci.yaml").read_text())["distill"]["rows"])  # the profile's rows
    expected = sum(1 for r in rows if r[0] == "smollm2-135m" and r[1] != "base" and r[1] in chosen)
    counts = {line.split()[0]: int(line.split()[1]) for line in out.stdout.splitlines()
              if len(line.split()) == 2 and line.split()[1].isdigit()}
    assert counts["distill_swiftkv"] == expected == 10
    # the default profile (no distill.rows) trains every row of the sheet
    full = dry_run("results/distill/summary.csv", "config/config.yaml", flags=("--forceall",))
    assert full.returncode == 0, full.stderr
    assert ["distill_swiftkv", "12"] in [line.split() for line in full.stdout.splitlines()], full.stdout[-2000:]


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("swiftkv-50-acrosskv-3\t15\t3", "swiftkv-50-acrosskv-3\t15\t4", "g=4 invalid for L=30"),
        ("swiftkv-25\t22\t1\t\tkl\tpartial\tyes", "swiftkv-25\t22\t1\t\tkl\tpartial\tmaybe", "'maybe' is not one of"),
        ("swiftkv-62\t11\t1\t\tkl", "swiftkv-62\t11\t1\t\tmse", "'mse' is not one of"),
    ],
)
def test_a_bad_sheet_stops_the_dag_with_a_clear_message(tmp_path, old, new, message):
    sheet = (ROOT / "config/variants.tsv").read_text()
    assert old in sheet
    (tmp_path / "v.tsv").write_text(sheet.replace(old, new))
    (tmp_path / "c.yaml").write_text(f"distill:\n  variants: {tmp_path / 'v.tsv'}\n")
    out = dry_run("results/distill/summary.csv", "config/ci.yaml", str(tmp_path / "c.yaml"))
    assert out.returncode != 0
    assert message in out.stdout + out.stderr


def test_distill_rule_passes_the_sheet_row_and_the_profile_budget():
    out = dry_run("results/checkpoints/smollm2-135m/swiftkv-50-mqa-1", "config/ci.yaml", flags=("-p", "--forceall"))
    assert out.returncode == 0, out.stderr
    cmd = next(line for line in out.stdout.splitlines() if " distill smollm2-135m" in line)
    for part in ("--name swiftkv-50-mqa-1 -l 15 -g 1 --kv-heads 1 --loss kl --scope partial ", "--model-id smollm2-135m",
                 "--tokens 512", "--max-length 256", "--resume", "-o results/checkpoints/smollm2-135m/swiftkv-50-mqa-1"):
        assert part in cmd, cmd
    assert "--variants" not in cmd and "--variant " not in cmd  # the library never reads the sheet


def test_every_distill_command_trains_exactly_its_sheet_row():
    """The sheet is read once, in the workflow (common.smk: student_args): the options every distillation job of the
    CI profile gets (tables, curve, seeds, lr sweep, budget scaling) build the same DistillSettings — hence the same
    checkpoint hash for --resume — as the CLI's own reading of that row with --variant."""
    import shlex

    from swiftkv.cli import build_parser
    from swiftkv.cli.distill import distill_settings

    out = dry_run("results/reports/report.html", "config/ci.yaml", flags=("-p", "--forceall", "--cores", "2"))
    assert out.returncode == 0, out.stderr
    cmds = [shlex.split(line.split(">")[0]) for line in out.stdout.splitlines()
            if line.lstrip().startswith(("swiftkv distill ", "Shell command: swiftkv distill "))]
    assert len(cmds) >= 18, len(cmds)
    parser = build_parser()
    for cmd in cmds:
        argv = cmd[cmd.index("distill"):]
        args = parser.parse_args(argv)
        assert args.name and args.variant is None, argv
        by_sheet = parser.parse_args([*argv, "--variant", args.name])
        for flag in ("num_key_value_layers", "key_value_group_size", "kv_heads", "loss", "scope", "no_train"):
            setattr(by_sheet, flag, None if flag != "no_train" else False)
        by_sheet.loss_positions = args.loss_positions  # a budget-scaling recipe option, not a sheet column
        assert distill_settings(args) == distill_settings(by_sheet), argv


@pytest.mark.parametrize("flag", ["--unlock", "--list-rules"])
def test_housekeeping_commands_need_no_cores(flag):
    """`snakemake --unlock` (after a killed run) and `--list-rules` work without --cores: the rules that take every
    core read it through ALL_CORES, which is 1 when no core count was given (no job runs then)."""
    out = subprocess.run([sys.executable, "-m", "snakemake", flag], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "WorkflowError" not in out.stderr


def _distill_threads(*configfiles: str, cores: int) -> set[str]:
    cmd = [sys.executable, "-m", "snakemake", "results/distill/summary.csv", "-n", "-p", "--nolock", "--forceall",
           "--cores", str(cores)]
    if configfiles:
        cmd += ["--configfile", *configfiles]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return {line.split("--threads ")[1].split()[0] for line in out.stdout.splitlines()
            if " distill " in line and "--name " in line and "--threads " in line}


def test_distill_threads_per_job(tmp_path):
    """distill.threads_per_job: null (every core, one job at a time) in the default and paper profiles; a profile
    may set it (1: one-thread jobs side by side), capped at the cores given."""
    assert _distill_threads(cores=4) == {"4"}
    assert _distill_threads("config/paper.yaml", cores=4) == {"4"}
    (tmp_path / "side.yaml").write_text("distill:\n  threads_per_job: 1\n")
    assert _distill_threads(str(tmp_path / "side.yaml"), cores=4) == {"1"}
    (tmp_path / "many.yaml").write_text("distill:\n  threads_per_job: 16\n")
    assert _distill_threads(str(tmp_path / "many.yaml"), cores=4) == {"4"}


def test_the_paper_profile_sets_the_process_count_the_launcher_and_the_trainer_check():
    """config/paper.yaml: the distillation job's GPUs (resources.distill.gpu, 8 without a profile that caps them)
    reach accelerate's --num_processes and distill's --processes (which refuses a launcher that started fewer);
    --batch-size is the global batch (one row per GPU); no --strategy, so swiftkv distill's default (ddp)."""
    cmd = [sys.executable, "-m", "snakemake", "results/distill/summary.csv", "-n", "-p", "--nolock", "--forceall",
           "--cores", "4", "--configfile", "config/paper.yaml"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if " distill " in line and "--name " in line]
    assert lines
    for line in lines:
        assert "accelerate launch --config_file config/accelerate/paper.yaml --num_processes 8 -m swiftkv.cli" in line
        assert "--batch-size 8 " in line and "--processes 8" in line and "--strategy" not in line


def test_the_default_profile_trains_five_seeds_and_five_cuts():
    """The power run's settings (the registry's power_run), folded into the default profile once its raw folders were
    published: Table 2 has five trained cuts (l = 26, 22, 19, 15, 11), and every compared trained row is distilled
    with seeds 0-4."""
    rows = [r.split("\t") for r in (ROOT / "config/variants.tsv").read_text().splitlines()[1:]]
    cuts = sorted({int(r[2]) for r in rows if r[0] == "smollm2-135m" and r[7] == "yes" and "table2" in r[10]
                   and r[3] == "1"})
    assert cuts == [11, 15, 19, 22, 26]
    out = dry_run(["results/reports/raw/seeds", "results/reports/raw/table2"], "config/config.yaml",
                  flags=("--forceall",))
    assert out.returncode == 0, out.stderr
    counts = {line.split()[0]: int(line.split()[1]) for line in out.stdout.splitlines()
              if len(line.split()) == 2 and line.split()[1].isdigit()}
    assert counts["distill_swiftkv"] == 12 and counts["distill_swiftkv_seed"] == 9 * 4
    assert counts["build_teacher_cache"] == 5
