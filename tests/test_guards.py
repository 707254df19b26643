"""A diverging distillation stops with one line and saves nothing that looks like a result (swiftkv.distill.guards)."""

from __future__ import annotations

import math

import pytest
import torch

from swiftkv.distill import DistillSettings, train
from swiftkv.distill.guards import Diverged, DivergenceGuard
from tests.conftest import tiny_base, tiny_conversations, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_each_check_names_the_step_the_value_and_the_likely_cause(tmp_path):
    guard = DivergenceGuard(DistillSettings(num_key_value_layers=2, lr=3e4), tmp_path / "out.ckpt")
    guard.check_step(3, torch.tensor(0.5), torch.tensor(2.0))  # finite: passes
    guard.check_eval(2, {"heldout_kl": 0.1, "heldout_top1": 0.5, "heldout_rows": [1.0]})
    guard.check_weights(2, [torch.zeros(3)], checkpoint=True)
    with pytest.raises(Diverged, match=r"^training diverged at step 3: the training loss is nan; lr 30000 is likely "
                       r"too high .*the last good checkpoint \(step 2\) stays in .*out.ckpt for --resume\)$"):
        guard.check_step(3, torch.tensor(math.nan), torch.tensor(1.0))
    with pytest.raises(Diverged, match="at step 4: the gradient norm is inf"):
        guard.check_step(4, torch.tensor(0.5), torch.tensor(math.inf))
    with pytest.raises(Diverged, match="at step 5: the held-out kl is nan"):
        guard.check_eval(5, {"heldout_kl": math.nan})
    with pytest.raises(Diverged, match="at step 6: a trainable weight is not finite"):
        guard.check_weights(6, [torch.tensor([1.0, math.inf])], checkpoint=True)
    calm = DivergenceGuard(DistillSettings(num_key_value_layers=2, lr=3e-4, max_grad_norm=None), tmp_path / "c")
    with pytest.raises(Diverged, match="lower --lr \\(now 0.0003\\) or clip harder with --max-grad-norm \\(now off\\); "
                       "nothing was saved as a result \\(no checkpoint was saved before it\\)"):
        calm.check_step(9, torch.tensor(math.nan))
    with pytest.raises(Diverged, match="at step 1: .* the weights it starts from or the teacher's outputs are not"):
        calm.check_step(1, torch.tensor(math.nan))


def test_a_model_that_starts_non_finite_stops_before_training_and_writes_nothing(tmp_path):
    base = tiny_base(num_hidden_layers=4)
    with torch.no_grad():
        base.model.layers[3].mlp.down_proj.weight[0, 0] = math.nan  # a layer the student runs (>= l)
    settings = DistillSettings(num_key_value_layers=2, tokens=600, max_length=96, heldout_tokens=200, batch_size=2)
    with pytest.raises(Diverged, match="at step 0: the held-out kl is nan; the weights it starts from"):
        train(base, tiny_tokenizer(), settings, tmp_path / "out", train_conversations=tiny_conversations(40),
              heldout_conversations=tiny_conversations(15, 1, "h"), mixed_precision="no", progress=False)
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in (tmp_path / "out.ckpt").iterdir()) == [".swiftkv-output.json", "train_log.jsonl"]
