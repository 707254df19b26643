"""Training-seed variance (issue 16): the two-level bootstrap, reports/seeds.csv, the lr sweep and their rules."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.accuracy import Row, build_table
from analysis.distill import lr_sweep_table
from analysis.seeds import SeedRun, build_seeds_table
from analysis.stats import BootstrapSettings, hierarchical_difference_ci, paired_difference_ci
from tests.conftest import committed_raw, committed_sheet
from tests.test_analysis_eval import fake_result
from tests.test_workflow_distill import dry_run

ROOT = Path(__file__).resolve().parents[1]
LR = {k: f"{v:g}" for k, v in yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["distill"]["lr_by_scope"]
      .items()}  # what the CI profile inherits
FAST = BootstrapSettings(resamples=2000, seed=1)
needs_snakemake = pytest.mark.skipif(importlib.util.find_spec("snakemake") is None, reason="snakemake not installed")


# -- the two-level bootstrap -------------------------------------------------------------------------------------


def test_one_seed_is_the_paired_example_bootstrap():
    rng = np.random.default_rng(0)
    a = [(rng.random(200) < 0.6).astype(float), (rng.random(150) < 0.4).astype(float)]
    b = [(rng.random(200) < 0.5).astype(float), (rng.random(150) < 0.4).astype(float)]
    one = hierarchical_difference_ci([x[None] for x in a], [y[None] for y in b], FAST)
    flat = paired_difference_ci(a, b, FAST)
    assert one.value == pytest.approx(flat.value)
    assert one.low == pytest.approx(flat.low, abs=0.015) and one.high == pytest.approx(flat.high, abs=0.015)


def test_seed_spread_widens_the_interval_and_the_estimate_is_the_seed_mean():
    rng = np.random.default_rng(1)
    base = (rng.random(300) < 0.5).astype(float)
    same = np.stack([base, base, base])
    flip = [rng.random(300) < p for p in (0.05, 0.20, 0.35)]  # seeds that lose 2.5, 10 and 17.5 points
    spread = np.stack([np.where(f, 0.0, base) for f in flip])
    narrow = hierarchical_difference_ci([same], [base[None]], FAST)
    wide = hierarchical_difference_ci([spread], [base[None]], FAST)
    assert narrow.value == 0.0 and narrow.low == pytest.approx(0.0, abs=1e-12) == narrow.high
    assert wide.value == pytest.approx(np.mean([s.mean() for s in spread]) - base.mean())
    assert wide.high - wide.low > 0.05  # the seeds differ by ~15 points: the interval carries it
    assert hierarchical_difference_ci([spread], None, FAST).value == pytest.approx(spread.mean())


def test_rows_on_different_examples_are_refused():
    with pytest.raises(ValueError, match="same examples"):
        hierarchical_difference_ci([np.ones((2, 10))], [np.ones((1, 9))], FAST)


# -- reports/seeds.csv -------------------------------------------------------------------------------------------


def _write(tmp_path, name, result, kl=None, heldout=None):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(result))
    fid = ckpt = None
    if kl is not None:
        fid = tmp_path / f"{name}-fid.json"
        fid.write_text(json.dumps({"teacher_forced": [{"tokens": 10, "kl_sum": 10 * kl, "top1_agree": 8}] * 3,
                                   "greedy_rows": [{"agreement": 0.5}]}))
    if heldout is not None:
        ckpt = tmp_path / f"{name}-ckpt"
        ckpt.mkdir()
        (ckpt / "distill.json").write_text(json.dumps({"heldout_final": {"heldout_kl": heldout}}))
    return path, fid, ckpt


def test_seeds_table_pools_the_seeds_and_its_seed_rows_equal_the_tables(tmp_path):
    rng = np.random.default_rng(2)
    n = 200
    base = {t: (rng.random(n) < 0.6).astype(int) for t in ("bb_a_report", "bb_b_report")}
    tasks = [{"name": t, "metric": "acc,none"} for t in base]
    b_path, _, _ = _write(tmp_path, "base", fake_result({t: v.tolist() for t, v in base.items()}))
    runs = []
    for variant, loss in (("swiftkv-50", 0.1), ("swiftkv-50-lm", 0.3)):
        for seed in (0, 1, 2):
            res = {t: np.where(rng.random(n) < loss, 0, v).tolist() for t, v in base.items()}
            lm, fid, ckpt = _write(tmp_path, f"{variant}-{seed}", fake_result(res), kl=0.5 + seed, heldout=1.0 + seed)
            runs.append(SeedRun("tiny", variant, seed, lm, fid, ckpt))
    lm, fid, _ = _write(tmp_path, "untrained", fake_result({t: np.zeros(n, int).tolist() for t in base}), kl=3.0)
    runs.append(SeedRun("tiny", "swiftkv-50-nodistill", None, lm, fid, None))
    df = build_seeds_table(runs, SeedRun("tiny", "base", None, b_path), tasks, {"default": "swiftkv-50"}, FAST)

    per_seed, pooled = df[df.seed != "all"], df[df.seed == "all"].set_index("variant")
    assert len(per_seed) == 7 and list(pooled.index) == ["swiftkv-50", "swiftkv-50-lm", "swiftkv-50-nodistill"]
    lm_rows = per_seed[per_seed.variant == "swiftkv-50-lm"]
    assert pooled.loc["swiftkv-50-lm", "average"] == pytest.approx(lm_rows.average.mean())
    assert pooled.loc["swiftkv-50-lm", "delta_base"] == pytest.approx(lm_rows.delta_base.mean())
    assert pooled.loc["swiftkv-50-lm", "average_seed_sd"] == pytest.approx(lm_rows.average.std(ddof=1))
    kl_rows = per_seed[per_seed.variant == "swiftkv-50"]
    assert pooled.loc["swiftkv-50-lm", "delta_ref"] == pytest.approx(lm_rows.average.mean() - kl_rows.average.mean())
    assert pooled.loc["swiftkv-50-lm", "delta_ref_hi"] < 0  # LM loses ~20% of the answers, KL ~10%: excluded 0
    assert pooled.loc["swiftkv-50-lm", "ref"] == "swiftkv-50" and pd.isna(pooled.loc["swiftkv-50", "delta_ref"])
    assert pooled.loc["swiftkv-50", "heldout_kl"] == pytest.approx(2.0)
    assert pooled.loc["swiftkv-50", "heldout_kl_seed_sd"] == pytest.approx(1.0)
    assert pooled.loc["swiftkv-50", "kl"] == pytest.approx(1.5) and pooled.loc["swiftkv-50", "top1"] == 80
    assert pooled.loc["swiftkv-50-nodistill", "n_seeds"] == 1
    assert pooled.loc["swiftkv-50-nodistill", "seeds"] == "untrained"
    assert pooled.loc["swiftkv-50-nodistill", "average"] == 0

    # a seed's row is the table's row for that student (same examples, same paired difference)
    spec = {"label": "x", "loss": "kl", "scope": "partial", "key_value_group_size": "1"}
    rows = [Row("tiny", "base", "native", spec, b_path), Row("tiny", "swiftkv-50", "native", spec, runs[0].lm_eval)]
    table = build_table("table2", rows, {"tiny": tasks}, FAST).set_index("variant")
    seed0 = kl_rows[kl_rows.seed == "0"].iloc[0]
    assert seed0.average == pytest.approx(table.loc["swiftkv-50", "average"])
    assert seed0.delta_base == pytest.approx(table.loc["swiftkv-50", "delta_base"])


def test_pooled_rows_carry_the_coprimary_heldout_kl_paired_on_sequences(tmp_path):
    """power_run.heldout_kl: per sequence kl_sum / tokens, a run's value their mean; the pooled difference against the
    reference is paired on the sequences and its interval carries the seeds (seed_difference_ci on one task)."""
    from analysis.stats import seed_difference_ci

    rng = np.random.default_rng(5)
    n_seq, tasks = 40, [{"name": "bb_a_report", "metric": "acc,none"}]
    base = (rng.random(50) < 0.6).astype(int)
    b_path, _, _ = _write(tmp_path, "base", fake_result({"bb_a_report": base.tolist()}))
    tokens = rng.integers(5, 20, n_seq)  # sequences of different lengths: per-sequence means, not token-weighted
    hard = rng.gamma(2.0, 0.5, n_seq)  # what makes a sequence hard is shared by every row (the pairing)
    kl, runs = {}, []
    for variant, shift in (("swiftkv-50", 0.0), ("swiftkv-50-lm", 0.4)):
        for seed in range(3):
            per_seq = hard + shift + rng.normal(0, 0.05, n_seq) + 0.02 * seed
            kl[(variant, seed)] = per_seq
            fid = tmp_path / f"{variant}-{seed}-fid.json"
            fid.write_text(json.dumps({"teacher_forced": [{"tokens": int(t), "kl_sum": float(k * t), "top1_agree": 1}
                                                          for k, t in zip(per_seq, tokens)], "greedy_rows": []}))
            lm, _, _ = _write(tmp_path, f"{variant}-{seed}", fake_result({"bb_a_report": base.tolist()}))
            runs.append(SeedRun("tiny", variant, seed, lm, fid, None))
    df = build_seeds_table(runs, SeedRun("tiny", "base", None, b_path), tasks, {"default": "swiftkv-50"}, FAST)
    pooled = df[df.seed == "all"].set_index("variant")
    per_seed = df[df.seed != "all"]
    assert per_seed.kl_seq.tolist() == pytest.approx([kl[(v, s)].mean() for v in ("swiftkv-50", "swiftkv-50-lm")
                                                      for s in range(3)])
    lm = np.stack([kl[("swiftkv-50-lm", s)] for s in range(3)])
    ref = np.stack([kl[("swiftkv-50", s)] for s in range(3)])
    expected = seed_difference_ci([lm], [ref])
    got = pooled.loc["swiftkv-50-lm", ["kl_delta_ref", "kl_delta_ref_lo", "kl_delta_ref_hi"]].tolist()
    assert got == pytest.approx([expected.value, expected.low, expected.high])
    assert 0 < got[1] and got[0] == pytest.approx(0.4, abs=0.05)  # the LM row's KL is higher, and the pairing shows it
    unpaired_half = 1.96 * np.sqrt(lm.mean(axis=0).var(ddof=1) / n_seq + ref.mean(axis=0).var(ddof=1) / n_seq)
    assert got[2] - got[0] < unpaired_half  # paired on sequences: narrower than two independent samples
    assert pd.isna(pooled.loc["swiftkv-50", "kl_delta_ref"]) and pooled.loc["swiftkv-50", "kl_seq_lo"] > 0


# -- the lr sweep ------------------------------------------------------------------------------------------------


def _run(tmp_path, variant, scope, lr, kl):
    d = tmp_path / f"{variant}-{lr:g}"
    d.mkdir()
    (d / "distill.json").write_text(json.dumps({
        "model": "tiny", "variant": variant, "train_tokens": 100, "steps": 1, "train_tok_per_s": 1.0,
        "settings": {"num_key_value_layers": 2, "key_value_group_size": 1, "key_value_heads": None, "loss": "kl",
                     "train": True, "scope": scope, "lr": lr},
        "heldout_initial": {"heldout_kl": 3.0}, "heldout_final": {"heldout_kl": kl}, "trainable_parameters": 1,
        "kv_cache_bytes_per_token_fp16": 1}))
    return d


def test_lr_sweep_chooses_the_lowest_heldout_kl_per_scope(tmp_path):
    dirs = [_run(tmp_path, "p", "partial", lr, kl) for lr, kl in ((3e-4, 0.9), (1e-3, 0.7), (3e-3, 0.8))]
    dirs += [_run(tmp_path, "f", "full", lr, kl) for lr, kl in ((1e-4, 0.6), (3e-4, 0.65), (1e-3, 0.9))]
    t = lr_sweep_table(dirs, {"partial": 1e-3, "full": 1e-3})
    chosen = t[t.chosen].set_index("scope")
    assert chosen.loc["partial", "lr"] == 1e-3 and not chosen.loc["partial", "at_edge"]
    assert chosen.loc["full", "lr"] == 1e-4 and chosen.loc["full", "at_edge"]  # the smallest tried: say so
    assert t[t.configured].lr.tolist() == [1e-3, 1e-3]


def test_the_profile_trains_each_scope_with_the_lr_the_committed_sweep_chose():
    """config/config.yaml's lr per scope is what reports/lr_sweep.csv's rule chose (not a hand-picked value)."""
    sweep = pd.read_csv(ROOT / "reports" / "lr_sweep.csv")
    d = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["distill"]
    for _, row in sweep[sweep.chosen].iterrows():
        assert d.get("lr_by_scope", {}).get(row.scope, d["overrides"]["lr"]) == pytest.approx(row.lr), row.scope
    assert (sweep.chosen == sweep.configured).all()


# -- the rules ---------------------------------------------------------------------------------------------------


@needs_snakemake
def test_seed_runs_are_the_tables_recipe_with_another_seed_and_cache():
    out = dry_run("results/reports/seeds.csv", "config/ci.yaml", flags=("-p", "--forceall"))
    assert out.returncode == 0, out.stderr
    cmds = [line for line in out.stdout.splitlines() if " distill smollm2-135m" in line and "/seed-1/" in line]
    variants = sorted(c.split("--name ")[1].split()[0] for c in cmds)
    assert variants == ["swiftkv-50", "swiftkv-50-lm"]  # the untrained row has no seed run
    for c in cmds:
        assert "--seed 1" in c and "--teacher-cache results/teacher_cache/smollm2-135m/seed-1" in c
        assert "--tokens 512" in c and f"--lr {LR['partial']} " in c  # both rows train partially
    evals = [line for line in out.stdout.splitlines() if "swiftkv eval results/seeds/" in line]
    assert len(evals) == 4 and all("--kv-cache native" in e for e in evals)  # per student: tasks, fidelity
    fidelity = [e for e in evals if "--fidelity-sequences" in e]
    assert len(fidelity) == 2 and not any("--task " in e or "--tasks-json" in e for e in fidelity)  # no bpb


@needs_snakemake
def test_lr_sweep_runs_and_lr_by_scope_reach_the_trainer(tmp_path):
    out = dry_run("results/reports/lr_sweep.csv", "config/ci.yaml", flags=("-p", "--forceall"))
    assert out.returncode == 0, out.stderr
    cmds = [line for line in out.stdout.splitlines() if " distill smollm2-135m" in line and "lr_sweep" in line]
    assert sorted((c.split("--name ")[1].split()[0], c.split("--lr ")[1].split()[0]) for c in cmds) == [
        ("swiftkv-50", "0.001"), ("swiftkv-50", "0.003"), ("swiftkv-50-full", "0.001"), ("swiftkv-50-full", "0.003")]
    (tmp_path / "c.yaml").write_text("distill:\n  lr_by_scope: {full: 3.0e-4}\n")
    out = dry_run("results/distill/summary.csv", "config/ci.yaml", str(tmp_path / "c.yaml"),
                  flags=("-p", "--forceall"))
    assert out.returncode == 0, out.stderr
    lrs = {c.split("--name ")[1].split()[0]: c.split("--lr ")[1].split()[0]
           for c in out.stdout.splitlines() if " distill smollm2-135m" in c}
    assert lrs["swiftkv-50-full"] == "0.0003" and lrs["swiftkv-50"] == LR["partial"]


# -- raw results (issue 16, item 6): the committed inputs of seeds.csv and lr_sweep.csv -------------------------

PROFILE = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
RAW = ROOT / "reports" / "raw"


def test_raw_folder_records_and_checks_every_file(tmp_path, monkeypatch):
    from analysis.raw import MANIFEST, collect, raw_path, verify

    monkeypatch.chdir(tmp_path)
    run = Path("results/eval/m/v/native")
    run.mkdir(parents=True)
    (run / "lm_eval.json").write_text("{}")
    (run / "fidelity.json").write_text('{"a": 1}')
    dest = tmp_path / "raw"
    manifest = collect([str(run / "lm_eval.json"), str(run / "fidelity.json")], dest, "abc", "c0ffee")
    assert raw_path(dest, run / "lm_eval.json").read_text() == "{}" and (dest / MANIFEST).is_file()
    assert manifest["collected_at"] == "c0ffee" and len(manifest["files"]) == 2 and verify(dest) == []
    from analysis.raw_summary import summary  # what provenance.json lists per raw folder of a reports directory

    collect([str(run / "fidelity.json")], tmp_path / "reports" / "raw" / "study", "abc", "c0ffee")
    assert summary(tmp_path / "reports") == {"study": {"collected at": "c0ffee", "config hash": "abc", "files": 1}}
    raw_path(dest, run / "fidelity.json").write_text('{"a": 2}')
    (dest / "extra.json").write_text("{}")
    raw_path(dest, run / "lm_eval.json").unlink()
    assert sorted(verify(dest)) == ["eval/m/v/native/fidelity.json: changed since it was collected",
                                    "eval/m/v/native/lm_eval.json: missing", "extra.json: not in the manifest"]


def test_the_readme_quotes_the_committed_lr_sweep():
    from analysis.distill import lr_sweep_sentence

    text = " ".join((ROOT / "reports" / "README.md").read_text().split())
    assert lr_sweep_sentence(pd.read_csv(ROOT / "reports" / "lr_sweep.csv")) in text  # generated, not typed


def test_committed_lr_sweep_regenerates_from_its_raw_results():
    from analysis.raw import raw_path, verify

    d, root = PROFILE["distill"], RAW / "lr_sweep"
    assert verify(root) == []
    runs = [f"results/lr_sweep/{d['lr_sweep']['model']}/{v}/lr-{lr:g}" for v in d["lr_sweep"]["variants"]
            for lr in d["lr_sweep"]["lrs"]]
    configured = {s: d["lr_by_scope"].get(s, d["overrides"]["lr"]) for s in ("partial", "full")}
    table = lr_sweep_table([raw_path(root, r) for r in runs], configured)
    assert table.to_csv(index=False, float_format="%.6g") == (ROOT / "reports" / "lr_sweep.csv").read_text()


def test_committed_seeds_csv_regenerates_from_its_raw_results_and_the_readme_quotes_it():
    from analysis.raw import verify
    from analysis.seeds import seed_runs, seeds_from_raw, seeds_markdown

    root, profile = committed_raw("seeds")  # the config the run was collected with (a registered run may extend it)
    s, sheet = profile["seeds"], committed_sheet("seeds")
    models = []
    for model in s["models"]:
        rows = sheet[sheet.model == model].set_index("variant")
        trained = {v: rows.loc[v, "train"] == "yes" for v in s["variants"]}
        models.append({"model": model, "runs": seed_runs(model, s["variants"], s["seeds"], profile["distill"]["seed"],
                                                         trained)})
    boot = profile["eval"]["bootstrap"]
    table = seeds_from_raw(root, models, s["reference"], BootstrapSettings(boot["resamples"], boot["confidence"],
                                                                           boot["seed"]))
    committed = (ROOT / "reports" / "seeds.csv").read_text()
    assert table.to_csv(index=False, float_format="%.4f") == committed
    readme = (ROOT / "reports" / "README.md").read_text()
    labels = dict(zip(sheet[sheet.model == s["models"][0]].variant, sheet[sheet.model == s["models"][0]].label))
    assert seeds_markdown(pd.read_csv(ROOT / "reports" / "seeds.csv"), labels) in readme  # generated, not typed


@pytest.mark.parametrize("table", ["table2", "table4a", "table4b", "tableB1", "tableB2"])
def test_committed_accuracy_tables_regenerate_from_their_raw_results(table):
    from analysis.accuracy import table_from_raw
    from analysis.raw import verify

    root, profile = committed_raw(table)  # the config the run was collected with (a registered run may extend it)
    sheet = committed_sheet(table)
    rows = []
    for spec in sheet[sheet.model.isin(profile["eval"]["models"])].to_dict("records"):
        spec["tables"] = [t for t in spec["tables"].split(",") if t]
        if table in spec["tables"]:
            rows += [{"model": spec["model"], "variant": spec["variant"], "kv_cache": kv, "spec": spec}
                     for kv in (["native", "fp8"] if table == "tableB1" else ["native"])]
    boot = profile["eval"]["bootstrap"]
    df, md = table_from_raw(table, root, rows, BootstrapSettings(boot["resamples"], boot["confidence"], boot["seed"]))
    assert df.to_csv(index=False, float_format="%.4f") == (ROOT / "reports" / f"{table}.csv").read_text()
    assert md == (ROOT / "reports" / f"{table}.md").read_text()


def test_the_readme_quotes_the_committed_table2():
    from analysis.accuracy import summary_markdown

    table2, seeds = (pd.read_csv(ROOT / "reports" / f"{name}.csv") for name in ("table2", "seeds"))
    assert summary_markdown(table2, seeds) in (ROOT / "reports" / "README.md").read_text()


def test_large_raw_files_are_stored_compressed_and_read_in_place(tmp_path, monkeypatch):
    from analysis.io import read_json
    from analysis.raw import COMPRESS_ABOVE, collect, raw_path, verify

    monkeypatch.chdir(tmp_path)
    src = Path("results/eval/m/v/native/lm_eval.json")
    src.parent.mkdir(parents=True)
    big = {"samples": ["x" * 100] * (COMPRESS_ABOVE // 50)}
    src.write_text(json.dumps(big))
    first = collect([str(src)], tmp_path / "a", "h", "c")
    second = collect([str(src)], tmp_path / "b", "h", "c")
    assert list(first["files"]) == ["eval/m/v/native/lm_eval.json.gz"] and first == second  # deterministic bytes
    assert read_json(raw_path(tmp_path / "a", src)) == big and verify(tmp_path / "a") == []


@needs_snakemake
def test_a_seeds_row_that_is_not_in_the_sheet_is_one_clear_line(tmp_path):
    (tmp_path / "c.yaml").write_text("seeds:\n  variants: [swiftkv-50, swiftkv-51]\n")
    out = dry_run("results/reports/seeds.csv", "config/ci.yaml", str(tmp_path / "c.yaml"))
    assert out.returncode != 0 and "Traceback" not in out.stdout + out.stderr
    assert "config seeds.variants: swiftkv-51 of smollm2-135m are not rows of the variants sheet" in out.stderr
