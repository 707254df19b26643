"""Where a set of results came from: commit, profile, hardware, library versions, date (for reports/report.html)."""

from __future__ import annotations

import datetime
import importlib.metadata
import sys
from pathlib import Path

from swiftkv.provenance import git_commit

PACKAGES = ("torch", "transformers", "accelerate", "lm_eval", "snakemake", "pandas", "matplotlib", "scipy")


def versions(packages=PACKAGES) -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def provenance(profile: str, config_hash: str, repo: str | Path = ".", extra: dict | None = None,
               benchmarks: str | Path = "benchmarks") -> dict:
    """One flat dict, in the order a reader wants it; ends with the run's job wall time (``job_times(benchmarks)``)."""
    from swiftkv.bench.serving.run import machine

    hw = machine("cuda" if _cuda() else "cpu")
    info = {
        "date (UTC)": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "git commit": git_commit(repo),
        "config profile": profile,
        "config hash (sha256 of the resolved config, 12 hex)": config_hash,
        "hardware (report host)": hw["label"],
        "platform": hw["platform"],
    }
    info.update({f"version: {k}": v for k, v in versions().items()})
    info.update(extra or {})
    info["job wall time (benchmarks/, summed per rule)"] = job_times(benchmarks)
    return info


def artifact_dates(directory: str | Path, skip: tuple[str, ...] = ("provenance.json",)) -> dict[str, str]:
    """When each file of a reports directory was last written (UTC, to the minute): committed outputs can come from
    more than one run of the DAG, and this says which file is from when (the run's logs and benchmarks/ say more)."""
    out = {}
    for path in sorted(Path(directory).iterdir()):
        if path.is_file() and path.name not in skip:
            stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
            out[path.name] = stamp.strftime("%Y-%m-%d %H:%M")
    return out


def job_times(benchmarks: str | Path) -> dict[str, float]:
    """Wall time of the run's expensive jobs, summed per rule from Snakemake's ``benchmark:`` files
    (``benchmarks/{rule}/.../*.tsv``, first column ``s``, last line = last repeat): how long the profile took on this
    machine even when it was built over several invocations. Jobs without a ``benchmark:`` (tables, plots) are a
    few seconds each and not counted."""
    per_rule: dict[str, float] = {}
    jobs = 0
    root = Path(benchmarks)
    for tsv in sorted(root.rglob("*.tsv")):
        lines = [ln for ln in tsv.read_text().splitlines() if ln.strip()]
        if len(lines) < 2 or not lines[0].startswith("s\t"):
            continue
        rule = tsv.relative_to(root).parts[0]
        per_rule[rule] = per_rule.get(rule, 0.0) + float(lines[-1].split("\t")[0])
        jobs += 1
    out = {"jobs timed": jobs, "total (h)": round(sum(per_rule.values()) / 3600, 2)}
    out.update({f"{rule} (min)": round(sec / 60, 1) for rule, sec in sorted(per_rule.items())})
    return out


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
