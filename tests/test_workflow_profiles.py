"""The Snakemake profiles under workflow/profiles/ (dry runs on a CPU, no hub): each pairs with config/paper.yaml, the
paper's DAG builds under each, every job that runs a model declares its GPUs (config resources), the distillation
launches one process per GPU it was given, GPU profiles never build the CPU vLLM venv, and the default profile asks
for no GPU."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "workflow" / "profiles"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("snakemake") is None, reason="snakemake not installed")
SLURM_PLUGIN = importlib.util.find_spec("snakemake_executor_plugin_slurm") is not None
REPORT = "results/reports/report.html"
# GPUs of each machine profile (the slurm profile declares none: each job asks Slurm for its own)
GPUS = {"gpu-1": 1, "gpu-node-8": 8}
# A command that loads a model's weights: the swiftkv subcommands that run one (directly or under accelerate).
MODEL_COMMAND = re.compile(r"(?:^|\s)(?:swiftkv|-m swiftkv\.cli) (?:simscore|teacher-cache|distill|eval|advise|"
                           r"long-context|convert|prepare-model|fidelity-teacher|bench (?:prefill|distill|serve|served-fidelity))\s")


@dataclass
class Job:
    rule: str
    output: str = ""
    resources: dict[str, str] = field(default_factory=dict)
    shell: str = ""


def parse_jobs(stdout: str) -> list[Job]:
    """The jobs of a `snakemake -n -p` listing: rule, outputs, resources and shell command of each."""
    jobs: list[Job] = []
    for line in stdout.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):$", line):
            jobs.append(Job(m[1]))
        elif jobs and (m := re.match(r"^    output: (.*)$", line)):
            jobs[-1].output = m[1]
        elif jobs and (m := re.match(r"^    resources: (.*)$", line)):
            jobs[-1].resources = dict(kv.split("=", 1) for kv in m[1].split(", "))
        elif jobs and line.startswith("Shell command: "):
            jobs[-1].shell = line.removeprefix("Shell command: ")
    return jobs


def model_jobs_without_gpu(jobs: list[Job]) -> list[str]:
    """The rules of the jobs that run a model and do not say how many GPUs they need."""
    return sorted({j.rule for j in jobs if MODEL_COMMAND.search(j.shell) and "gpu" not in j.resources})


@functools.cache
def dry_run(*args: str) -> tuple[int, str, str]:
    """`snakemake -n -p --forceall` with ``args`` (cached: several tests read one run), offline."""
    cmd = [sys.executable, "-m", "snakemake", "-n", "-p", "--forceall", "--nolock", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    return out.returncode, out.stdout, out.stderr


def profile_run(name: str, *targets: str) -> list[Job]:
    """The paper DAG's jobs under a profile. Without snakemake-executor-plugin-slurm (not a dependency of swiftkv:
    CI does not install it) Snakemake refuses `executor: slurm`; the slurm profile's DAG and resources are then read
    with the local executor (test_slurm_profile_with_its_plugin runs it as written where the plugin is installed)."""
    override = ("--executor", "local") if name == "slurm" and not SLURM_PLUGIN else ()
    rc, stdout, stderr = dry_run(*(targets or (REPORT,)), "--configfile", "config/paper.yaml", "--profile",
                                 str(PROFILES.relative_to(ROOT) / name), *override)
    assert rc == 0, stderr[-3000:]
    return parse_jobs(stdout)


def plain_run(*args: str) -> list[Job]:
    rc, stdout, stderr = dry_run("--cores", "2", *args)
    assert rc == 0, stderr[-3000:]
    return parse_jobs(stdout)


# The report DAG of each config profile (and the CI profile's distillation benchmark, the one model rule outside it)
RUNS = {
    "default": (REPORT,),
    "ci": (REPORT, "results/bench/distill/smollm2-135m.json", "--configfile", "config/ci.yaml"),
    "paper": (REPORT, "--configfile", "config/paper.yaml"),
}


def counts(jobs: list[Job]) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in jobs:
        out[j.rule] = out.get(j.rule, 0) + 1
    return out


def num_processes(job: Job) -> int | None:
    m = re.search(r"--num_processes (\d+)", job.shell)
    return int(m[1]) if m else None


@pytest.mark.parametrize("name", ["gpu-1", "gpu-node-8", "slurm"])
def test_each_profile_pairs_with_the_paper_config(name):
    profile = yaml.safe_load((PROFILES / name / "config.yaml").read_text())
    assert profile["configfile"] == "config/paper.yaml"
    if name in GPUS:
        assert profile["resources"] == [f"gpu={GPUS[name]}"]
        assert "executor" not in profile
    else:
        assert profile["executor"] == "slurm"
        assert {"slurm_account", "slurm_partition", "gpu", "mem_mb", "runtime"} <= set(profile["default-resources"])


@pytest.mark.parametrize("name", ["gpu-1", "gpu-node-8", "slurm"])
def test_the_paper_dag_under_each_profile(name):
    """The same jobs as the paper profile without a Snakemake profile; the distillation launches one accelerate process
    per GPU it holds (1 on the workstation, 8 on a node or a Slurm job); no job holds more GPUs than the machine has;
    nothing is rendered over the committed reports/; the CPU vLLM venv is never built."""
    jobs = profile_run(name)
    assert counts(jobs) == counts(plain_run(*RUNS["paper"]))
    distill = [j for j in jobs if j.rule.startswith("distill_")]
    assert distill, "the paper DAG has no distillation"
    expected = GPUS.get(name, 8)
    for job in distill:
        assert num_processes(job) == int(job.resources["gpu"]) == expected, (job.rule, job.shell)
        assert " --micro-batch-size 1 " in job.shell  # the paper's 8-row step on any number of GPUs
    if name in GPUS:
        assert max(int(j.resources.get("gpu", 0)) for j in jobs) == GPUS[name]
    else:
        assert all(j.resources["slurm_account"] == "your-account" for j in jobs)  # the profile's placeholder
    assert not any(j.output.startswith("reports/") or ", reports/" in j.output for j in jobs)
    assert "setup_vllm_cpu" not in counts(jobs) and "bin/vllm-env" not in " ".join(j.shell for j in jobs)
    assert counts(jobs)["record_vllm_gpu"] == 1


@pytest.mark.skipif(not SLURM_PLUGIN, reason="snakemake-executor-plugin-slurm is not installed (pip install "
                    "snakemake-executor-plugin-slurm): the slurm profile's DAG is checked with the local executor")
def test_slurm_profile_with_its_plugin():
    rc, stdout, stderr = dry_run(REPORT, "--profile", "workflow/profiles/slurm")
    assert rc == 0, stderr[-3000:]
    jobs = parse_jobs(stdout)
    assert {j.resources["slurm_partition"] for j in jobs} == {"your-partition"}
    assert {int(j.resources["gpu"]) for j in jobs if j.rule == "distill_swiftkv"} == {8}


@pytest.mark.parametrize("profile", ["default", "ci", "paper"])
def test_every_job_that_runs_a_model_declares_its_gpus(profile):
    """Every rule whose command loads a model declares `gpu` (config resources), in every profile's report DAG (the
    three together hold every rule of the workflow that runs a model)."""
    jobs = plain_run(*RUNS[profile])
    runs_a_model = {j.rule for j in jobs if MODEL_COMMAND.search(j.shell)}
    assert {"distill_swiftkv", "eval_swiftkv", "fidelity_teacher", "heldout_swiftkv", "compute_simscore",
            "bench_serve"} <= runs_a_model
    assert not runs_a_model & {"compute_flops", "make_table", "render_report", "raw_table"}
    assert model_jobs_without_gpu(jobs) == []


def test_the_gpu_check_finds_a_model_job_without_gpu():
    jobs = parse_jobs("rule eval_swiftkv:\n    output: results/eval/x.json\n    resources: tmpdir=/tmp, mem_mb=4000\n"
                      "Shell command: swiftkv eval m --kv-cache native > log 2>&1\n\n"
                      "rule distill_swiftkv:\n    resources: tmpdir=/tmp, gpu=8\n"
                      "Shell command: accelerate launch --num_processes 8 -m swiftkv.cli distill m -o x\n\n"
                      "rule make_table1:\n    resources: tmpdir=/tmp\n\n"
                      "rule compute_flops:\n    resources: tmpdir=/tmp\nShell command: swiftkv flops m > x\n")
    assert [j.rule for j in jobs] == ["eval_swiftkv", "distill_swiftkv", "make_table1", "compute_flops"]
    assert model_jobs_without_gpu(jobs) == ["eval_swiftkv"]


def test_the_default_profile_asks_for_no_gpu_and_runs_as_before():
    """The CPU profiles: every job 0 GPUs, one plain `swiftkv distill` process (no accelerate, no --strategy), the
    CPU vLLM venv where they serve with it."""
    for profile in ("default", "ci"):
        jobs = plain_run(*RUNS[profile])
        assert {int(j.resources.get("gpu", 0)) for j in jobs} == {0}
        distill = [j.shell for j in jobs if j.rule.startswith("distill_")]
        assert distill and all(s.startswith("swiftkv distill ") for s in distill)
        assert not any("--num_processes" in s or "--strategy" in s or "--micro-batch-size" in s for s in distill)
        assert counts(jobs)["setup_vllm_cpu"] == 1 and "record_vllm_gpu" not in counts(jobs)


def test_the_distillation_follows_the_gpus_it_is_given_and_forwards_a_strategy(tmp_path):
    """Without a Snakemake profile the paper's distillation takes its config's 8 GPUs (a profile caps them: above);
    a config that names distill.strategy has it passed to swiftkv distill, one that names none (the paper's) not."""
    distill = [j for j in plain_run(*RUNS["paper"]) if j.rule == "distill_swiftkv"]
    assert distill and {num_processes(j) for j in distill} == {8}
    assert not any("--strategy" in j.shell for j in distill)
    (tmp_path / "fsdp.yaml").write_text("distill:\n  strategy: fsdp\n")
    (job,) = [j for j in plain_run("results/checkpoints/llama-3.1-8b-instruct/swiftkv-50", "--configfile",
                                   "config/paper.yaml", str(tmp_path / "fsdp.yaml")) if j.rule == "distill_swiftkv"]
    assert " --strategy fsdp " in job.shell and num_processes(job) == 8


def test_a_bad_resources_entry_stops_the_dag_with_one_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("resources:\n  distill: {gpu: -1, mem_mb: 1000, runtime: 10}\n")
    rc, _, stderr = dry_run("results/distill/summary.csv", "--configfile", str(tmp_path / "bad.yaml"))
    assert rc != 0
    assert "error: config (resources.distill.gpu): -1 is less than the minimum of 0" in stderr
