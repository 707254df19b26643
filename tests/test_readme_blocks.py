"""The README's measured numbers are generated (analysis.readme), never typed: every block equals what the committed
reports give, and the generators read what they should."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.readme import BLOCKS, forward_time_markdown, main, regenerate, replace_block, simscore_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_every_readme_block_is_what_the_committed_reports_give():
    readme = (ROOT / "README.md").read_text()
    for name in BLOCKS:
        assert f"<!-- generated: {name} " in readme and f"<!-- end: {name} -->" in readme, name
    assert regenerate(readme, ROOT / "reports") == readme, "stale README blocks: run python -m analysis.readme README.md"


def test_replace_block_needs_its_markers_once_and_in_order():
    start, end = "<!-- generated: x (python -m analysis.readme README.md); do not edit -->", "<!-- end: x -->"
    assert replace_block(f"a {start}old{end} b", "x", "new") == f"a {start}\nnew\n{end} b"
    for text in ("no markers", f"{end} {start}", f"{start}{end}{start}{end}"):
        with pytest.raises(ValueError, match="markers once each"):
            replace_block(text, "x", "new")


def test_the_cli_checks_rewrites_and_reports_a_missing_block_in_one_line(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("no blocks here\n")
    assert main([str(readme), "--reports", str(ROOT / "reports")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: the README must hold block") and "\n" not in err
    assert readme.read_text() == "no blocks here\n"  # nothing written
    stale = (ROOT / "README.md").read_text().replace("<!-- end: simscore -->", "typed by hand\n<!-- end: simscore -->")
    readme.write_text(stale)
    assert main([str(readme), "--reports", str(ROOT / "reports"), "--check"]) == 1 and readme.read_text() == stale
    assert main([str(readme), "--reports", str(ROOT / "reports")]) == 0
    assert readme.read_text() == (ROOT / "README.md").read_text()


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
