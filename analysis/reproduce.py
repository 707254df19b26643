"""Did it reproduce? A run's tables (``results/reports/<table>.csv``) against the committed ones
(``reports/<table>.csv``), cell by cell, in one screen (docs/reproducing.md).

    python -m analysis.reproduce [TABLE...]   # default: every table the run has that is committed too

Exit status: 0 every compared table reproduced, 1 a cell (or a row or column) differs, 2 nothing to compare or a run
of another profile.

How cells compare: as written, except numbers that come out of floating-point sums in the models (KL, top-1 and
greedy agreement, bits per byte, SimScore, log-likelihoods, trained and untrained KL of the advisor, ...), whose last
digits depend on the machine's summation order: those agree when within ``RTOL`` of each other (relative) or one
unit of the last digit the table prints. Accuracies, their intervals and counts, and everything computed from the
models' configurations alone (Table 1, KV memory) must be identical. Tables that time the machine (serving
throughput and latency: Table 3, Table A.3) are not compared: their verdicts are in claims.csv.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from analysis.raw import COMMITTED, DEFAULT_PROFILE, MANIFEST, RUN, TABLE_RAW, read_manifest

RTOL, RTOL_TEXT = 1e-4, "1e-4"
TIMED = ("table3", "tableA3")  # measurements of the machine's speed: compared through their verdicts, not cell by cell
NOT_TABLES = ("claims",)  # derived from the tables (compared through them)
EXACT_TABLES = ("table1", "table_kv_memory")  # from model configurations alone
ACCURACY_TABLES = ("table2", "table4a", "table4b", "tableB1", "tableB2", "seeds")
FLOAT_COLUMN = re.compile(r"^(bpb|kl|top1|greedy|heldout_kl)")  # accuracy tables: the fidelity and bits-per-byte
MAX_LISTED = 8  # differing cells listed per table


def tolerant(table: str, column: str, row: dict) -> bool:
    """Whether a cell may differ within the tolerance (a floating-point sum) or must be identical."""
    if table in EXACT_TABLES:
        return False
    if table in ACCURACY_TABLES:
        return bool(FLOAT_COLUMN.match(column))
    if table == "budget_scaling":
        return not str(row.get("metric", "")).startswith("accuracy")
    if table == "table_long_context" and row.get("kind") == "passkey":
        return column == "key_logprob"  # the passkey's reading is an accuracy; its log-probability a sum
    return True


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _last_digit(text: str) -> float:
    """One unit of the last digit ``text`` shows (``0.5640`` -> 1e-4; ``12`` -> 1)."""
    mantissa = text.lower().split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(text.lower().split("e")[1]) if "e" in text.lower() else 0
    return 10.0 ** (exponent - decimals)


def close(a: str, b: str) -> bool:
    x, y = _number(a), _number(b)
    if x is None or y is None or math.isnan(x) or math.isnan(y):
        return False
    return abs(x - y) <= max(RTOL * max(abs(x), abs(y)), max(_last_digit(a), _last_digit(b)) * (1 + 1e-9))


def title(table: str) -> str:
    """``table2`` -> Table 2, ``tableB1`` -> Table B.1, ``seeds`` -> seeds.csv."""
    if m := re.fullmatch(r"table(\d+[a-z]?)", table):
        return f"Table {m.group(1)}"
    if m := re.fullmatch(r"table([A-Z])(\d+)", table):
        return f"Table {m.group(1)}.{m.group(2)}"
    return f"{table}.csv"


@dataclass
class Comparison:
    table: str
    cells: int = 0
    identical: int = 0
    within: int = 0
    differ: list[str] = field(default_factory=list)  # one line per differing cell, row or column

    @property
    def reproduced(self) -> bool:
        return not self.differ

    def lines(self) -> list[str]:
        if self.reproduced:
            within = f", {self.within} within {RTOL_TEXT}" if self.within else ""
            return [f"{title(self.table)} reproduced: {self.identical}/{self.cells} cells identical{within}"]
        head = (f"{title(self.table)} differs: {len(self.differ)} of {self.cells} cells" if self.cells
                else f"{title(self.table)} differs")
        listed = [f"  {d}" for d in self.differ[:MAX_LISTED]]
        more = [f"  ... and {len(self.differ) - MAX_LISTED} more"] if len(self.differ) > MAX_LISTED else []
        return [head, *listed, *more]


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    import csv

    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return (rows[0], rows[1:]) if rows else ([], [])


def compare(table: str, committed: Path, ours: Path) -> Comparison:
    """Cell by cell (rows in order, columns by name)."""
    out = Comparison(table)
    head_c, rows_c = _rows(committed)
    head_o, rows_o = _rows(ours)
    missing, extra = [c for c in head_c if c not in head_o], [c for c in head_o if c not in head_c]
    if missing or extra:
        out.differ.append(f"columns: {', '.join(missing) or 'none'} missing, {', '.join(extra) or 'none'} extra")
    if len(rows_c) != len(rows_o):
        out.differ.append(f"rows: {len(rows_c)} committed, {len(rows_o)} in the run")
    keys = head_c[:3]
    for row_c, row_o in zip(rows_c, rows_o):
        rc, ro = dict(zip(head_c, row_c)), dict(zip(head_o, row_o))
        label = "/".join(rc[k] for k in keys if rc.get(k))
        for column in head_c:
            if column not in ro:
                continue
            out.cells += 1
            a, b = rc[column], ro[column]
            if a == b:
                out.identical += 1
            elif tolerant(table, column, rc) and close(a, b):
                out.within += 1
            else:
                out.differ.append(f"{label} {column}: committed {a or '(empty)'}, the run {b or '(empty)'}")
    return out


def run_profile(table: str, run: Path) -> str | None:
    """The profile the run's table was computed on, from its raw folder's manifest (None: not recorded)."""
    raw = run / "raw" / TABLE_RAW.get(table, table)
    return read_manifest(raw).get("profile") if (raw / MANIFEST).is_file() else None


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m analysis.reproduce", description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="*", help="table names (table2, seeds, ...; default: every table of the run "
                        "that is committed too)")
    parser.add_argument("--run", default=RUN, help="the run's reports root (default: %(default)s)")
    parser.add_argument("--committed", default=COMMITTED, help="the committed reports root (default: %(default)s)")
    args = parser.parse_args(argv)
    run, committed = Path(args.run), Path(args.committed)
    names = [t.removesuffix(".csv") for t in args.tables] or sorted(
        p.stem for p in run.glob("*.csv") if (committed / p.name).is_file() and p.stem not in TIMED + NOT_TABLES)
    if not names:
        parser.exit(2, f"error: nothing to compare: {run}/ has no table that {committed}/ has too; build one first "
                    f"(snakemake --cores all {RUN}/table2.csv)\n")
    for name in names:
        for root in (run, committed):
            if not (root / f"{name}.csv").is_file():
                parser.exit(2, f"error: {root}/{name}.csv does not exist (tables: "
                            f"{', '.join(sorted(p.stem for p in root.glob('*.csv'))) or 'none'})\n")
        profile = run_profile(name, run)
        if profile not in (None, DEFAULT_PROFILE):
            parser.exit(2, f"error: {run}/{name}.csv is of the {profile} profile; {committed}/ holds the "
                        f"{DEFAULT_PROFILE} profile's tables, so they are not expected to agree\n")
    results = [compare(name, committed / f"{name}.csv", run / f"{name}.csv") for name in names]
    for r in results:
        print("\n".join(r.lines()))
    bad = [r.table for r in results if not r.reproduced]
    print(f"{'not reproduced' if bad else 'reproduced'}: {len(results) - len(bad)} of {len(results)} table(s) "
          f"agree with {committed}/ (exact, or within {RTOL_TEXT} relative where fp32 summation order may differ)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
