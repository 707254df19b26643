"""analysis.distill on the outputs of a real (tiny) distillation run: the trainer's files are its contract."""

from __future__ import annotations

import pytest
import torch

from analysis.distill import heldout_curve, plot_heldout_curve, summarize_runs
from swiftkv.distill import DistillSettings, train
from tests.conftest import tiny_base, tiny_conversations, tiny_tokenizer


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("runs")
    out = []
    for name, extra in [("swiftkv-a", {}), ("swiftkv-a-nodistill", {"train": False}), ("swiftkv-a-mqa", {"key_value_heads": 1})]:
        s = DistillSettings(num_key_value_layers=1, tokens=600, max_length=96, heldout_tokens=150, eval_every=2, **extra)
        train(tiny_base(num_hidden_layers=4), tiny_tokenizer(), s, root / name, train_conversations=tiny_conversations(60),
              heldout_conversations=tiny_conversations(10, 1, "h"), model_name="tiny", progress=False,
              mixed_precision="no", extra_summary={"variant": name})
        out.append(root / name)
    torch.set_num_threads(threads)
    return out


def test_summary_has_one_row_per_run_with_kl_before_and_after(runs):
    table = summarize_runs(runs)
    assert list(table["variant"]) == ["swiftkv-a", "swiftkv-a-nodistill", "swiftkv-a-mqa"]
    trained = table.iloc[0]
    assert trained.train_tokens == 600 and trained.steps > 0 and trained.train_tok_per_s > 0
    assert trained.heldout_kl_final < trained.heldout_kl_initial
    untrained = table.iloc[1]
    assert untrained.loss == "none" and untrained.steps == 0
    assert untrained.heldout_kl_final == untrained.heldout_kl_initial == trained.heldout_kl_initial
    mqa = table.iloc[2]
    assert mqa.kv_heads == 1 and mqa.kv_cache_bytes_per_token_fp16 < trained.kv_cache_bytes_per_token_fp16


def test_curve_and_figure(runs, tmp_path):
    curve = heldout_curve(runs[0])
    assert curve["step"].is_monotonic_increasing and curve["tokens"].iloc[0] == 0
    assert len(curve) >= 3  # before, every 2 steps, after
    path = tmp_path / "fig.png"
    plot_heldout_curve(curve, heldout_curve(runs[0]), 600, "tiny", path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
