"""`snakemake --lint`: only the kinds of warning docs/development.md explains (section "snakemake --lint") may appear,
as often as it says."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "development.md"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("snakemake") is None, reason="snakemake not installed")


def test_every_lint_warning_is_of_a_kind_the_docs_explain():
    out = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=ROOT, capture_output=True, text=True)
    kinds = Counter(m.group(1).rstrip(".:") for m in re.finditer(r"^\s*\* (.+?)(?: in line \d+)?:?$",
                                                                  out.stdout + out.stderr, re.M))
    assert kinds, out.stdout[-2000:] + out.stderr[-2000:]
    text = DOC.read_text()
    section = text[text.index("## `snakemake --lint`"):].split("\n## ", 1)[0]  # up to the next section
    explained = dict(re.findall(r"^- \*(.+?)\* \((\d+)\)", section, re.M))
    for kind, count in kinds.items():
        assert kind in explained, f"snakemake --lint warns '{kind}' ({count}x), which {DOC.name} does not explain"
        assert int(explained[kind]) == count, f"{DOC.name} says {explained[kind]} x '{kind}', lint finds {count}"
