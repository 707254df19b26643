"""What a distillation run is: its settings (student, loss, scope, budget, schedule) and the files it writes."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass

from swiftkv.errors import SwiftKVError

LOSSES = ("kl", "lm", "kl+hidden")
SCOPES = ("partial", "full")
LOSS_POSITIONS = ("all", "assistant")
SCHEDULES = ("cosine", "wsd")
CHECKPOINT_FILE = "checkpoint.pt"
LOG_FILE = "train_log.jsonl"
SUMMARY_FILE = "distill.json"


@dataclass
class DistillSettings:
    """Everything that decides the trained weights (the paper's defaults), plus how often to evaluate and save."""

    num_key_value_layers: int
    key_value_group_size: int = 1
    key_value_heads: int | None = None  # MQA student: KV heads of the SwiftKV K/V (None = unchanged)
    loss: str = "kl"
    loss_positions: str = "all"  # all real tokens, or only assistant tokens (averaged over all: Snowflake's recipe)
    scope: str = "partial"
    train: bool = True  # False: the "w/o distillation" row (converted student saved untrained)
    temperature: float = 2.0
    hidden_weight: float = 1.0  # weight of the hidden-state MSE in kl+hidden
    lr: float = 3e-4
    weight_decay: float = 0.05
    warmup_ratio: float = 0.05
    # lr schedule: cosine (the tables' runs: warmup_ratio, then cosine to 0) or wsd (warmup-stable-decay, the
    # budget-scaling study: warmup_steps, then constant; at each of read_budgets a branch decays the lr linearly over
    # the last decay_ratio of that budget's steps and is read there; the run's own budget is the largest one)
    schedule: str = "cosine"
    warmup_steps: int = 2
    decay_ratio: float = 0.2
    read_budgets: tuple[int, ...] = ()
    max_grad_norm: float | None = 1.0
    tokens: int = 100_000  # training token budget per epoch (real tokens, padding excluded); 0 = all the data
    epochs: int = 1  # passes over the packed budget (the paper: 2), pack order reshuffled each epoch
    max_length: int = 2048
    batch_size: int = 1  # packed rows per optimizer step over all processes (the global batch)
    seed: int = 0
    data: str = "sharegpt"  # sharegpt (embedded) | hub (the paper's three datasets)
    chunk_size: int = 1024  # positions per chunk of full-vocabulary logits
    # evaluation and checkpoints (do not change the trained weights)
    heldout_tokens: int = 4096
    eval_every: int = 0  # steps; 0 = five evaluations over the run; -1 = none; always one before and one after
    checkpoint_every: int = 0  # steps; 0 = ten checkpoints over the run

    def validate(self) -> None:
        for name, low, low_open in (("lr", 0, True), ("weight_decay", 0, False), ("temperature", 0, True),
                                    ("hidden_weight", 0, False), ("max_grad_norm", 0, False),
                                    ("warmup_ratio", 0, False), ("decay_ratio", 0, False)):
            value = getattr(self, name)
            if value is None and name == "max_grad_norm":
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < low or (
                    low_open and value == low):
                bound = f"> {low}" if low_open else f">= {low}"
                raise SwiftKVError(f"{name} must be a finite number {bound}, got {value!r}")
        if self.loss not in LOSSES:
            raise SwiftKVError(f"unknown loss {self.loss!r}; use one of {', '.join(LOSSES)}")
        if self.scope not in SCOPES:
            raise SwiftKVError(f"unknown scope {self.scope!r}; use one of {', '.join(SCOPES)}")
        if self.loss_positions not in LOSS_POSITIONS:
            raise SwiftKVError(f"unknown loss positions {self.loss_positions!r}; use one of {', '.join(LOSS_POSITIONS)}")
        if self.temperature <= 0:
            raise SwiftKVError(f"temperature must be positive, got {self.temperature}")
        if self.tokens < 0 or self.epochs < 1:
            raise SwiftKVError(
                f"token budget must be >= 0 (0 = all data) and epochs >= 1, got {self.tokens} and {self.epochs}"
            )
        if not 0 <= self.warmup_ratio < 1:
            raise SwiftKVError(f"warmup ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.schedule not in SCHEDULES:
            raise SwiftKVError(f"unknown schedule {self.schedule!r}; use one of {', '.join(SCHEDULES)}")
        if self.schedule == "wsd":
            if not self.read_budgets or any(b <= 0 for b in self.read_budgets):
                raise SwiftKVError("the wsd schedule needs --read-budgets: positive token budgets, e.g. 2048,4096")
            if self.tokens != max(self.read_budgets):
                raise SwiftKVError(f"with --read-budgets the token budget is the largest of them "
                                   f"({max(self.read_budgets)}), got --tokens {self.tokens}")
            if not 0 < self.decay_ratio <= 1 or self.warmup_steps < 0 or self.epochs != 1:
                raise SwiftKVError("wsd needs 0 < decay ratio <= 1, warmup steps >= 0 and one epoch")
        elif self.read_budgets:
            raise SwiftKVError("--read-budgets needs --schedule wsd")
        if self.batch_size < 1 or self.chunk_size < 1 or self.heldout_tokens < 0:
            raise SwiftKVError("batch size and chunk size must be >= 1 and held-out tokens >= 0")

    def fingerprint(self, model: str) -> str:
        """Hash of what decides the weights (a checkpoint is resumed only by a run with the same fingerprint)."""
        keep = {k: v for k, v in asdict(self).items() if k not in ("eval_every", "checkpoint_every", "heldout_tokens")}
        if keep["loss_positions"] == "all":  # the default before the option existed: same fingerprint as then
            del keep["loss_positions"]
        if keep["schedule"] == "cosine":  # likewise: the wsd fields do not change a cosine run
            for k in ("schedule", "warmup_steps", "decay_ratio", "read_budgets"):
                del keep[k]
        else:
            del keep["warmup_ratio"]
            keep["read_budgets"] = sorted(keep["read_budgets"])
        return hashlib.sha256(json.dumps({"model": model, **keep}, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class RunOptions:
    """How a run is carried out, beside what it trains (``DistillSettings``); ``train``'s keyword arguments."""

    train_conversations: object = None
    heldout_conversations: object = None
    model_name: str = "model"
    checkpoint_dir: str | os.PathLike | None = None
    resume: bool = False
    cpu: bool | None = None
    mixed_precision: str | None = None
    progress: bool = True
    extra_summary: dict | None = None
    overwrite: bool = False
    teacher_cache: object = None
    save_at: dict | None = None
    log_only: bool = False
    strategy: str | None = None
    processes: int | None = None
    gradient_checkpointing: bool = False
    micro_batch_size: int | None = None  # rows per forward on each rank, gradients accumulated (None: all at once)
