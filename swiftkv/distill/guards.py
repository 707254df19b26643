"""A distillation that diverges stops, and saves nothing that looks like a result.

A non-finite training loss or gradient norm, a non-finite held-out KL, or non-finite trainable weights about to be
checkpointed end the run with ``Diverged`` (one line: where, what, the likely cause; the CLI exits with status 1).
Nothing is written to the output then: no student, no ``distill.json``. The checkpoint folder keeps the last periodic
checkpoint that passed the check (``--resume`` continues from it) and the training log up to the failure.

The trainer calls ``DivergenceGuard`` at four places: after each backward pass (loss, gradient norm), after each
held-out evaluation, before each checkpoint and before the final save (trainable weights).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from swiftkv.errors import RunFailed

HIGH_LR = 1e-2  # AdamW rates for distilling a few projections are 1e-5 .. 1e-3; above this, blame the rate first


class Diverged(RunFailed):
    """The run produced a non-finite loss, gradient, held-out KL or weight; nothing was saved as a result."""


def _finite(value) -> bool:
    if isinstance(value, torch.Tensor):
        return bool(torch.isfinite(value).all())
    return value is None or math.isfinite(value)


class DivergenceGuard:
    """Checks of one run (``settings``: its ``DistillSettings``; ``checkpoint_dir``: where its checkpoints go)."""

    def __init__(self, settings, checkpoint_dir: str | Path, mixed_precision: str = "no", start_step: int = 0,
                 agree=None):
        self.settings = settings
        # agree(flag) -> whether flag holds on every rank (swiftkv.distill.parallel.Parallel.all_true): a weight check
        # sees only this rank's shard under FSDP, and every rank must stop or none
        self.agree = agree or (lambda flag: flag)
        self.checkpoint_dir = Path(checkpoint_dir)
        self.mixed_precision = mixed_precision
        self.start_step = start_step  # steps already done (a resumed run)
        self.saved_step = start_step if start_step else None  # the last checkpoint known to be finite

    def likely_cause(self, step: int) -> str:
        lr = self.settings.lr
        if step <= 1:  # the first step's loss and the initial evaluation come before any update
            return ("the weights it starts from or the teacher's outputs are not finite: check the base model "
                    "(and the teacher cache)")
        if lr > HIGH_LR:
            return f"lr {lr:g} is likely too high (AdamW here wants 1e-5 to 1e-3; the default is 3e-4)"
        if self.mixed_precision == "fp16":
            return "fp16 autocast overflowed; use --mixed-precision bf16 or no"
        return (f"the updates grew too large: lower --lr (now {lr:g}) or clip harder with --max-grad-norm "
                f"(now {self.settings.max_grad_norm or 'off'})")

    def _fail(self, step: int, what: str, value) -> None:
        if self.saved_step is not None:
            kept = (f"the last good checkpoint (step {self.saved_step}) stays in {self.checkpoint_dir} for --resume")
        else:
            kept = "no checkpoint was saved before it"
        numeric = isinstance(value, (float, int)) or (isinstance(value, torch.Tensor) and value.numel() == 1)
        shown = f"{float(value):g}" if numeric else "not finite"
        raise Diverged(f"training diverged at step {step}: {what} is {shown}; {self.likely_cause(step)}; nothing "
                       f"was saved as a result ({kept})")

    def check_step(self, step: int, loss, grad_norm=None) -> None:
        """After a backward pass, before the optimizer steps: the loss and the gradient norm must be finite."""
        if not _finite(loss):
            self._fail(step, "the training loss", loss)
        if not _finite(grad_norm):
            self._fail(step, "the gradient norm", grad_norm)

    def check_eval(self, step: int, metrics: dict) -> None:
        """After a held-out evaluation: its KL (and every other number) must be finite."""
        for key in ("heldout_kl", *sorted(metrics)):
            value = metrics.get(key)
            if isinstance(value, (float, int)) and not isinstance(value, bool) and not math.isfinite(value):
                self._fail(step, f"the held-out {key.removeprefix('heldout_').replace('_', ' ')}", value)

    def check_weights(self, step: int, params, checkpoint: bool = False) -> None:
        """Before a checkpoint (``checkpoint``) or the final save: every trainable weight must be finite."""
        from swiftkv.distill.parallel import local_tensor

        if not self.agree(all(bool(torch.isfinite(local_tensor(p.detach())).all()) for p in params)):
            self._fail(step, "a trainable weight", None)
        if checkpoint:
            self.saved_step = step
