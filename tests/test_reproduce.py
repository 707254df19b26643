"""Did it reproduce? (analysis.reproduce): a run's tables against the committed ones, cell by cell — exact for
accuracies and their intervals, within the stated tolerance for floating-point sums, in one screen."""

import csv
import json
import shutil
from pathlib import Path

import pytest

from analysis.reproduce import close, main, tolerant

REPO = Path(__file__).resolve().parents[1]


def edit(path: Path, row: int, column: str, value: str) -> None:
    rows = list(csv.reader(open(path, newline="")))
    rows[row][rows[0].index(column)] = value
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)


@pytest.fixture()
def roots(tmp_path):
    run, committed = tmp_path / "results/reports", tmp_path / "reports"
    run.mkdir(parents=True)
    committed.mkdir()
    for name in ("table2.csv", "seeds.csv"):
        shutil.copy(REPO / "reports" / name, committed / name)
        shutil.copy(REPO / "reports" / name, run / name)
    return run, committed


def check(roots, *tables):
    run, committed = roots
    return main([*tables, "--run", str(run), "--committed", str(committed)])


def test_the_committed_tables_reproduce_themselves(capsys):
    assert main(["--run", str(REPO / "reports"), "--committed", str(REPO / "reports")]) == 0
    out = capsys.readouterr().out
    assert "Table 2 reproduced: " in out and "Table B.1 reproduced: " in out and out.rstrip().endswith(
        "relative where fp32 summation order may differ)")
    assert "Table 3" not in out and "claims" not in out  # timings and derived verdicts: not cell by cell


def test_a_last_digit_of_a_float_sum_is_within_tolerance_but_not_of_an_accuracy(roots, capsys):
    run, _ = roots
    rows = list(csv.DictReader(open(run / "table2.csv")))
    i = [r["variant"] for r in rows].index("swiftkv-50")  # its line in the file: i + 1 (the header first)
    cells = len(rows) * len(rows[0])
    edit(run / "table2.csv", i + 1, "kl", f"{float(rows[i]['kl']) + 1e-4:.4f}")  # fp32 summation order: tolerated
    assert check(roots, "table2") == 0
    assert capsys.readouterr().out.startswith(f"Table 2 reproduced: {cells - 1}/{cells} cells identical, 1 within 1e-4")
    edit(run / "table2.csv", i + 1, "average_lo", f"{float(rows[i]['average_lo']) + 1e-4:.4f}")  # an accuracy: exact
    assert check(roots, "table2") == 1
    out = capsys.readouterr().out
    assert f"Table 2 differs: 1 of {cells} cells" in out and "smollm2-135m/swiftkv-50/native average_lo: committed" in out


def test_rows_and_columns_that_differ_are_named(roots, capsys):
    run, _ = roots
    lines = (run / "seeds.csv").read_text().splitlines()
    (run / "seeds.csv").write_text("\n".join(lines[:-1]) + "\n")  # a row short
    assert check(roots, "seeds") == 1
    rows = len(lines) - 1
    assert f"rows: {rows} committed, {rows - 1} in the run" in capsys.readouterr().out


def test_nothing_to_compare_or_another_profile_is_a_usage_error(tmp_path, roots, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--run", str(tmp_path / "empty"), "--committed", str(REPO / "reports")])
    assert exit_.value.code == 2 and "nothing to compare" in capsys.readouterr().err
    run, _ = roots
    (run / "raw" / "table2").mkdir(parents=True)
    (run / "raw" / "table2" / "manifest.json").write_text(json.dumps({"profile": "ci", "files": {}}))
    with pytest.raises(SystemExit) as exit_:
        check(roots, "table2")
    assert exit_.value.code == 2 and "is of the ci profile" in capsys.readouterr().err


def test_which_cells_may_differ_within_the_tolerance():
    assert tolerant("table2", "kl_hi", {}) and tolerant("seeds", "heldout_kl", {})
    assert not tolerant("table2", "average", {}) and not tolerant("table2", "delta_base_lo", {})
    assert not tolerant("table1", "total", {})
    assert not tolerant("budget_scaling", "estimate", {"metric": "accuracy_difference"})
    assert tolerant("budget_scaling", "estimate", {"metric": "kl"})
    assert not tolerant("table_long_context", "estimate", {"kind": "passkey"})
    assert tolerant("table_long_context", "key_logprob", {"kind": "passkey"})
    assert close("0.5640", "0.5641") and close("1234.5", "1234.6") and not close("0.5640", "0.5642")
    assert close("1.5e-05", "1.6e-05") and not close("abc", "abd") and not close("", "0.1")
