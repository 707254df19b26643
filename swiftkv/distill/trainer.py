"""The training loop: ``train`` runs a ``Distillation`` — set up (``swiftkv.distill.setup``: outputs, precision, data,
schedule; then the model, the optimizer and a resumed checkpoint), its optimizer steps, held-out evaluations and
warmup-stable-decay budget reads (``swiftkv.distill.budgets``), and its end (the summary and the saved student). The
log and the checkpoints are ``swiftkv.distill.checkpoints``."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict

import torch

from swiftkv.distill.batches import HeldOut
from swiftkv.distill.budgets import BudgetRead, BudgetReads, wsd_plan
from swiftkv.distill.checkpoints import (
    Interrupted,
    RunLog,
    gather_checkpoint,
    gather_model,
    load_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from swiftkv.distill.guards import DivergenceGuard
from swiftkv.distill.pair import DistillModel, build_student, compute_loss, trainable_parameters
from swiftkv.distill.settings import CHECKPOINT_FILE, LOG_FILE, SUMMARY_FILE, DistillSettings, RunOptions
from swiftkv.distill.setup import auto_every, check_outputs, choose_precision, load_data, make_schedule, open_cache

logger = logging.getLogger(__name__)

__all__ = ["BudgetRead", "Distillation", "Interrupted", "RunLog", "RunOptions", "load_checkpoint", "save_checkpoint",
           "train", "wsd_plan"]


class Distillation(BudgetReads):
    """One distillation run, set up by the constructor (no step taken yet): ``run`` trains, ``finish`` evaluates,
    saves and returns the summary. Every rank of a launched run builds one with the same arguments."""

    def __init__(self, base_model, tokenizer, settings: DistillSettings, output, options: RunOptions):
        from swiftkv.distill.parallel import Parallel

        settings.validate()
        self.started = time.perf_counter()
        self.settings, self.tokenizer, self.options = settings, tokenizer, options
        self.output, self.save_at, self.ckpt_dir = check_outputs(settings, output, options.save_at,
                                                                 options.checkpoint_dir, options.overwrite)
        self.fingerprint = settings.fingerprint(options.model_name)
        cpu, self.frozen, self.mixed_precision = choose_precision(base_model, options.cpu, options.mixed_precision)
        self.par = Parallel.start(options.strategy, cpu=cpu, expect_processes=options.processes)
        self.par.barrier()  # every rank has checked the outputs before rank 0 writes into them (runs in one launch)
        self.par.check_batch_size(settings.batch_size)
        self.main = self.par.main
        torch.manual_seed(settings.seed)
        self._build_model(base_model, options.teacher_cache, options.gradient_checkpointing)
        self.packed = self.ckpt_dir / f"packed-{self.fingerprint}"  # N ranks without a teacher cache: memory-mapped
        self.train_items, heldout_items, self.data_report = load_data(
            self.par, tokenizer, settings, options.train_conversations, options.heldout_conversations, self.cache,
            self.packed, self.ckpt_dir)
        logger.info("data: %s", self.data_report)
        self._build_optimizer()
        self.heldout = HeldOut(  # after sharding: under FSDP each rank holds only its shards from here on
            self.raw, len(heldout_items),
            lambda i: {k: v.to(self.par.device) for k, v in self.collate("heldout", [heldout_items[i]]).items()},
            settings.chunk_size, self.par)
        self._resume()

    # -- setup ------------------------------------------------------------------------------------------------------

    def _build_model(self, base_model, teacher_cache, gradient_checkpointing: bool) -> None:
        """The student (trainable weights fp32), the teacher cache checked against it, the pair on this rank's device
        (under FSDP only its shards, moved there when it is sharded: a rank never holds the whole model on its GPU)."""
        from swiftkv.distill.parallel import enable_checkpointing, keep_trainable_fp32, weights_from_rank0

        settings = self.settings
        self.student = student = build_student(base_model, settings)
        keep_trainable_fp32(student)
        self.from_rank0 = weights_from_rank0(self.par, student, settings.train)  # other ranks: on meta, no weights
        self.cache = open_cache(teacher_cache, student, settings, self.par if self.from_rank0 else None)
        self.raw = self.pair = DistillModel(student, settings.scope, keep_pre_last=settings.loss == "kl+hidden",
                                            teacher_cached=self.cache is not None)
        if not (self.par.strategy == "fsdp" and settings.train):  # FSDP: fully_shard moves each unit's shards there
            self.pair.to(self.par.device)
        if gradient_checkpointing:
            enable_checkpointing(student, settings.num_key_value_layers)
        self.params = list(trainable_parameters(self.raw).values())
        self.n_trainable = sum(p.numel() for p in self.params)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.dtype = next(student.parameters()).dtype
        self.pre_last = student.config.num_hidden_layers - 1 if settings.loss == "kl+hidden" else None

    def _build_optimizer(self) -> None:
        """The wrapped pair (DDP, or FSDP shards in place), AdamW on the trainable weights, the schedule and plan."""
        from swiftkv.distill.parallel import fill_from_rank0

        settings = self.settings
        self.bs = settings.batch_size
        self.n_batches = -(-len(self.train_items) // self.bs)
        if settings.train:
            full = self.raw.state_dict() if self.from_rank0 and self.main else None  # rank 0's weights, pre-sharding
            self.pair = self.par.wrap(self.raw)
            if self.from_rank0:  # every rank's shards from rank 0's weights
                fill_from_rank0(self.raw, full, self.par)
                del full
            self.params = list(trainable_parameters(self.raw).values())  # FSDP replaced them with their shards
        self.optimizer = (torch.optim.AdamW(self.params, lr=settings.lr, weight_decay=settings.weight_decay)
                          if self.params else None)
        self.scheduler, self.plan, self.total_steps = make_schedule(settings, self.optimizer, self.train_items,
                                                                    self.n_batches)
        self.eval_every = settings.eval_every or auto_every(self.total_steps, 5)
        if self.eval_every < 0:  # only the evaluations before and after training
            self.eval_every = self.total_steps + 1
        self.ckpt_every = settings.checkpoint_every or auto_every(self.total_steps, 10)

    def _resume(self) -> None:
        """A checkpoint of the same settings resumed (``resume``), else a fresh start; the log, the divergence guard
        and the autocast settings."""
        settings, ckpt_dir, resume = self.settings, self.ckpt_dir, self.options.resume
        self.start_step, self.tokens_seen, self.train_seconds = 0, 0, 0.0
        payload = load_checkpoint(ckpt_dir / CHECKPOINT_FILE, self.fingerprint) if (resume and settings.train) else None
        if resume and settings.train and payload is None and not (ckpt_dir / CHECKPOINT_FILE).is_file():
            logger.warning("--resume: nothing to resume in %s (no %s); starting from the beginning",
                           ckpt_dir, CHECKPOINT_FILE)
        if self.main:
            from swiftkv.io import mark_dir

            ckpt_dir.mkdir(parents=True, exist_ok=True)
            mark_dir(ckpt_dir, "distillation checkpoints (removed when the run ends)")
            if payload is None:  # a fresh start: a stale checkpoint must not be resumed with this run's log later
                (ckpt_dir / CHECKPOINT_FILE).unlink(missing_ok=True)
        if payload is not None:
            restore_checkpoint(self.raw, self.optimizer, self.scheduler, payload)
            self.start_step, self.tokens_seen, self.train_seconds = (payload["step"], payload["tokens"],
                                                                     payload["train_seconds"])
            logger.info("resuming from %s at step %d/%d", ckpt_dir, self.start_step, self.total_steps)
        self.log = RunLog(ckpt_dir / LOG_FILE, keep_until_step=self.start_step if payload is not None else None,
                          enabled=self.main)
        self.guard = DivergenceGuard(settings, ckpt_dir, self.mixed_precision, self.start_step,
                                     agree=self.par.all_true)  # a non-finite number stops the run
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.mixed_precision)
        self.scaler = torch.amp.GradScaler(self.par.device.type) if self.mixed_precision == "fp16" else None

    # -- batches, precision, evaluation -----------------------------------------------------------------------------

    def collate(self, split: str, items) -> dict:
        """Rows to a batch: packed rows padded, or with a teacher cache the teacher's side read beside them."""
        from swiftkv.data.packing import collate_packs
        from swiftkv.distill.teacher_cache import cached_batch

        packs, rows = [p for p, _ in items], [r for _, r in items]
        if self.cache is None:
            return collate_packs(packs, self.pad_id)
        return cached_batch(self.cache, split, packs, rows, self.settings.num_key_value_layers, self.pad_id,
                            self.dtype, self.pre_last)

    def step_batch(self, j: int) -> list[dict]:
        """This rank's rows of global batch ``j`` in its micro-batches (``RunOptions.micro_batch_size``; a rank left
        without rows for one runs a row whose positions all count 0)."""
        rows = self.train_items[j * self.bs:(j + 1) * self.bs]
        out = []
        for mine in self.par.local_micro_batches(rows, self.options.micro_batch_size):
            batch = self.collate("train", mine or rows[:1])
            if not mine:
                batch["loss_mask"] = torch.zeros_like(batch["loss_mask"])
                batch["labels"] = torch.full_like(batch["labels"], -100)
            out.append({k: v.to(self.par.device) for k, v in batch.items()})
        return out

    def autocast(self, evaluation: bool = False):
        """Training steps run under the run's autocast; evaluations only where they must (frozen weights held in
        another dtype than the fp32 trainable ones), so an fp32 model's held-out numbers stay fp32."""
        on = self.autocast_dtype is not None and (not evaluation or bool(self.frozen))
        return torch.autocast(self.par.device.type, dtype=self.autocast_dtype, enabled=on)

    def evaluate(self, step: int) -> dict:
        with self.autocast(evaluation=True):
            metrics = self.heldout.evaluate()
        self.guard.check_eval(step, metrics)
        if metrics:
            self.log.write({"event": "eval", "step": step, "tokens": self.tokens_seen, **metrics})
        return metrics

    # -- one optimizer step -----------------------------------------------------------------------------------------

    def train_step(self, batches: list[dict], lr: float | None = None, at: int = 0) -> tuple[float, int, float, float]:
        """Optimizer step ``at`` on this rank's micro-batches of one global batch, at the scheduler's lr (or at ``lr``):
        (loss, tokens, seconds, lr used)."""
        from swiftkv.distill.parallel import clip_grad_norm

        settings, par, optimizer, scaler = self.settings, self.par, self.optimizer, self.scaler
        t0 = time.perf_counter()
        if lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        counted = None  # one process, one micro-batch: compute_loss's own count; else the global batch's
        if par.world > 1 or len(batches) > 1:
            every = [b["labels"] >= 0 if settings.loss == "lm" else b["loss_mask"] for b in batches]
            counted = par.sum(sum(e.sum() for e in every)).clamp(min=1)
        loss = 0.0
        for i, batch in enumerate(batches):
            with par.gradient_sync(self.pair, sync=i == len(batches) - 1):  # reduced after the last micro-batch
                with self.autocast():
                    out = self.pair(batch["input_ids"], batch["position_ids"], batch.get("boundary"),
                                    batch.get("teacher"), batch.get("teacher_pre_last"))
                    part = compute_loss(out, batch, self.head, settings, counted)
                if par.world > 1:  # DDP and FSDP average the ranks' gradients: each rank's share of the sum, times N
                    part = part * par.world
                (scaler.scale(part) if scaler else part).backward()
            loss = loss + part.detach()
            del out, part
        if scaler:
            scaler.unscale_(optimizer)
        grad_norm = clip_grad_norm(self.params, settings.max_grad_norm or float("inf"))  # inf: measured only
        loss_value = par.sum(loss.detach() / par.world) if par.world > 1 else loss.detach()
        self.guard.check_step(at, loss_value, grad_norm)
        used = optimizer.param_groups[0]["lr"]  # the rate this step uses
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        if lr is None:
            self.scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        n_tokens = int(par.sum(sum(b["loss_mask"].sum() for b in batches)))
        return float(loss_value), n_tokens, time.perf_counter() - t0, used

    # -- the run ----------------------------------------------------------------------------------------------------

    def run(self, interrupt_after: int | None = None) -> None:
        """Evaluate the student as it starts (a fresh run), then train: every batch, or under wsd the stable run and
        its budgets' branches. ``interrupt_after``: raise ``Interrupted`` after that step (tests of --resume)."""
        from tqdm.auto import tqdm

        self.initial = self.evaluate(0) if self.start_step == 0 else None
        self.head = self.raw.model.get_output_embeddings()
        self.bar = tqdm(total=self.total_steps, initial=self.start_step, desc="distill", unit="step",
                        disable=not (self.options.progress and self.main))
        self.step = self.start_step
        # budgets a resumed run already read (their records survive in the log up to the checkpoint's step)
        self.done_reads = self.par.broadcast_object(
            {r["budget"]: r for r in self.log.records if r["event"] == "budget"} if self.main else {})
        self.last_read = None
        if self.settings.train:
            self.pair.train()
            if self.plan:
                self.last_read = self.read_budgets(self.step)
            for j in range(self.start_step, self.n_batches):
                if self.plan and self.step >= self.total_steps:
                    break
                self._train_batch(j)
                if interrupt_after is not None and self.step >= interrupt_after:
                    self.bar.close()
                    raise Interrupted(f"interrupted after step {self.step}")
            self.pair.eval()
        self.bar.close()

    def _train_batch(self, j: int) -> None:
        """Global batch ``j`` of the stable run (or of the cosine run), then what falls due after it: budget reads,
        an evaluation, a checkpoint."""
        loss_value, n_tokens, dt, lr = self.train_step(self.step_batch(j), at=self.step + 1)
        self.step += 1
        step = self.step
        self.tokens_seen += n_tokens
        self.train_seconds += dt
        self.log.write({"event": "train", "step": step, "tokens": self.tokens_seen, "loss": loss_value,
                        "lr": lr, "step_s": dt, "tok_per_s": n_tokens / dt})
        self.bar.set_postfix(loss=f"{loss_value:.4f}", tok_s=f"{self.tokens_seen / self.train_seconds:.0f}")
        self.bar.update()
        if self.plan:
            self.last_read = self.read_budgets(step) or self.last_read
        if step % self.eval_every == 0 and step < self.total_steps:
            self.evaluate(step)
        if step % self.ckpt_every == 0 and step < self.total_steps:
            self.guard.check_weights(step, self.params, checkpoint=True)
            payload = gather_checkpoint(self.raw, self.optimizer, self.scheduler,
                                        {"fingerprint": self.fingerprint, "step": step, "tokens": self.tokens_seen,
                                         "train_seconds": self.train_seconds})
            if self.main:
                save_checkpoint(self.ckpt_dir / CHECKPOINT_FILE, payload)
            del payload
        self.par.barrier()

    def finish(self) -> dict:
        """The final held-out numbers, the weights checked, the student gathered and saved (rank 0); the summary."""
        if self.last_read is not None:  # wsd: the run ends with its largest budget's branch, read there
            self.step, self.tokens_seen = self.last_read["steps"], self.last_read["tokens"]
            final = {k: v for k, v in self.last_read.items() if k.startswith("heldout") and k != "heldout_rows"}
            self.log.write({"event": "eval", "step": self.step, "tokens": self.tokens_seen, **final})
        else:
            final = self.evaluate(self.step) if self.step > 0 or self.initial is None else self.initial
        self.guard.check_weights(self.step, self.params)
        config = self.raw.model.swiftkv(True).config
        full = gather_model(self.raw, self.par)  # under FSDP every rank takes part; rank 0 gets the whole student
        summary = self.summary(final, config)
        if self.main:
            self._save(full, summary)
        self.par.barrier()
        return summary

    def summary(self, final: dict, config) -> dict:
        from swiftkv.models.cache import expected_cache_bytes

        evals = [r for r in (self.log.records if self.main else []) if r["event"] == "eval"]
        cache, settings = self.cache, self.settings
        return {
            "model": self.options.model_name,
            "settings": asdict(settings),
            "fingerprint": self.fingerprint,
            "data": self.data_report,
            "steps": self.step,
            "train_tokens": self.tokens_seen,
            "train_seconds": self.train_seconds,
            "train_tok_per_s": self.tokens_seen / self.train_seconds if self.train_seconds else None,
            "wall_seconds_this_invocation": time.perf_counter() - self.started,
            "trainable_parameters": self.n_trainable,
            "heldout_initial": {k: v for k, v in evals[0].items() if k.startswith("heldout")} if evals else {},
            "heldout_final": final,
            "kv_cache_bytes_per_token_fp16": expected_cache_bytes(config, 1, bytes_per_value=2),
            "processes": self.par.world,
            "strategy": self.par.strategy,
            "gradient_checkpointing": self.options.gradient_checkpointing,
            **({"micro_batch_size": self.options.micro_batch_size} if self.options.micro_batch_size else {}),
            "mixed_precision": self.mixed_precision,
            "device": str(self.par.device),
            "teacher_cache": None if cache is None else {"path": str(cache.path), "key": asdict(cache.key),
                                                          "build": cache.build},
            **({"budget_reads": [self.done_reads[r.budget] for r in self.plan]} if self.plan else {}),
            **(self.options.extra_summary or {}),
        }

    def _save(self, model, summary: dict) -> None:
        """Rank 0: the student (or, ``log_only``, the summary and log alone) and the other budgets' students moved
        from their staging place; then the run's own scratch files removed."""
        from swiftkv.distill.packed_file import remove_packed
        from swiftkv.io import MARKER, atomic_dir, remove_own_files
        from swiftkv.models.convert import save_model_dir

        ckpt_dir, overwrite = self.ckpt_dir, self.options.overwrite
        if self.mixed_precision == "bf16":
            model.to(torch.bfloat16)
        files = {SUMMARY_FILE: json.dumps(summary, indent=2) + "\n"}
        if (ckpt_dir / LOG_FILE).exists():
            files[LOG_FILE] = ckpt_dir / LOG_FILE
        if self.options.log_only:  # the summary and the log only
            save_model_dir(None, None, self.output, files=files, overwrite=overwrite,
                           what="distillation log (--log-only)")
        else:
            save_model_dir(model, self.tokenizer, self.output, files=files, overwrite=overwrite,
                           what="distilled checkpoint")
        for budget, target in self.save_at.items():  # the students read at other budgets, from their staging place
            staged = ckpt_dir / f"budget-{budget}"
            with atomic_dir(target, overwrite=overwrite, what=f"distilled checkpoint at {budget} tokens") as tmp:
                for item in staged.iterdir():
                    if item.name != MARKER:
                        os.replace(item, tmp / item.name)
            remove_own_files(staged, [MARKER])
        remove_packed(self.packed)
        remove_own_files(ckpt_dir, [CHECKPOINT_FILE, LOG_FILE, MARKER])


def train(base_model, tokenizer, settings: DistillSettings, output: str | os.PathLike, *, train_conversations,
          heldout_conversations, interrupt_after: int | None = None, **options) -> dict:
    """Convert ``base_model`` to a SwiftKV student, distil it, save it to ``output``; return the run summary.
    ``options`` are ``RunOptions``' fields: ``model_name``, ``checkpoint_dir``, ``resume``, ``cpu``,
    ``mixed_precision``, ``progress``, ``extra_summary``, ``overwrite``, ``teacher_cache``, ``save_at``, ``log_only``,
    ``strategy``, ``processes``, ``gradient_checkpointing``, ``micro_batch_size``.

    ``log_only``: ``output`` gets the run's summary and training log without the student's weights (a run that is
    read only through its held-out numbers, e.g. an lr sweep).

    ``teacher_cache`` (a ``TeacherCache`` or its directory): the teacher's side of every step and held-out number
    and the packed data come from it (``swiftkv.distill.teacher_cache``); the conversations are then not needed.

    With ``settings.schedule == "wsd"`` every budget of ``settings.read_budgets`` is read along the way (held-out KL
    and top-1 per held-out row in the log's ``budget`` events and the summary's ``budget_reads``); ``output`` gets
    the largest budget's student and ``save_at`` {budget: directory} the students of other budgets.

    Under a launcher (torchrun, ``accelerate launch``) each process calls ``train`` with the same arguments;
    ``strategy`` (none, ddp, fsdp; default ddp for more than one process) says how the model is split
    (``swiftkv.distill.parallel``), ``processes`` how many processes the launcher must have started.
    ``settings.batch_size`` is the global batch, so the trained weights do not depend on the rank count. Only rank 0
    writes files. ``gradient_checkpointing``: the student's layers >= l recompute their activations in backward.
    ``micro_batch_size``: each process runs its rows that many at a time, accumulating gradients (the same step).
    ``interrupt_after``: stop with ``Interrupted`` after that step (tests of ``--resume``)."""
    run = Distillation(base_model, tokenizer, settings, output,
                       RunOptions(train_conversations=train_conversations,
                                  heldout_conversations=heldout_conversations, **options))
    run.run(interrupt_after)
    return run.finish()
