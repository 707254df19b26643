"""Which code computed a result: the commit of the repository, marked when its tracked files differ from it. The
library's, the workflow's and analysis/'s one answer (``swiftkv.bench.provenance`` adds hardware, versions and dates
for a report). And on which CPU: its model name, the one answer of the benchmarks and of analysis.stage."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path


def git_commit(repo: str | Path = ".") -> str:
    """HEAD of the repository, with ``+dirty`` if tracked files other than the pipeline's own outputs (``reports/``,
    which a run rewrites) differ from it; ``unknown`` outside git."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)reports"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform.processor()`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
