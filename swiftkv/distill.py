"""Distil a SwiftKV student from its own teacher (paper §3.3), on accelerate.

One model plays both parts. Per step:

1. layers ``< l`` run ONCE, without autograd (nothing there trains): their output ``h_l`` is identical for teacher
   and student;
2. teacher: layers ``>= l`` the original way (``run_layers``) on ``h_l``, under ``no_grad``;
3. student: the SwiftKV K/V from ``norm_swiftkv(h_l)`` and the SwiftKV layers ``>= l`` on ``h_l``, with autograd;
4. loss on the final hidden states through the frozen LM head, chunked over positions (``swiftkv.losses``):
   ``kl`` = T^2 * KL(teacher_T || student_T) (default, T = 2), ``lm`` = cross-entropy of the next token,
   ``kl+hidden`` = ``kl`` + w * MSE of the hidden state entering the last layer (the reference's later addition).

Scope ``partial`` trains ``norm_swiftkv`` and the ``*_swiftkv`` projections (teacher weights untouched, so the
teacher is the model itself with SwiftKV off); ``full`` also trains every student-used parameter of layers ``>= l``,
so the teacher's layers ``>= l`` are kept as a frozen copy.

Data: whole conversations rendered with the chat template, packed into rows of at most ``max_length`` tokens with
position ids restarting per conversation; transformers builds the attention-separated mask from those position
ids (no attention crosses conversations). By default the loss covers every real token of a pack (the paper's loss
and the early-2025 reference trainer's), not only the assistant's: the student must match the teacher wherever it
will be run, and prompts are most of what SwiftKV serves. ``loss_positions="assistant"`` is Snowflake's current
recipe: the KL over assistant tokens only, averaged over all positions.

With a teacher cache (``swiftkv.teacher_cache``) steps 1-2 come from disk: the packed data, h_l and the teacher's
final hidden states were computed once for every variant, and a step runs only 3-4.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from swiftkv.data import HELDOUT_SEED
from swiftkv.errors import SwiftKVError
from swiftkv.losses import distill_kl, eval_metrics, lm_cross_entropy

logger = logging.getLogger(__name__)

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
    batch_size: int = 1  # packs per step (per process)
    seed: int = 0
    data: str = "sharegpt"  # sharegpt (embedded) | hub (the paper's three datasets)
    chunk_size: int = 1024  # positions per chunk of full-vocabulary logits
    # evaluation and checkpoints (do not change the trained weights)
    heldout_tokens: int = 4096
    eval_every: int = 0  # steps; 0 = five evaluations over the run; -1 = none; always one before and one after
    checkpoint_every: int = 0  # steps; 0 = ten checkpoints over the run

    def validate(self) -> None:
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


# -- teacher and student in one module --------------------------------------------------------------------------


@dataclass
class DistillOutput:
    student: torch.Tensor  # B,S,H final (normed) hidden states of the student, with autograd
    teacher: torch.Tensor  # B,S,H final (normed) hidden states of the teacher, no autograd
    student_pre_last: torch.Tensor | None = None  # B,S,H stream entering the last layer (kl+hidden only)
    teacher_pre_last: torch.Tensor | None = None


class DistillModel(nn.Module):
    """A SwiftKV model as teacher and student, sharing the layers below l. ``forward`` returns both final hidden
    states; the LM head stays outside (the chunked losses apply it)."""

    def __init__(self, model: nn.Module, scope: str = "partial", keep_pre_last: bool = False,
                 teacher_cached: bool = False):
        super().__init__()
        self.model = model
        self.keep_pre_last = keep_pre_last
        cfg = model.config
        self.l, self.L = cfg.num_key_value_layers, cfg.num_hidden_layers
        # full scope trains the student's layers >= l: the teacher keeps a frozen copy of the originals (not needed
        # when the teacher's outputs come from a teacher cache)
        self.teacher_layers = None
        if scope == "full" and not teacher_cached:
            self.teacher_layers = nn.ModuleList(copy.deepcopy(model.model.layers[i]) for i in range(self.l, self.L))
            self.teacher_layers.requires_grad_(False)

    @property
    def inner(self):
        return self.model.model

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, boundary: torch.Tensor | None = None,
                teacher: torch.Tensor | None = None, teacher_pre_last: torch.Tensor | None = None) -> DistillOutput:
        """Both models on a batch; with ``boundary`` (h_l) and ``teacher`` from a teacher cache only the student's
        layers >= l run (the masks and rotary embeddings still come from the batch's position ids)."""
        if boundary is None:
            state, boundary = self.prefix(input_ids, position_ids)
            return self.upper(state, boundary)
        state = self.inner.prepare_prefix(input_ids=input_ids, position_ids=position_ids, use_cache=False)
        student, student_pre = self.student_upper(state, boundary)
        return DistillOutput(student, teacher, student_pre, teacher_pre_last)

    @torch.no_grad()
    def prefix(self, input_ids, position_ids):
        """Layers < l, once for both (no autograd: nothing there trains). Returns (PrefixState, h_l)."""
        state = self.inner.prepare_prefix(input_ids=input_ids, position_ids=position_ids, use_cache=False)
        return state, self.inner.run_layers(state, 0, self.l)

    def upper(self, state, boundary: torch.Tensor) -> DistillOutput:
        teacher, teacher_pre = self.teacher_upper(state, boundary)
        student, student_pre = self.student_upper(state, boundary)
        return DistillOutput(student, teacher, student_pre, teacher_pre)

    @torch.no_grad()
    def teacher_upper(self, state, boundary):
        inner, hidden, pre_last = self.inner, boundary, None
        layers = self.teacher_layers if self.teacher_layers is not None else inner.layers[self.l:]
        for i, layer in zip(range(self.l, self.L), layers):
            if i == self.L - 1:
                pre_last = hidden
            hidden = layer(
                hidden,
                attention_mask=state.masks[inner.layer_type(i)],
                position_embeddings=state.position_embeddings,
                position_ids=state.position_ids,
                cache=None,
                use_cache=False,
            )
        return inner.norm(hidden), pre_last

    def student_upper(self, state, boundary):
        inner, captured = self.inner, {}
        hook = None
        if self.keep_pre_last and self.l < self.L:
            def grab(module, args, kwargs):
                captured["h"] = args[0] if args else kwargs["hidden_states"]
            hook = inner.layers[self.L - 1].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            key_values = inner.swiftkv_key_values(boundary, state)
            hidden = inner.run_swiftkv_layers(
                boundary, key_values, state.masks, state.position_embeddings, state.position_ids
            )
        finally:
            if hook is not None:
                hook.remove()
        return inner.norm(hidden), captured.get("h")


def compute_loss(out: DistillOutput, batch: dict, head: nn.Module, settings: DistillSettings) -> torch.Tensor:
    """Mean loss per counted position: every real token for kl / kl+hidden, tokens with a next token for lm.

    ``loss_positions="assistant"`` (Snowflake's current recipe) sums the KL (or cross-entropy) over assistant tokens
    only and still divides by every counted position; the hidden-state MSE stays over every position."""
    every = batch["labels"] >= 0 if settings.loss == "lm" else batch["loss_mask"]
    n = every.sum().clamp(min=1)
    sel = every & batch["assistant_mask"] if settings.loss_positions == "assistant" else every
    if settings.loss == "lm":
        return lm_cross_entropy(out.student[sel], batch["labels"][sel], head, settings.chunk_size) / n
    loss = distill_kl(out.student[sel], out.teacher[sel], head, settings.temperature, settings.chunk_size) / n
    if settings.loss == "kl+hidden" and out.student_pre_last is not None:
        loss = loss + settings.hidden_weight * F.mse_loss(
            out.student_pre_last[every].float(), out.teacher_pre_last[every].float()
        )
    return loss


# -- building the student -----------------------------------------------------------------------------------------


def build_student(base_model, settings: DistillSettings):
    """Convert the base model (reference init; MQA heads mean-pooled) and set what trains."""
    from swiftkv.convert import convert_to_swiftkv, set_trainable

    student = convert_to_swiftkv(
        base_model, settings.num_key_value_layers, settings.key_value_group_size, settings.key_value_heads
    )
    if settings.scope == "full":
        set_trainable(student, "full")
        # the student never uses the teacher's q/k/v projections of layers >= l: keep them frozen (and original)
        l = student.config.num_key_value_layers
        for i in range(l, student.config.num_hidden_layers):
            attn = student.model.layers[i].self_attn
            for name in ("q_proj", "k_proj", "v_proj"):
                getattr(attn, name).requires_grad_(False)
    else:
        set_trainable(student, "partial")
    return student


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


# -- held-out evaluation ------------------------------------------------------------------------------------------


class HeldOut:
    """A fixed held-out sample: the shared prefix and the teacher's final hidden states are computed once (neither
    changes during training), so each evaluation only runs the student's layers >= l and the head."""

    def __init__(self, pair: DistillModel, batches: list[dict], chunk_size: int):
        self.pair, self.chunk_size, self.items = pair, chunk_size, []
        with torch.no_grad():
            for batch in batches:
                if "boundary" in batch:  # from the teacher cache
                    state = pair.inner.prepare_prefix(input_ids=batch["input_ids"],
                                                      position_ids=batch["position_ids"], use_cache=False)
                    boundary, teacher = batch["boundary"], batch["teacher"]
                else:
                    state, boundary = pair.prefix(batch["input_ids"], batch["position_ids"])
                    teacher, _ = pair.teacher_upper(state, boundary)
                mask = batch["loss_mask"]
                self.items.append((state, boundary, mask, teacher[mask], batch["labels"][mask]))

    @torch.no_grad()
    def evaluate(self, per_row: bool = False) -> dict:
        """Pooled held-out numbers; with ``per_row`` also each held-out batch's sums (``heldout_rows``: kl_sum,
        top1_sum, positions), the unit a bootstrap over held-out rows resamples."""
        if not self.items:
            return {}
        head = self.pair.model.get_output_embeddings()
        total: dict[str, float] = {}
        rows = []
        for state, boundary, mask, teacher, labels in self.items:
            student, _ = self.pair.student_upper(state, boundary)
            sums = eval_metrics(student[mask], teacher, labels, head, self.chunk_size)
            rows.append({k: sums[k] for k in ("kl_sum", "top1_sum", "positions")})
            for k, v in sums.items():
                total[k] = total.get(k, 0) + v
        n, m = max(total["positions"], 1), max(total["labelled"], 1)
        out = {
            "heldout_kl": total["kl_sum"] / n,
            "heldout_top1": total["top1_sum"] / n,
            "heldout_student_nll": total["student_nll_sum"] / m,
            "heldout_teacher_nll": total["teacher_nll_sum"] / m,
            "heldout_tokens": int(total["positions"]),
        }
        if per_row:
            out["heldout_rows"] = rows
        return out


# -- data --------------------------------------------------------------------------------------------------------


def prepare_data(tokenizer, settings: DistillSettings, train_conversations, heldout_conversations, cache=None):
    """Training items for the token budget (seeded) and the fixed held-out items, with their reports. An item is a
    pack and, with a teacher cache, the cache rows of its tokens (the packs then come from the cache's stream: no
    conversation is read or rendered); without one, None."""
    from swiftkv.data import PackReport, pack_conversations

    train_report, heldout_report = PackReport(), PackReport()
    train, heldout = [], []
    if settings.train:
        budget = settings.tokens or None
        if cache is not None:
            packs, train_report, rows = cache.packs("train", budget, settings.max_length)
            train = list(zip(packs, rows))
        else:
            train = [(p, None) for p in pack_conversations(
                train_conversations, tokenizer, settings.max_length, budget, settings.seed, train_report,
                assistant_masks=settings.loss_positions == "assistant",
            )]
        if not train:
            raise SwiftKVError("no training data: every conversation was skipped; check the data source and template")
        if settings.epochs > 1:  # later epochs: the same packs in another order
            import random

            first = list(train)
            for epoch in range(1, settings.epochs):
                order = list(first)
                random.Random(settings.seed + epoch).shuffle(order)
                train += order
    if settings.heldout_tokens and cache is not None:
        packs, heldout_report, rows = cache.packs("heldout", settings.heldout_tokens, settings.max_length)
        heldout = list(zip(packs, rows))
    elif settings.heldout_tokens and heldout_conversations:
        heldout = [(p, None) for p in pack_conversations(
            heldout_conversations, tokenizer, settings.max_length, settings.heldout_tokens, HELDOUT_SEED, heldout_report
        )]
    return train, heldout, {"train": asdict(train_report), "heldout": asdict(heldout_report)}


# -- checkpoints and log -----------------------------------------------------------------------------------------


class RunLog:
    """JSONL training log, appended and flushed line by line (a killed run keeps what it logged)."""

    def __init__(self, path: Path, keep_until_step: int | None = None, enabled: bool = True):
        self.path, self.enabled = path, enabled
        if not enabled:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if keep_until_step is not None and path.exists():  # resumed: drop what came after the checkpoint
            kept = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("step", 0) <= keep_until_step]
        path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        self.records = kept

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.records.append(record)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def save_checkpoint(path: Path, pair: DistillModel, optimizer, scheduler, state: dict) -> None:
    """Trainable weights, optimizer and scheduler state, progress; written atomically."""
    from swiftkv.io import atomic_path

    payload = {
        "trainable": {n: p.detach().cpu() for n, p in trainable_parameters(pair).items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        **state,
    }
    with atomic_path(path, overwrite=True) as tmp:  # our own scratch file in our checkpoint directory
        torch.save(payload, tmp)


def load_checkpoint(path: Path, fingerprint: str) -> dict | None:
    if not path.is_file():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=False)
    if payload.get("fingerprint") != fingerprint:
        logger.warning("ignoring %s: it was made with other settings; starting from the beginning", path)
        return None
    return payload


# -- the training run --------------------------------------------------------------------------------------------


class Interrupted(RuntimeError):
    """Raised by ``interrupt_after`` (tests of --resume: a run killed after some step)."""


def _auto_every(total: int, times: int) -> int:
    return max(1, math.ceil(total / times))


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


def _open_cache(teacher_cache, student, settings: DistillSettings):
    """The run's teacher cache (opened and checked against the run: one line if it does not fit), or None."""
    if teacher_cache is None:
        return None
    from swiftkv.teacher_cache import TeacherCache, weights_fingerprint

    cache = teacher_cache if isinstance(teacher_cache, TeacherCache) else TeacherCache(teacher_cache)
    cache.check(model=weights_fingerprint(student), data=settings.data, seed=settings.seed,
                max_length=settings.max_length, tokens=settings.tokens if settings.train else 1,
                heldout_tokens=settings.heldout_tokens, layer=settings.num_key_value_layers,
                need_pre_last=settings.loss == "kl+hidden", num_hidden_layers=student.config.num_hidden_layers)
    if settings.loss_positions == "assistant" and any(s.assistant is None for s in cache.splits["train"].segments):
        raise SwiftKVError(f"teacher cache {cache.path} has no assistant masks; build it again for "
                           "--loss-positions assistant")
    return cache


def train(
    base_model,
    tokenizer,
    settings: DistillSettings,
    output: str | os.PathLike,
    *,
    train_conversations,
    heldout_conversations,
    model_name: str = "model",
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
    cpu: bool | None = None,
    mixed_precision: str | None = None,
    progress: bool = True,
    interrupt_after: int | None = None,
    extra_summary: dict | None = None,
    overwrite: bool = False,
    teacher_cache=None,
    save_at: dict[int, str | os.PathLike] | None = None,
    log_only: bool = False,
) -> dict:
    """Convert ``base_model`` to a SwiftKV student, distil it, save it to ``output``; return the run summary.
    ``log_only``: ``output`` gets the run's summary and training log without the student's weights (a run that is
    read only through its held-out numbers, e.g. an lr sweep).

    ``teacher_cache`` (a ``TeacherCache`` or its directory): the teacher's side of every step and held-out number
    and the packed data come from it (``swiftkv.teacher_cache``); the conversations are then not needed.

    With ``settings.schedule == "wsd"`` every budget of ``settings.read_budgets`` is read along the way (held-out KL
    and top-1 per held-out row in the log's ``budget`` events and the summary's ``budget_reads``); ``output`` gets
    the largest budget's student and ``save_at`` {budget: directory} the students of other budgets."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm
    from transformers import get_cosine_schedule_with_warmup

    from swiftkv.device import fast_dtype
    from swiftkv.cache import expected_cache_bytes
    from swiftkv.convert import save_model_dir
    from swiftkv.data import collate_packs
    from swiftkv.io import MARKER, atomic_dir, check_output_dir, mark_dir, remove_own_files
    from swiftkv.teacher_cache import cached_batch

    settings.validate()
    started = time.perf_counter()
    # before any work: the output and the checkpoint directory must be ours to (re)write
    output = check_output_dir(output, overwrite)
    save_at = {int(b): check_output_dir(d, overwrite) for b, d in (save_at or {}).items()}
    unread = sorted(set(save_at) - set(settings.read_budgets))
    if unread:
        raise SwiftKVError(f"--save-at names budgets the run does not read: {unread}; use budgets of --read-budgets")
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir else output.with_name(output.name + ".ckpt")
    check_output_dir(ckpt_dir, overwrite)
    fingerprint = settings.fingerprint(model_name)
    if cpu is None:
        cpu = not torch.cuda.is_available()
    if mixed_precision is None:
        mixed_precision = "bf16" if fast_dtype("cpu" if cpu else "cuda") == torch.bfloat16 else "no"
    accelerator = Accelerator(cpu=cpu, mixed_precision=mixed_precision)
    main = accelerator.is_main_process
    torch.manual_seed(settings.seed)

    student = build_student(base_model, settings)
    cache = _open_cache(teacher_cache, student, settings)
    pair = DistillModel(student, settings.scope, keep_pre_last=settings.loss == "kl+hidden",
                        teacher_cached=cache is not None).to(accelerator.device)
    params = list(trainable_parameters(pair).values())
    n_trainable = sum(p.numel() for p in params)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    train_items, heldout_items, data_report = prepare_data(
        tokenizer, settings, train_conversations, heldout_conversations, cache
    )
    logger.info("data: %s", data_report)
    dtype = next(student.parameters()).dtype
    pre_last = student.config.num_hidden_layers - 1 if settings.loss == "kl+hidden" else None

    def collate_with(split: str):
        def collate(items):
            packs, rows = [p for p, _ in items], [r for _, r in items]
            if cache is None:
                return collate_packs(packs, pad_id)
            return cached_batch(cache, split, packs, rows, settings.num_key_value_layers, pad_id, dtype, pre_last)

        return collate

    heldout_batches = [
        {k: v.to(accelerator.device) for k, v in collate_with("heldout")([item]).items()} for item in heldout_items
    ]
    heldout = HeldOut(pair, heldout_batches, settings.chunk_size)

    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay) if params else None
    loader = DataLoader(train_items, batch_size=settings.batch_size, shuffle=False, collate_fn=collate_with("train"))
    if settings.train:
        pair, optimizer, loader = accelerator.prepare(pair, optimizer, loader)
    total_steps = len(loader) if settings.train else 0
    scheduler, plan = None, []
    if settings.train and settings.schedule == "wsd":
        bs = settings.batch_size
        plan = wsd_plan(settings, [sum(len(p) for p, _ in train_items[i:i + bs])
                                   for i in range(0, len(train_items), bs)])
        total_steps = plan[-1].branch_at  # the stable run; the last branch ends the run
        warm = settings.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    elif settings.train:
        scheduler = get_cosine_schedule_with_warmup(
            optimizer, math.ceil(settings.warmup_ratio * total_steps), total_steps
        )
    raw = accelerator.unwrap_model(pair)
    eval_every = settings.eval_every or _auto_every(total_steps, 5)
    if eval_every < 0:  # only the evaluations before and after training
        eval_every = total_steps + 1
    ckpt_every = settings.checkpoint_every or _auto_every(total_steps, 10)

    start_step, tokens_seen, train_seconds = 0, 0, 0.0
    payload = load_checkpoint(ckpt_dir / CHECKPOINT_FILE, fingerprint) if (resume and settings.train) else None
    if resume and settings.train and payload is None and not (ckpt_dir / CHECKPOINT_FILE).is_file():
        logger.warning("--resume: nothing to resume in %s (no %s); starting from the beginning",
                       ckpt_dir, CHECKPOINT_FILE)
    if main:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        mark_dir(ckpt_dir, "distillation checkpoints (removed when the run ends)")
        if payload is None:  # a fresh start: a stale checkpoint must not be resumed with this run's log later
            (ckpt_dir / CHECKPOINT_FILE).unlink(missing_ok=True)
    if payload is not None:
        with torch.no_grad():
            for name, p in trainable_parameters(raw).items():
                p.copy_(payload["trainable"][name])
        optimizer.load_state_dict(payload["optimizer"])
        scheduler.load_state_dict(payload["scheduler"])
        start_step, tokens_seen, train_seconds = payload["step"], payload["tokens"], payload["train_seconds"]
        logger.info("resuming from %s at step %d/%d", ckpt_dir, start_step, total_steps)
    log = RunLog(ckpt_dir / LOG_FILE, keep_until_step=start_step if payload is not None else None, enabled=main)

    def evaluate(step: int) -> dict:
        metrics = heldout.evaluate()
        if metrics:
            log.write({"event": "eval", "step": step, "tokens": tokens_seen, **metrics})
        return metrics

    initial = evaluate(0) if start_step == 0 else None
    head = raw.model.get_output_embeddings()
    bar = tqdm(total=total_steps, initial=start_step, desc="distill", unit="step", disable=not (progress and main))
    data_iter = accelerator.skip_first_batches(loader, start_step) if start_step else loader
    step = start_step

    def train_step(batch: dict, lr: float | None = None) -> tuple[float, int, float, float]:
        """One optimizer step at the scheduler's lr (or at ``lr``): (loss, tokens, seconds, lr used)."""
        t0 = time.perf_counter()
        if lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        out = pair(batch["input_ids"], batch["position_ids"], batch.get("boundary"), batch.get("teacher"),
                   batch.get("teacher_pre_last"))
        with accelerator.autocast():
            loss = compute_loss(out, batch, head, settings)
        accelerator.backward(loss)
        if settings.max_grad_norm:
            accelerator.clip_grad_norm_(params, settings.max_grad_norm)
        used = optimizer.param_groups[0]["lr"]  # the rate this step uses
        optimizer.step()
        if lr is None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        n_tokens = int(accelerator.reduce(batch["loss_mask"].sum(), "sum"))
        return float(accelerator.reduce(loss.detach(), "mean")), n_tokens, time.perf_counter() - t0, used

    # budgets a resumed run already read (their records survive in the log up to the checkpoint's step)
    done_reads = {r["budget"]: r for r in log.records if r["event"] == "budget"} if main else {}

    def read_budgets(at: int) -> dict | None:
        """The wsd branches that leave the stable run after ``at`` steps: decay, read, save, and (except after the
        last budget) restore the stable state. Returns the last budget's read once it is done."""
        nonlocal train_seconds
        for read in (r for r in plan if r.branch_at == at and r.budget not in done_reads):
            last = read is plan[-1]
            saved = None if last else ([p.detach().clone() for p in params], copy.deepcopy(optimizer.state_dict()))
            decay, bs = read.steps - read.branch_at, settings.batch_size
            for i in range(decay):
                j = read.branch_at + i
                batch = collate_with("train")(train_items[j * bs:(j + 1) * bs])
                loss_value, n_tokens, dt, used = train_step({k: v.to(accelerator.device) for k, v in batch.items()},
                                                            lr=settings.lr * (1 - i / decay))
                train_seconds += dt
                log.write({"event": "train", "branch": read.budget, "step": at, "branch_step": j + 1,
                           "loss": loss_value, "lr": used, "step_s": dt, "tok_per_s": n_tokens / dt})
            pair.eval()
            metrics = heldout.evaluate(per_row=True)
            pair.train()
            record = {"event": "budget", "budget": read.budget, "step": at, "steps": read.steps,
                      "tokens": read.tokens, "decay_steps": decay, **metrics}
            log.write(record)
            done_reads[read.budget] = record
            if read.budget in save_at and main:  # staged in the checkpoint directory (a resumed run keeps it)
                save_model_dir(raw.model.swiftkv(True), tokenizer, ckpt_dir / f"budget-{read.budget}",
                               files={SUMMARY_FILE: json.dumps({"model": model_name, "settings": asdict(settings),
                                                                "fingerprint": fingerprint, "read": record},
                                                               indent=2) + "\n"},
                               overwrite=True, what=f"distilled checkpoint at {read.budget} tokens")
            if saved is not None:  # back to the stable run: the optimizer's own parameters and state
                with torch.no_grad():
                    for p, value in zip(params, saved[0], strict=True):
                        p.copy_(value)
                optimizer.load_state_dict(saved[1])
            if last:
                return record
        return None

    last_read = None
    if settings.train:
        pair.train()
        if plan:
            last_read = read_budgets(step)
        for batch in data_iter:
            if plan and step >= total_steps:
                break
            loss_value, n_tokens, dt, lr = train_step(batch)
            step += 1
            tokens_seen += n_tokens
            train_seconds += dt
            log.write({"event": "train", "step": step, "tokens": tokens_seen, "loss": loss_value,
                       "lr": lr, "step_s": dt, "tok_per_s": n_tokens / dt})
            bar.set_postfix(loss=f"{loss_value:.4f}", tok_s=f"{tokens_seen / train_seconds:.0f}")
            bar.update()
            if plan:
                last_read = read_budgets(step) or last_read
            if step % eval_every == 0 and step < total_steps:
                evaluate(step)
            if step % ckpt_every == 0 and step < total_steps and main:
                save_checkpoint(ckpt_dir / CHECKPOINT_FILE, raw, optimizer, scheduler,
                                {"fingerprint": fingerprint, "step": step, "tokens": tokens_seen,
                                 "train_seconds": train_seconds})
            accelerator.wait_for_everyone()
            if interrupt_after is not None and step >= interrupt_after:
                bar.close()
                raise Interrupted(f"interrupted after step {step}")
        pair.eval()
    bar.close()
    if last_read is not None:  # wsd: the run ends with its largest budget's branch, read there
        step, tokens_seen = last_read["steps"], last_read["tokens"]
        final = {k: v for k, v in last_read.items() if k.startswith("heldout") and k != "heldout_rows"}
        log.write({"event": "eval", "step": step, "tokens": tokens_seen, **final})
    else:
        final = evaluate(step) if step > 0 or initial is None else initial

    records = log.records if main else []
    evals = [r for r in records if r["event"] == "eval"]
    model = raw.model.swiftkv(True)
    summary = {
        "model": model_name,
        "settings": asdict(settings),
        "fingerprint": fingerprint,
        "data": data_report,
        "steps": step,
        "train_tokens": tokens_seen,
        "train_seconds": train_seconds,
        "train_tok_per_s": tokens_seen / train_seconds if train_seconds else None,
        "wall_seconds_this_invocation": time.perf_counter() - started,
        "trainable_parameters": n_trainable,
        "heldout_initial": {k: v for k, v in evals[0].items() if k.startswith("heldout")} if evals else {},
        "heldout_final": final,
        "kv_cache_bytes_per_token_fp16": expected_cache_bytes(model.config, 1, bytes_per_value=2),
        "processes": accelerator.num_processes,
        "mixed_precision": mixed_precision,
        "device": str(accelerator.device),
        "teacher_cache": None if cache is None else {"path": str(cache.path), "key": asdict(cache.key),
                                                      "build": cache.build},
        **({"budget_reads": [done_reads[r.budget] for r in plan]} if plan else {}),
        **(extra_summary or {}),
    }
    if main:
        if mixed_precision == "bf16":
            model.to(torch.bfloat16)
        files = {SUMMARY_FILE: json.dumps(summary, indent=2) + "\n"}
        if (ckpt_dir / LOG_FILE).exists():
            files[LOG_FILE] = ckpt_dir / LOG_FILE
        if log_only:  # the summary and the log only
            save_model_dir(None, None, output, files=files, overwrite=overwrite, what="distillation log (--log-only)")
        else:
            save_model_dir(model, tokenizer, output, files=files, overwrite=overwrite, what="distilled checkpoint")
        for budget, target in save_at.items():  # the students read at other budgets, from their staging place
            staged = ckpt_dir / f"budget-{budget}"
            with atomic_dir(target, overwrite=overwrite, what=f"distilled checkpoint at {budget} tokens") as tmp:
                for item in staged.iterdir():
                    if item.name != MARKER:
                        os.replace(item, tmp / item.name)
            remove_own_files(staged, [MARKER])
        remove_own_files(ckpt_dir, [CHECKPOINT_FILE, LOG_FILE, MARKER])
    accelerator.wait_for_everyone()
    return summary
