"""The warmup-stable-decay schedule of the budget-scaling study (issue 16, item 3): one run read at several budgets."""

from __future__ import annotations

import json

import pytest
import torch

from swiftkv.distill import BudgetRead, DistillSettings, Interrupted, wsd_plan
from swiftkv.errors import SwiftKVError
from tests.test_teacher_cache import cache_dir, run, weights  # noqa: F401  (cache_dir is a fixture)

WSD = dict(schedule="wsd", tokens=1500, read_budgets=(400, 800, 1500), batch_size=1, eval_every=-1,
           checkpoint_every=3)


def test_plan_reads_each_budget_at_the_first_step_that_reaches_it():
    settings = DistillSettings(num_key_value_layers=1, schedule="wsd", tokens=1000, read_budgets=(1000, 250, 500))
    plan = wsd_plan(settings, [100] * 10)
    assert plan == [BudgetRead(250, 3, 300, 2), BudgetRead(500, 5, 500, 4), BudgetRead(1000, 10, 1000, 8)]
    # data that run out: the last budget reads every step there is
    assert wsd_plan(settings, [100] * 7)[-1] == BudgetRead(1000, 7, 700, 5)


@pytest.mark.parametrize("bad", [
    dict(schedule="wsd", tokens=1000),                                # nothing to read
    dict(schedule="wsd", tokens=900, read_budgets=(500, 1000)),       # tokens is not the largest budget
    dict(schedule="cosine", tokens=1000, read_budgets=(1000,)),       # budgets without wsd
    dict(schedule="wsd", tokens=1000, read_budgets=(1000,), decay_ratio=0),
    dict(schedule="linear"),
])
def test_bad_wsd_settings_are_one_line(bad):
    with pytest.raises(SwiftKVError):
        DistillSettings(num_key_value_layers=1, **bad).validate()


def test_cosine_fingerprints_do_not_change_with_the_wsd_fields():
    a = DistillSettings(num_key_value_layers=1)
    assert a.fingerprint("m") == DistillSettings(num_key_value_layers=1, warmup_steps=7, decay_ratio=0.5).fingerprint("m")
    b = DistillSettings(num_key_value_layers=1, schedule="wsd", tokens=1000, read_budgets=(500, 1000))
    assert b.fingerprint("m") != a.fingerprint("m")


def test_a_run_reads_every_budget_and_ends_at_the_largest(cache_dir, tmp_path):
    summary = run(tmp_path, "wsd", cache=cache_dir, train_kw={"save_at": {400: tmp_path / "at-400"}}, **WSD)
    reads = summary["budget_reads"]
    assert [r["budget"] for r in reads] == [400, 800, 1500]
    assert all(r["tokens"] >= r["budget"] for r in reads[:2])
    assert [r["steps"] for r in reads] == sorted(r["steps"] for r in reads)
    assert summary["steps"] == reads[-1]["steps"] and summary["train_tokens"] == reads[-1]["tokens"]
    for r in reads:  # per held-out row sums add up to the pooled numbers
        rows = r["heldout_rows"]
        assert sum(x["positions"] for x in rows) == r["heldout_tokens"]
        assert sum(x["kl_sum"] for x in rows) / r["heldout_tokens"] == pytest.approx(r["heldout_kl"])
        assert sum(x["top1_sum"] for x in rows) / r["heldout_tokens"] == pytest.approx(r["heldout_top1"])
        assert 0 <= r["heldout_top1"] <= 1
    assert summary["heldout_final"]["heldout_kl"] == reads[-1]["heldout_kl"]
    assert reads[-1]["heldout_kl"] < summary["heldout_initial"]["heldout_kl"]
    log = [json.loads(x) for x in (tmp_path / "wsd" / "train_log.jsonl").read_text().splitlines()]
    # the stable run keeps its lr after warm-up; each branch decays linearly from it
    stable = [r["lr"] for r in log if r["event"] == "train" and "branch" not in r]
    assert stable[0] == pytest.approx(1.5e-3) and set(stable[1:]) == {3e-3}
    branch = [r["lr"] for r in log if r.get("branch") == 1500]
    assert branch[0] == 3e-3 and branch == sorted(branch, reverse=True) and len(branch) == reads[-1]["decay_steps"]
    saved = json.loads((tmp_path / "at-400" / "distill.json").read_text())
    assert saved["read"]["heldout_kl"] == reads[0]["heldout_kl"]


def test_reading_a_smaller_budget_leaves_the_run_unchanged(cache_dir, tmp_path):
    """A branch restores the stable run's weights and optimizer state: with or without the early reads, the
    largest budget's student is the same."""
    run(tmp_path, "three", cache=cache_dir, **WSD)
    run(tmp_path, "one", cache=cache_dir, **{**WSD, "read_budgets": (1500,)})
    a, b = weights(tmp_path / "three"), weights(tmp_path / "one")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)


def test_resume_reads_each_budget_once_and_ends_where_an_uninterrupted_run_ends(cache_dir, tmp_path):
    full = run(tmp_path, "a", cache=cache_dir, **WSD)
    keep = {"save_at": {400: tmp_path / "b-400"}}
    with pytest.raises(Interrupted):
        run(tmp_path, "b", cache=cache_dir, train_kw={"interrupt_after": 7, **keep}, **WSD)
    resumed = run(tmp_path, "b", cache=cache_dir, train_kw={"resume": True, **keep}, **WSD)
    assert full["budget_reads"][0]["steps"] < 7  # the 400-token student was read before the interruption ...
    read = json.loads((tmp_path / "b-400" / "distill.json").read_text())["read"]  # ... and still arrives
    assert read["heldout_kl"] == pytest.approx(full["budget_reads"][0]["heldout_kl"], rel=1e-5)
    assert not (tmp_path / "b.ckpt").exists()
    assert [r["budget"] for r in resumed["budget_reads"]] == [400, 800, 1500]
    for x, y in zip(full["budget_reads"], resumed["budget_reads"]):
        assert y["heldout_kl"] == pytest.approx(x["heldout_kl"], rel=1e-5)
    log = [json.loads(x) for x in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()]
    assert sorted(r["budget"] for r in log if r["event"] == "budget") == [400, 800, 1500]


def test_save_at_a_budget_that_is_not_read_is_refused_before_work(cache_dir, tmp_path):
    with pytest.raises(SwiftKVError, match="does not read"):
        run(tmp_path, "x", cache=cache_dir, train_kw={"save_at": {999: tmp_path / "at-999"}}, **WSD)
    assert not (tmp_path / "x").exists()


def test_log_only_keeps_the_summary_and_log_without_weights(cache_dir, tmp_path):
    """--log-only (lr sweep, the study's check runs): the same held-out numbers, no weights on disk."""
    full = run(tmp_path, "full", cache=cache_dir, **{**WSD, "schedule": "cosine", "read_budgets": ()})
    lean = run(tmp_path, "lean", cache=cache_dir, train_kw={"log_only": True},
               **{**WSD, "schedule": "cosine", "read_budgets": ()})
    assert lean["heldout_final"]["heldout_kl"] == full["heldout_final"]["heldout_kl"]
    files = sorted(p.name for p in (tmp_path / "lean").iterdir() if not p.name.startswith("."))
    assert files == ["distill.json", "train_log.jsonl"]
    assert json.loads((tmp_path / "lean" / "distill.json").read_text())["steps"] == full["steps"]
    assert (tmp_path / "full" / "model.safetensors").is_file() and not (tmp_path / "lean.ckpt").exists()
