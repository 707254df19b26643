"""What a distillation run settles before its first step: its output folders, the precision its weights meet in, its
packed data (once, shared by the ranks), its teacher cache and its learning-rate schedule (with the warmup-stable-decay plan
of ``swiftkv.distill.budgets``)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from swiftkv.distill.batches import prepare_data
from swiftkv.distill.budgets import wsd_plan
from swiftkv.distill.settings import DistillSettings
from swiftkv.errors import SwiftKVError


def auto_every(total: int, times: int) -> int:
    return max(1, math.ceil(total / times))


def open_cache(teacher_cache, student, settings: DistillSettings, par=None):
    """The run's teacher cache (opened and checked against the run: one line if it does not fit), or None. ``par``:
    the weights are rank 0's alone (the other ranks' model is on the meta device), so is their fingerprint."""
    if teacher_cache is None:
        return None
    from swiftkv.distill.teacher_cache import TeacherCache, weights_fingerprint

    cache = teacher_cache if isinstance(teacher_cache, TeacherCache) else TeacherCache(teacher_cache)
    fingerprint = par.broadcast_object(weights_fingerprint(student) if par.main else None) if par else \
        weights_fingerprint(student)
    cache.check(model=fingerprint, data=settings.data, seed=settings.seed,
                max_length=settings.max_length, tokens=settings.tokens if settings.train else 1,
                heldout_tokens=settings.heldout_tokens, layer=settings.num_key_value_layers,
                need_pre_last=settings.loss == "kl+hidden", num_hidden_layers=student.config.num_hidden_layers)
    if settings.loss_positions == "assistant" and any(s.assistant is None for s in cache.splits["train"].segments):
        raise SwiftKVError(f"teacher cache {cache.path} has no assistant masks; build it again for "
                           "--loss-positions assistant")
    return cache




def check_outputs(settings: DistillSettings, output, save_at: dict | None, checkpoint_dir, overwrite: bool):
    """Before any work: (output, {budget: folder}, checkpoint folder), each ours to (re)write (one line if not)."""
    from swiftkv.io import check_output_dir

    output = check_output_dir(output, overwrite)
    save_at = {int(b): check_output_dir(d, overwrite) for b, d in (save_at or {}).items()}
    unread = sorted(set(save_at) - set(settings.read_budgets))
    if unread:
        raise SwiftKVError(f"--save-at names budgets the run does not read: {unread}; use budgets of --read-budgets")
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir else output.with_name(output.name + ".ckpt")
    check_output_dir(ckpt_dir, overwrite)
    return output, save_at, ckpt_dir


def choose_precision(base_model, cpu: bool | None, mixed_precision: str | None) -> tuple[bool, set, str]:
    """(cpu, the frozen weights' dtypes other than fp32, the autocast mode: no, bf16 or fp16). The frozen weights'
    dtype (--dtype) decides the mode unless one is given; a mode that cannot meet them is refused in one line."""
    from swiftkv.device import fast_dtype

    if cpu is None:
        cpu = not torch.cuda.is_available()
    frozen = {p.dtype for p in base_model.parameters()} - {torch.float32}
    if mixed_precision is None:
        fast = fast_dtype("cpu" if cpu else "cuda") == torch.bfloat16
        mixed_precision = ("bf16" if frozen == {torch.bfloat16} or fast
                           else "fp16" if frozen == {torch.float16} else "no")
    elif frozen and mixed_precision == "no":
        held = min(map(str, frozen)).removeprefix("torch.")
        raise SwiftKVError(f"the frozen weights are {held} (--dtype) while the trainable ones stay fp32: they meet only "
                           "under autocast; use --mixed-precision bf16 (or --dtype float32)")
    return cpu, frozen, mixed_precision


def load_data(par, tokenizer, settings: DistillSettings, train_conversations, heldout_conversations, cache,
              packed: Path, ckpt_dir: Path):
    """(training rows, held-out rows, data report). A teacher cache holds the packed stream (every rank reads it);
    one process packs in memory; N ranks without a cache: rank 0 tokenises and packs once into ``packed``, a file
    every rank maps (``swiftkv.distill.packed_file``)."""
    from swiftkv.distill.packed_file import PackedRows, write_packed

    if cache is not None or par.world == 1:
        return prepare_data(tokenizer, settings, train_conversations, heldout_conversations, cache)
    small = None
    if par.main:
        items, heldout_items, data_report = prepare_data(tokenizer, settings, train_conversations,
                                                         heldout_conversations)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        write_packed(packed, [p for p, _ in items])
        small = (heldout_items, data_report)
        del items
    heldout_items, data_report = par.broadcast_object(small)  # after rank 0 wrote the file
    return PackedRows(packed), heldout_items, data_report


def make_schedule(settings: DistillSettings, optimizer, train_items, n_batches: int):
    """(scheduler, wsd plan, steps of the run): cosine with warmup over every batch, or for wsd a warmup then a
    constant rate until the last budget's branch (the branches decay on their own)."""
    from transformers import get_cosine_schedule_with_warmup

    if not settings.train:
        return None, [], 0
    if settings.schedule != "wsd":
        return get_cosine_schedule_with_warmup(optimizer, math.ceil(settings.warmup_ratio * n_batches),
                                               n_batches), [], n_batches
    bs = settings.batch_size
    plan = wsd_plan(settings, [sum(len(p) for p, _ in train_items[i:i + bs]) for i in range(0, len(train_items), bs)])
    warm = settings.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    return scheduler, plan, plan[-1].branch_at  # the stable run; the last branch ends the run
