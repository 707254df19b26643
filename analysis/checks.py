"""Check a built ``reports/`` directory: every expected artifact exists, images decode, CSVs have their columns.

    python -m analysis.checks [REPORTS_DIR]      (exit 1 and one line per problem if anything is wrong)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

_ACCURACY = ["model", "variant", "kv_cache", "label", "skip_fraction", "average", "average_lo", "average_hi"]
_SERVE = ["source", "engine", "hardware", "model", "variant", "label", "throughput_tok_s", "speedup",
          "predicted_speedup", "status"]
EXPECTED_COLUMNS = {
    "table1.csv": ["model", "setting", "num_key_value_layers", "key_value_group_size", "context_length", "vocab",
                   "kv_proj", "qo_proj", "mlp", "attention", "total", "prefill_reduction", "paper_total"],
    "table_kv_memory.csv": ["model", "num_key_value_layers", "key_value_group_size", "kv_cache_bytes_per_token",
                            "kv_cache_reduction", "kv_cache_reduction_fp8", "paper_kv_cache_reduction"],
    "simscore_crossings.csv": ["model", "metric", "num_layers", "crossing_layer", "crossing_depth",
                               "simscore_at_half", "ci_low_at_half", "ci_high_at_half"],
    "table2.csv": _ACCURACY + ["delta_base", "delta_base_lo", "delta_base_hi", "kl", "kl_lo", "kl_hi"],
    "table4a.csv": _ACCURACY + ["delta_ref", "delta_ref_lo", "delta_ref_hi"],
    "table4b.csv": _ACCURACY + ["delta_ref", "delta_ref_lo", "delta_ref_hi"],
    "tableB1.csv": _ACCURACY + ["delta_ref", "delta_ref_lo", "delta_ref_hi", "kv_reduction"],
    "tableB2.csv": _ACCURACY + ["delta_ref", "delta_ref_lo", "delta_ref_hi"],
    "seeds.csv": ["model", "variant", "seed", "n_seeds", "average", "average_lo", "average_hi", "delta_base",
                  "delta_base_lo", "delta_base_hi", "ref", "delta_ref", "delta_ref_lo", "delta_ref_hi", "heldout_kl"],
    "lr_sweep.csv": ["model", "variant", "scope", "lr", "heldout_kl_final", "chosen", "at_edge", "configured"],
    "budget_scaling.csv": ["kind", "claim", "run", "other", "budget", "tokens", "metric", "estimate", "lo", "hi",
                           "verdict"],
    "table3.csv": _SERVE + ["kv_limit", "kv_cache_bytes"],
    "tableA3.csv": _SERVE + ["min_ratio", "mean_ratio"],
    "claims.csv": ["id", "rule", "estimate", "lo", "hi", "points", "verdict", "status", "evidence",
                   "evidence_commit"],
    "table_advisor.csv": ["model", "candidate", "num_key_value_layers", "key_value_group_size", "simscore",
                          "untrained_kl", "untrained_kl_lo", "untrained_kl_hi", "prefill_saved", "kv_saved", "pareto",
                          "predicted_trained_kl", "trained_kl", "recommended"],
    "table_advisor_calibration.csv": ["model", "predictor", "trained_points", "distinct_l", "spearman", "spearman_lo",
                                      "spearman_hi", "tolerance", "recommended", "trust"],
    "table_long_context.csv": ["model", "variant", "kind", "length", "depth", "context", "n", "estimate", "lo", "hi",
                               "delta", "delta_lo", "delta_hi"],
}
NO_MARKDOWN = {"table3.csv", "tableA3.csv", "table_advisor.csv", "table_advisor_calibration.csv",
               "table_long_context.csv"}  # CSV only
FIGURES = ["figure2_simscore.png", "figure2_forward_time.png", "figure_distill_curve.png", "figure3_throughput.png",
           "figure4_latency.png", "figure_budget_scaling.png", "figure_advisor.png", "figure_long_context.png"]


def check_image(path: Path) -> str | None:
    import matplotlib.image

    try:
        pixels = matplotlib.image.imread(path)
    except Exception as err:  # any decoder failure is the finding
        return f"{path}: does not open as an image ({err})"
    if pixels.shape[0] < 200 or pixels.shape[1] < 200:
        return f"{path}: only {pixels.shape[1]}x{pixels.shape[0]} pixels"
    if float(pixels.std()) == 0.0:
        return f"{path}: a blank image"
    return None


def check_csv(path: Path, columns: list[str]) -> str | None:
    try:
        df = pd.read_csv(path)
    except Exception as err:
        return f"{path}: does not parse as CSV ({err})"
    missing = [c for c in columns if c not in df.columns]
    if missing:
        return f"{path}: missing columns {missing}"
    if df.empty:
        return f"{path}: no rows"
    return None


def check_reports(directory: str | Path, report: bool = True) -> list[str]:
    """Problems found (empty when all is well)."""
    directory = Path(directory)
    problems = []
    for name in FIGURES:
        path = directory / name
        problems.append(check_image(path) if path.is_file() else f"{path}: missing")
    for name, columns in EXPECTED_COLUMNS.items():
        path = directory / name
        problems.append(check_csv(path, columns) if path.is_file() else f"{path}: missing")
        md = path.with_suffix(".md")
        if name.startswith("table") and name not in NO_MARKDOWN and not md.is_file():
            problems.append(f"{md}: missing")
    if report:
        page = directory / "report.html"
        if not page.is_file():
            problems.append(f"{page}: missing")
        elif "data:image/png;base64," not in page.read_text():
            problems.append(f"{page}: no embedded figure")
    return [p for p in problems if p]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.checks",
        description="Check a built reports/ directory: every figure and table the DAG renders is present, images "
                    "decode, CSVs carry their expected columns, report.html is well-formed. Exit 1 with one line "
                    "per problem otherwise.")
    parser.add_argument("directory", nargs="?", default="reports", type=Path,
                        help="the reports directory to check (default: reports)")
    directory = parser.parse_args(argv).directory
    if not directory.is_dir():
        print(f"error: {directory} is not a directory; pass the reports/ folder a snakemake run wrote",
              file=sys.stderr)
        return 1
    problems = check_reports(directory)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    print(f"{directory}: {len(FIGURES)} figures, {len(EXPECTED_COLUMNS)} tables, report.html: "
          + ("all present and well-formed" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
