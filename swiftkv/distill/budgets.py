"""Warmup-stable-decay budget reads (``--schedule wsd``): the plan (which step each budget's branch leaves the stable
run at, and how long it decays) and the reads themselves, a part of ``swiftkv.distill.trainer.Distillation``: decay,
read the held-out rows, log, save the budget's student, return to the stable run."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from swiftkv.distill.checkpoints import gather_model
from swiftkv.distill.settings import SUMMARY_FILE, DistillSettings


@dataclass(frozen=True)
class BudgetRead:
    """Where a wsd run reads one budget: ``steps`` steps reach ``tokens`` (>= ``budget``) training tokens; the
    branch leaves the stable run after ``branch_at`` steps and decays over the last ``steps - branch_at``."""

    budget: int
    steps: int
    tokens: int
    branch_at: int


def wsd_plan(settings: DistillSettings, batch_tokens: list[int]) -> list[BudgetRead]:
    """The reads of a wsd run, smallest budget first, from the training tokens of each batch in order: a budget's
    steps are the fewest whose tokens reach it (all of them if the data run out first)."""
    cumulative, total = [], 0
    for n in batch_tokens:
        total += n
        cumulative.append(total)
    plan = []
    for budget in sorted(set(settings.read_budgets)):
        steps = next((i + 1 for i, c in enumerate(cumulative) if c >= budget), len(cumulative))
        decay = max(1, math.ceil(settings.decay_ratio * steps))
        plan.append(BudgetRead(budget, steps, cumulative[steps - 1], steps - decay))
    return plan


class BudgetReads:
    """The budget reads of a ``Distillation`` (its attributes: plan, params, optimizer, settings, log, guard, ...)."""

    def save_student(self, target: Path, files: dict, overwrite: bool, what: str) -> None:
        from swiftkv.models.convert import save_model_dir

        model = gather_model(self.raw, self.par)  # a collective under FSDP
        if self.main:
            save_model_dir(model.swiftkv(True), self.tokenizer, target, files=files, overwrite=overwrite, what=what)

    def read_budgets(self, at: int) -> dict | None:
        """The wsd branches that leave the stable run after ``at`` steps: decay, read, save, and (except after the
        last budget) restore the stable state. Returns the last budget's read once it is done."""
        for read in (r for r in self.plan if r.branch_at == at and r.budget not in self.done_reads):
            last = read is self.plan[-1]
            saved = (None if last else
                     ([p.detach().clone() for p in self.params], copy.deepcopy(self.optimizer.state_dict())))
            record = self._read_budget(read, at)
            if saved is not None:  # back to the stable run: the optimizer's own parameters and state
                with torch.no_grad():
                    for p, value in zip(self.params, saved[0], strict=True):
                        p.copy_(value)
                self.optimizer.load_state_dict(saved[1])
            if last:
                return record
        return None

    def _read_budget(self, read: BudgetRead, at: int) -> dict:
        """One branch: decay from the stable run to ``read.steps`` steps, read the held-out rows, log (and save)."""
        decay = read.steps - read.branch_at
        for i in range(decay):
            j = read.branch_at + i
            loss_value, n_tokens, dt, used = self.train_step(self.step_batch(j),
                                                             lr=self.settings.lr * (1 - i / decay), at=j + 1)
            self.train_seconds += dt
            self.log.write({"event": "train", "branch": read.budget, "step": at, "branch_step": j + 1,
                            "loss": loss_value, "lr": used, "step_s": dt, "tok_per_s": n_tokens / dt})
        self.pair.eval()
        with self.autocast(evaluation=True):
            metrics = self.heldout.evaluate(per_row=True)
        self.guard.check_eval(at, metrics)
        self.pair.train()
        record = {"event": "budget", "budget": read.budget, "step": at, "steps": read.steps,
                  "tokens": read.tokens, "decay_steps": decay, **metrics}
        self.log.write(record)
        self.done_reads[read.budget] = record
        if read.budget in self.save_at:  # staged in the checkpoint directory (a resumed run keeps it)
            summary = {"model": self.options.model_name, "settings": asdict(self.settings),
                       "fingerprint": self.fingerprint, "read": record}
            self.save_student(self.ckpt_dir / f"budget-{read.budget}", {SUMMARY_FILE: json.dumps(summary, indent=2)
                                                                        + "\n"},
                              overwrite=True, what=f"distilled checkpoint at {read.budget} tokens")
        return record
