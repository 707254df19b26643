"""A run's data: packed training rows and the fixed held-out sample its KL is read on."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Callable

import torch

from swiftkv.data.packing import HELDOUT_SEED
from swiftkv.distill.losses import eval_metrics
from swiftkv.distill.settings import DistillSettings
from swiftkv.errors import SwiftKVError

if TYPE_CHECKING:
    from swiftkv.distill.pair import DistillModel


class HeldOut:
    """A fixed held-out sample: the shared prefix and the teacher's final hidden states are computed once (neither
    changes during training), so each evaluation only runs the student's layers >= l and the head.

    Over N ranks (``par``) rank r keeps and evaluates held-out rows r, r + N, ...: each prepares and holds 1/N of the
    sample, every rank runs as many forwards (under FSDP each gathers; a rank short of rows reruns one and drops it),
    and the sums are added over the ranks, so the numbers are the one-process numbers (up to summation order)."""

    def __init__(self, pair: DistillModel, n: int, batch_of: Callable[[int], dict], chunk_size: int, par=None):
        """``n`` held-out rows; ``batch_of(i)``: row i as a batch on the device, asked for this rank's rows only."""
        from swiftkv.distill.parallel import Parallel

        self.pair, self.chunk_size, self.items = pair, chunk_size, []
        self.par = par or Parallel()
        self.n = n
        self.index = list(range(self.par.rank, n, self.par.world))  # the held-out rows this rank evaluates
        self.rounds = -(-n // self.par.world)
        mine = self.index or ([0] if n else [])  # a rank without a row keeps row 0 as its stand-in
        with torch.no_grad():
            for r in range(self.rounds):  # as many forwards on every rank: under FSDP each one gathers
                batch = batch_of(mine[min(r, len(mine) - 1)])
                state, boundary, teacher = pair(batch["input_ids"], batch["position_ids"], batch.get("boundary"),
                                                batch.get("teacher"), prepare=True)
                if r >= len(mine):  # a rank short of rows reran its last one: dropped
                    continue
                mask = batch["loss_mask"]
                self.items.append((state, boundary, mask, teacher[mask], batch["labels"][mask]))

    @torch.no_grad()
    def evaluate(self, per_row: bool = False) -> dict:
        """Pooled held-out numbers; with ``per_row`` also each held-out batch's sums (``heldout_rows``: kl_sum,
        top1_sum, positions, in held-out order), the unit a bootstrap over held-out rows resamples."""
        if not self.n:
            return {}
        head = self.pair.model.get_output_embeddings()
        total: dict[str, float] = {}
        rows = []
        for r in range(self.rounds):
            own = r < len(self.index)
            state, boundary, mask, teacher, labels = self.items[r if own else 0]
            student = self.pair(None, None, boundary, state=state).student  # through forward: FSDP gathers there
            sums = eval_metrics(student[mask], teacher, labels, head, self.chunk_size)  # FSDP: a collective too
            if not own:  # a stand-in: this rank has no row left
                continue
            rows.append((self.index[r], {k: sums[k] for k in ("kl_sum", "top1_sum", "positions")}))
            for k, v in sums.items():
                total[k] = total.get(k, 0) + v
        total, rows = self._pooled(total, rows)
        n, m = max(total["positions"], 1), max(total["labelled"], 1)
        out = {
            "heldout_kl": total["kl_sum"] / n,
            "heldout_top1": total["top1_sum"] / n,
            "heldout_student_nll": total["student_nll_sum"] / m,
            "heldout_teacher_nll": total["teacher_nll_sum"] / m,
            "heldout_tokens": int(total["positions"]),
        }
        if per_row:
            out["heldout_rows"] = [row for _, row in sorted(rows, key=lambda x: x[0])]
        return out

    def _pooled(self, total: dict, rows: list) -> tuple[dict, list]:
        """This rank's sums and rows added to / joined with every other rank's (as they are in one process)."""
        if self.par.world == 1:
            return total, rows
        keys = ("kl_sum", "top1_sum", "positions", "student_nll_sum", "teacher_nll_sum", "labelled")
        summed = self.par.sum(torch.tensor([float(total.get(k, 0)) for k in keys], dtype=torch.float64,
                                           device=self.par.device)).tolist()
        total = {k: (int(v) if k in ("top1_sum", "positions", "labelled") else v) for k, v in zip(keys, summed)}
        return total, [row for part in self.par.gather_objects(rows) for row in part]


def prepare_data(tokenizer, settings: DistillSettings, train_conversations, heldout_conversations, cache=None):
    """Training items for the token budget (seeded) and the fixed held-out items, with their reports. An item is a
    pack and, with a teacher cache, the cache rows of its tokens (the packs then come from the cache's stream: no
    conversation is read or rendered); without one, None."""
    from swiftkv.data.packing import PackReport, pack_conversations

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
