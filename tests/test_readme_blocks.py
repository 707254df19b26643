"""The measured numbers live in a generated page (reports/README.md, analysis.readme), never in the project's
README.md: the committed page is what the committed reports give, every section is there, and README.md holds no
number that a run could move."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from analysis.readme import (DEFAULT_TITLE, SECTIONS, default_labels, forward_time_markdown, main, results_page,
                             simscore_markdown)

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_page_is_what_the_committed_reports_give_with_every_section():
    page = (ROOT / "reports" / "README.md").read_text()
    assert results_page(ROOT / "reports", DEFAULT_TITLE, default_labels(ROOT)) == page
    for name, title, _, _ in SECTIONS:  # the default profile runs every study
        assert f"\n## {title}\n" in page, name


def test_a_root_without_a_study_has_no_section_for_it(tmp_path):
    for name in ("claims.csv", "table2.csv"):
        (tmp_path / name).write_bytes((ROOT / "reports" / name).read_bytes())
    page = results_page(tmp_path, "t", default_labels(ROOT))
    assert page.startswith("# t\n") and "## Table 2: accuracy" in page
    assert "## Training seeds" not in page and "## Serving" not in page and "Δ vs base, mean over seeds" not in page


def test_the_cli_checks_rewrites_and_reports_a_missing_root_in_one_line(tmp_path, capsys):
    assert main(["--reports", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {tmp_path}/claims.csv not found") and "\n" not in err
    assert not (tmp_path / "README.md").exists()  # nothing written
    assert main(["--reports", str(ROOT / "reports"), "--check"]) == 0


def test_the_project_readme_holds_no_measured_number_no_commit_and_no_issue():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "<!-- generated" not in text
    assert not re.search(r"\b[0-9a-f]{7,40}\b", text), "a commit hash in README.md"
    assert not re.search(r"\bissue \d+", text, re.IGNORECASE), "an issue number in README.md"
    assert not re.search(r"\d+(\.\d+)? ?(min|s)\b", text), "a timing in README.md (they go in notes and reports)"
    assert "reports/README.md" in text  # where the numbers are


def test_forward_time_and_simscore_tables():
    rows = [("base", 30, 1.0, 1.0, 2.0), ("swiftkv-l15", 15, 0.5, 1.9, 1.05), ("swiftkv-l8", 8, 0.3, 3.3, 0.6)]
    df = pd.DataFrame([{"model": "m", "prefill_tokens": 2048, "variant": v, "num_key_value_layers": l,
                        "num_hidden_layers": 30, "predicted_ratio": p, "paired_speedup_median": s, "median_s": t}
                       for v, l, p, s, t in rows])
    md = forward_time_markdown(df)
    assert "| model | prompt tokens | base | l = 15 of 30 | l = 8 of 30 |" in md
    assert "| m | 2048 | 2 s | 1.05 s, 1.90x (FLOPs 2.00x) | 0.6 s, 3.30x (FLOPs 3.33x) |" in md
    crossings = pd.DataFrame([{"model": "m", "metric": "cosine", "num_layers": 30, "crossing_layer": 1,
                               "simscore_at_half": 0.66, "ci_low_at_half": 0.65, "ci_high_at_half": 0.67},
                              {"model": "m", "metric": "centred", "num_layers": 30, "crossing_layer": float("nan"),
                               "simscore_at_half": 0.2, "ci_low_at_half": 0.1, "ci_high_at_half": 0.3}])
    md = simscore_markdown(crossings)
    assert "| m | 30 | 1 | 0.660 [0.650, 0.670] | never | 0.200 [0.100, 0.300] |" in md
