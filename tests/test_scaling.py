"""The budget-scaling study (issue 16, item 3): its table, fit, registered readings and rules."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from analysis.scaling import build_scaling_table, ordering, power_law_fit
from analysis.stats import BootstrapSettings
from tests.test_analysis_eval import fake_result
from tests.test_workflow_distill import dry_run

FAST = BootstrapSettings(resamples=1000, seed=1)
BUDGETS = [100, 200, 400, 800]
needs_snakemake = pytest.mark.skipif(importlib.util.find_spec("snakemake") is None, reason="snakemake not installed")


def reads(scale: float, b: float, rows: int = 12, noise: float = 0.02, seed: int = 0) -> list[dict]:
    """Budget reads whose KL follows scale * tokens^-b per held-out row (row-level noise)."""
    rng = np.random.default_rng(seed)
    weights = 1 + noise * rng.standard_normal(rows)
    out = []
    for budget in BUDGETS:
        kl = scale * budget ** (-b)
        rs = [{"kl_sum": 100 * kl * w, "top1_sum": int(100 * min(0.99, 0.5 + 0.05 * np.log(budget))),
               "positions": 100} for w in weights]
        out.append({"budget": budget, "tokens": budget, "steps": budget // 100, "heldout_rows": rs,
                    "heldout_kl": sum(r["kl_sum"] for r in rs) / (100 * rows)})
    return out


def results(loss: float, base: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return fake_result({t: np.where(rng.random(len(v)) < loss, 0, v).tolist() for t, v in base.items()})


STUDY = {"budgets": BUDGETS, "check": {"run": "good", "budgets": [200, 800]},
         "pairs": [["kl-beats-lm-loss", "good", "bad"], ["partial-beats-full", "good", "same"],
                   ["quality-loss-50", "good", "base"], ["acrosskv-costs-little", "good", "bad"]]}


def table():
    rng = np.random.default_rng(3)
    base_scores = {t: (rng.random(300) < 0.7).astype(int) for t in ("bb_a_report", "bb_b_report")}
    tasks = [{"name": t, "metric": "acc,none"} for t in base_scores]
    base = fake_result({t: v.tolist() for t, v in base_scores.items()})
    runs = {"good": reads(2.0, 0.3), "bad": reads(4.0, 0.3, seed=1), "same": reads(2.0, 0.3, seed=2)}
    evals = {"good": {"smallest": results(0.05, base_scores, 1), "largest": results(0.01, base_scores, 2)},
             "bad": {"smallest": results(0.4, base_scores, 3), "largest": results(0.4, base_scores, 4)},
             "same": {"smallest": results(0.05, base_scores, 5), "largest": results(0.01, base_scores, 6)}}
    checks = {200: {"heldout_final": {"heldout_kl": runs["good"][1]["heldout_kl"] * 1.02}},
              800: {"heldout_final": {"heldout_kl": runs["good"][3]["heldout_kl"] * 1.2}}}
    return build_scaling_table(STUDY, runs, checks, evals, base, tasks, FAST)


def test_power_law_fit_recovers_the_exponent():
    tokens = np.array(BUDGETS, dtype=float)
    a, b = power_law_fit(tokens, 3.0 * tokens ** -0.4)
    assert a == pytest.approx(3.0) and b == pytest.approx(0.4)


def test_points_fits_and_intervals():
    df = table()
    kl = df[(df.kind == "point") & (df.metric == "heldout_kl") & (df.run == "good")].sort_values("budget")
    assert list(kl.budget) == BUDGETS and (kl.estimate.diff().dropna() < 0).all()
    assert ((kl.lo <= kl.estimate) & (kl.estimate <= kl.hi)).all() and (kl.hi > kl.lo).all()
    fit = df[(df.kind == "fit") & (df.metric == "exponent_b")].set_index("run")
    assert fit.loc["good", "estimate"] == pytest.approx(0.3, abs=1e-6)
    assert fit.loc["good", "lo"] <= 0.3 <= fit.loc["good", "hi"]
    acc = df[(df.kind == "point") & (df.metric == "accuracy")]
    assert sorted(acc.budget.unique()) == [100, 800]  # the end points only
    top1 = df[(df.kind == "point") & (df.metric == "heldout_top1")]
    assert top1.estimate.between(0, 100).all()


def test_pairs_follow_the_registered_readings():
    df = table()
    pairs = df[df.kind == "pair"]
    kl_lm = pairs[(pairs.claim == "kl-beats-lm-loss") & (pairs.metric == "kl_difference")]
    assert len(kl_lm) == len(BUDGETS) and set(kl_lm.verdict) == {"holds"}  # "bad" has twice the KL everywhere
    same = pairs[(pairs.claim == "partial-beats-full") & (pairs.metric == "kl_difference")]
    assert set(same.verdict) <= {"cannot tell", "holds", "does not hold"}
    margin = pairs[(pairs.claim == "acrosskv-costs-little") & (pairs.metric == "kl_difference")]
    assert set(margin.verdict) == {"n/a (margin claim)"}  # a KL is no points margin
    orders = df[df.kind == "ordering"].set_index("claim")
    assert orders.loc["kl-beats-lm-loss", "verdict"] == "same at every budget (holds)"
    assert "acrosskv-costs-little" not in orders.index and "quality-loss-50" not in orders.index
    acc = pairs[(pairs.claim == "kl-beats-lm-loss") & (pairs.metric == "accuracy_difference")]
    assert sorted(acc.budget) == [100, 800] and set(acc.verdict) == {"holds"}
    q = pairs[(pairs.claim == "quality-loss-50") & (pairs.metric == "accuracy_difference")].set_index("budget")
    assert q.loc[800, "verdict"] == "holds"  # loses ~1% of the answers: within the 2-point margin


def test_ordering_reading():
    assert ordering(["holds", "holds"]) == "same at every budget (holds)"
    assert ordering(["does not hold"] * 3) == "same at every budget (does not hold)"
    assert ordering(["holds", "cannot tell", "does not hold"]) == "reverses"
    assert ordering(["holds", "cannot tell"]) == "undecided at some budgets"


def test_check_against_separate_runs_uses_the_registered_tolerance():
    checks = table().query("kind == 'check'").set_index("budget")
    assert checks.loc[200, "verdict"] == "agrees" and checks.loc[800, "verdict"] == "does not agree"
    assert checks.loc[200, "estimate"] == pytest.approx(1 / 1.02 - 1)


@needs_snakemake
def test_the_study_runs_one_wsd_run_per_row_and_checks_with_cosine_runs():
    out = dry_run("results/reports/budget_scaling.csv", "config/ci.yaml", flags=("-p", "--forceall"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    runs = [line for line in lines if " distill smollm2-135m" in line and "results/budget_scaling" in line]
    wsd = [c for c in runs if "--schedule wsd" in c]
    cosine = [c for c in runs if "--schedule" not in c]
    assert len(wsd) == 2 and len(cosine) == 1
    for c in wsd:
        assert "--read-budgets 256,512,1024" in c and "--tokens 1024" in c and "--save-at 256=" in c
        assert "--teacher-cache results/budget_scaling/smollm2-135m/teacher_cache" in c
    assert "--tokens 512" in cosine[0] and "--name swiftkv-50 " in cosine[0]
    cache = [line for line in lines if "swiftkv teacher-cache" in line and "budget_scaling" in line]
    assert len(cache) == 1 and "--tokens 1024" in cache[0] and "--heldout-tokens 512" in cache[0]
    evals = [line for line in lines if "swiftkv eval results/budget_scaling/" in line]
    assert len(evals) == 4


@needs_snakemake
def test_a_run_of_the_study_that_is_not_in_the_sheet_is_one_clear_line(tmp_path):
    (tmp_path / "c.yaml").write_text("budget_scaling:\n  runs:\n    x: {variant: swiftkv-99}\n")
    out = dry_run("results/reports/budget_scaling.csv", "config/ci.yaml", str(tmp_path / "c.yaml"),
                  flags=("-p", "--forceall"))
    assert out.returncode != 0
    assert "swiftkv-99" in out.stdout + out.stderr and "Traceback" not in out.stdout + out.stderr


def test_claims_read_the_study_by_the_registered_rule(tmp_path):
    from analysis.claims import DEPENDS, _scaling, budget_verdict
    from analysis.rules import FAILS, HOLDS, UNCLEAR

    table().to_csv(tmp_path / "budget_scaling.csv", index=False)
    study = _scaling(tmp_path)
    kl = study["kl-beats-lm-loss"]
    assert kl.ordering == "same at every budget (holds)" and kl.kl.count("holds") == len(BUDGETS)
    assert [b for b, _ in kl.accuracy] == [100, 800]  # smallest first: the largest decides
    assert study["quality-loss-50"].ordering == "" and study["quality-loss-50"].accuracy
    # the table budget's verdict stands unless the largest budget decides the opposite
    assert budget_verdict(HOLDS, "1.2 [0.5, 2] holds") == HOLDS
    assert budget_verdict(HOLDS, "-3 [-4, -2] does not hold") == DEPENDS
    assert budget_verdict(FAILS, "3 [2, 4] holds") == DEPENDS
    assert budget_verdict(UNCLEAR, "3 [2, 4] holds") == UNCLEAR
    assert budget_verdict(HOLDS, "0 [-1, 1] cannot tell") == HOLDS and budget_verdict(FAILS, None) == FAILS


def test_readme_tables_are_generated_from_the_table():
    from analysis.scaling import scaling_markdown

    text = scaling_markdown(table(), {"good": "Good"})
    assert "| Good | " in text and "exponent b" in text
    assert "| kl-beats-lm-loss | Good vs bad | holds, holds, holds, holds | same at every budget (holds) | holds / holds |" in text
    assert "200 tokens:" in text and "does not agree" in text


def test_committed_budget_scaling_regenerates_from_its_raw_results_and_the_readme_quotes_it():
    from pathlib import Path

    import pandas as pd
    import yaml

    from analysis.raw import verify
    from analysis.scaling import run_labels, scaling_from_raw, scaling_markdown

    root = Path(__file__).resolve().parents[1]
    profile = yaml.safe_load((root / "config" / "config.yaml").read_text())
    raw, study = root / "reports" / "raw" / "budget_scaling", profile["budget_scaling"]
    assert verify(raw) == []
    boot = profile["eval"]["bootstrap"]
    frame = scaling_from_raw(raw, study, BootstrapSettings(boot["resamples"], boot["confidence"], boot["seed"]))
    committed = (root / "reports" / "budget_scaling.csv").read_text()
    assert frame.to_csv(index=False, float_format="%.5g") == committed
    sheet = pd.read_csv(root / "config" / "variants.tsv", sep="\t", keep_default_na=False)
    sheet = sheet[sheet.model == study["model"]]
    labels = run_labels(study, dict(zip(sheet.variant, sheet.label)))
    readme = (root / "reports" / "README.md").read_text()
    assert scaling_markdown(pd.read_csv(root / "reports" / "budget_scaling.csv"), labels) in readme
