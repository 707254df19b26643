"""The training loop: run log, checkpoints and resume, the warmup-stable-decay plan, the teacher cache, ``train``."""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from swiftkv.distill.batches import HeldOut, prepare_data
from swiftkv.distill.guards import DivergenceGuard
from swiftkv.distill.pair import DistillModel, build_student, compute_loss, trainable_parameters
from swiftkv.distill.settings import CHECKPOINT_FILE, LOG_FILE, SUMMARY_FILE, DistillSettings
from swiftkv.errors import SwiftKVError

logger = logging.getLogger(__name__)


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


def gather_checkpoint(pair: DistillModel, optimizer, scheduler, state: dict) -> dict:
    """Trainable weights, optimizer and scheduler state, progress, as whole tensors on the CPU (under FSDP the
    shards are gathered: every rank must call it)."""
    from swiftkv.distill.parallel import full_tensor

    opt = optimizer.state_dict()
    opt = {**opt, "state": {i: {k: full_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in st.items()}
                            for i, st in opt["state"].items()}}
    return {
        "trainable": {n: full_tensor(p) for n, p in trainable_parameters(pair).items()},
        "optimizer": opt,
        "scheduler": scheduler.state_dict(),
        **state,
    }


def save_checkpoint(path: Path, payload: dict) -> None:
    """``gather_checkpoint``'s payload, written atomically."""
    from swiftkv.io import atomic_path

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


def restore_checkpoint(pair: DistillModel, optimizer, scheduler, payload: dict) -> None:
    """Load a checkpoint's whole tensors into the (possibly sharded) trainable weights and optimizer state."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    def place(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        if isinstance(like, DTensor) and value.dim() > 0:
            return distribute_tensor(value.to(like.dtype), like.device_mesh, like.placements)
        return value

    params = trainable_parameters(pair)
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(place(payload["trainable"][name], p))
    opt = payload["optimizer"]
    order = [p for group in optimizer.param_groups for p in group["params"]]
    optimizer.load_state_dict({**opt, "state": {i: {k: place(v, order[i]) if isinstance(v, torch.Tensor) else v
                                                    for k, v in st.items()} for i, st in opt["state"].items()}})
    scheduler.load_state_dict(payload["scheduler"])


class Interrupted(RuntimeError):
    """Raised by ``interrupt_after`` (tests of --resume: a run killed after some step)."""


def gather_model(pair: DistillModel, par) -> torch.nn.Module | None:
    """The whole student on rank 0 (None elsewhere). Unsharded: the model itself; under FSDP every rank gathers
    each parameter and rank 0 builds an unsharded copy."""
    from torch.distributed.tensor import DTensor

    from swiftkv.distill.parallel import full_tensor

    model = pair.model
    if not any(isinstance(p, DTensor) for p in model.parameters()):
        return model if par.main else None
    state = {n: full_tensor(p) for n, p in model.named_parameters()}
    if not par.main:
        return None
    with torch.device("meta"):
        whole = type(model)(copy.deepcopy(model.config))
    whole.load_state_dict(state, strict=False, assign=True)
    whole.tie_weights()  # tied embeddings: one parameter, gathered once
    for name, buf in model.named_buffers():  # not sharded (rotary frequencies): the same tensors
        owner, _, leaf = name.rpartition(".")
        whole.get_submodule(owner)._buffers[leaf] = buf.detach().cpu().clone()
    for name, p in whole.named_parameters():
        if p.is_meta:
            raise RuntimeError(f"gathering the sharded student left {name} unset")
    whole.train(False)
    return whole


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
    from swiftkv.distill.teacher_cache import TeacherCache, weights_fingerprint

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
    strategy: str | None = None,
    processes: int | None = None,
    gradient_checkpointing: bool = False,
) -> dict:
    """Convert ``base_model`` to a SwiftKV student, distil it, save it to ``output``; return the run summary.
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
    writes files. ``gradient_checkpointing``: the student's layers >= l recompute their activations in backward."""
    from tqdm.auto import tqdm
    from transformers import get_cosine_schedule_with_warmup

    from swiftkv.data.packing import collate_packs
    from swiftkv.device import fast_dtype
    from swiftkv.distill.packed_file import PackedRows, remove_packed, write_packed
    from swiftkv.distill.parallel import Parallel, clip_grad_norm, enable_checkpointing, keep_trainable_fp32
    from swiftkv.distill.teacher_cache import cached_batch
    from swiftkv.io import MARKER, atomic_dir, check_output_dir, mark_dir, remove_own_files
    from swiftkv.models.cache import expected_cache_bytes
    from swiftkv.models.convert import save_model_dir

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
    frozen = {p.dtype for p in base_model.parameters()} - {torch.float32}  # --dtype: how the frozen weights are held
    if mixed_precision is None:
        fast = fast_dtype("cpu" if cpu else "cuda") == torch.bfloat16
        mixed_precision = ("bf16" if frozen == {torch.bfloat16} or fast
                           else "fp16" if frozen == {torch.float16} else "no")
    elif frozen and mixed_precision == "no":
        held = min(map(str, frozen)).removeprefix("torch.")
        raise SwiftKVError(f"the frozen weights are {held} (--dtype) while the trainable ones stay fp32: they meet only "
                           "under autocast; use --mixed-precision bf16 (or --dtype float32)")
    par = Parallel.start(strategy, cpu=cpu, expect_processes=processes)
    par.check_batch_size(settings.batch_size)
    main = par.main
    torch.manual_seed(settings.seed)

    student = build_student(base_model, settings)
    keep_trainable_fp32(student)
    cache = _open_cache(teacher_cache, student, settings)
    pair = DistillModel(student, settings.scope, keep_pre_last=settings.loss == "kl+hidden",
                        teacher_cached=cache is not None).to(par.device)
    if gradient_checkpointing:
        enable_checkpointing(student, settings.num_key_value_layers)
    raw = pair
    params = list(trainable_parameters(pair).values())
    n_trainable = sum(p.numel() for p in params)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    packed = ckpt_dir / f"packed-{fingerprint}"  # N ranks without a teacher cache: the packed rows, memory-mapped
    if cache is not None or par.world == 1:  # a teacher cache holds the packed stream: every rank reads it
        train_items, heldout_items, data_report = prepare_data(tokenizer, settings, train_conversations,
                                                               heldout_conversations, cache)
    else:  # tokenised and packed once, by rank 0, into a file every rank maps
        small = None
        if main:
            items, heldout_items, data_report = prepare_data(tokenizer, settings, train_conversations,
                                                             heldout_conversations)
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            write_packed(packed, [p for p, _ in items])
            small = (heldout_items, data_report)
            del items
        heldout_items, data_report = par.broadcast_object(small)  # after rank 0 wrote the file
        train_items = PackedRows(packed)
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

    def step_batch(j: int) -> dict:
        """This rank's rows of global batch ``j`` (a rank left without rows runs one whose positions all count 0)."""
        rows = train_items[j * bs:(j + 1) * bs]
        mine = par.local_rows(rows)
        batch = collate_with("train")(mine or rows[:1])
        if not mine:
            batch["loss_mask"] = torch.zeros_like(batch["loss_mask"])
            batch["labels"] = torch.full_like(batch["labels"], -100)
        return {k: v.to(par.device) for k, v in batch.items()}

    heldout_batches = [
        {k: v.to(par.device) for k, v in collate_with("heldout")([item]).items()} for item in heldout_items
    ]
    heldout = HeldOut(pair, heldout_batches, settings.chunk_size)  # before sharding: its fixed part is computed here

    bs = settings.batch_size
    n_batches = math.ceil(len(train_items) / bs)
    if settings.train:
        pair = par.wrap(pair)
        params = list(trainable_parameters(raw).values())  # FSDP replaced them with their shards
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay) if params else None
    total_steps = n_batches if settings.train else 0
    scheduler, plan = None, []
    if settings.train and settings.schedule == "wsd":
        plan = wsd_plan(settings, [sum(len(p) for p, _ in train_items[i:i + bs])
                                   for i in range(0, len(train_items), bs)])
        total_steps = plan[-1].branch_at  # the stable run; the last branch ends the run
        warm = settings.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    elif settings.train:
        scheduler = get_cosine_schedule_with_warmup(
            optimizer, math.ceil(settings.warmup_ratio * total_steps), total_steps
        )
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
        restore_checkpoint(raw, optimizer, scheduler, payload)
        start_step, tokens_seen, train_seconds = payload["step"], payload["tokens"], payload["train_seconds"]
        logger.info("resuming from %s at step %d/%d", ckpt_dir, start_step, total_steps)
    log = RunLog(ckpt_dir / LOG_FILE, keep_until_step=start_step if payload is not None else None, enabled=main)
    guard = DivergenceGuard(settings, ckpt_dir, mixed_precision, start_step,  # a non-finite number stops the run
                            agree=par.all_true)
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision)
    scaler = torch.amp.GradScaler(par.device.type) if mixed_precision == "fp16" else None

    def autocast(evaluation: bool = False):
        """Training steps run under the run's autocast; evaluations only where they must (frozen weights held in
        another dtype than the fp32 trainable ones), so an fp32 model's held-out numbers stay fp32."""
        on = autocast_dtype is not None and (not evaluation or bool(frozen))
        return torch.autocast(par.device.type, dtype=autocast_dtype, enabled=on)

    def evaluate(step: int) -> dict:
        with autocast(evaluation=True):
            metrics = heldout.evaluate()
        guard.check_eval(step, metrics)
        if metrics:
            log.write({"event": "eval", "step": step, "tokens": tokens_seen, **metrics})
        return metrics

    initial = evaluate(0) if start_step == 0 else None
    head = raw.model.get_output_embeddings()
    bar = tqdm(total=total_steps, initial=start_step, desc="distill", unit="step", disable=not (progress and main))
    step = start_step

    def train_step(batch: dict, lr: float | None = None, at: int = 0) -> tuple[float, int, float, float]:
        """Optimizer step ``at`` at the scheduler's lr (or at ``lr``): (loss, tokens, seconds, lr used)."""
        t0 = time.perf_counter()
        if lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        counted = None  # one process: compute_loss's own count; N: the global batch's, and the loss times N
        if par.world > 1:
            every = batch["labels"] >= 0 if settings.loss == "lm" else batch["loss_mask"]
            counted = par.sum(every.sum()).clamp(min=1)
        with autocast():
            out = pair(batch["input_ids"], batch["position_ids"], batch.get("boundary"), batch.get("teacher"),
                       batch.get("teacher_pre_last"))
            loss = compute_loss(out, batch, head, settings, counted)
        if par.world > 1:  # DDP and FSDP average the ranks' gradients: each rank's share of the sum, times N
            loss = loss * par.world
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)
        grad_norm = clip_grad_norm(params, settings.max_grad_norm or math.inf)  # inf: measured only
        loss_value = par.sum(loss.detach() / par.world) if par.world > 1 else loss.detach()
        guard.check_step(at, loss_value, grad_norm)
        used = optimizer.param_groups[0]["lr"]  # the rate this step uses
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        if lr is None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        n_tokens = int(par.sum(batch["loss_mask"].sum()))
        return float(loss_value), n_tokens, time.perf_counter() - t0, used

    # budgets a resumed run already read (their records survive in the log up to the checkpoint's step)
    done_reads = par.broadcast_object({r["budget"]: r for r in log.records if r["event"] == "budget"} if main else {})

    def save_student(target: Path, files: dict, overwrite: bool, what: str) -> None:
        model = gather_model(raw, par)  # a collective under FSDP
        if main:
            save_model_dir(model.swiftkv(True), tokenizer, target, files=files, overwrite=overwrite, what=what)

    def read_budgets(at: int) -> dict | None:
        """The wsd branches that leave the stable run after ``at`` steps: decay, read, save, and (except after the
        last budget) restore the stable state. Returns the last budget's read once it is done."""
        nonlocal train_seconds
        for read in (r for r in plan if r.branch_at == at and r.budget not in done_reads):
            last = read is plan[-1]
            saved = None if last else ([p.detach().clone() for p in params], copy.deepcopy(optimizer.state_dict()))
            decay = read.steps - read.branch_at
            for i in range(decay):
                j = read.branch_at + i
                loss_value, n_tokens, dt, used = train_step(step_batch(j), lr=settings.lr * (1 - i / decay), at=j + 1)
                train_seconds += dt
                log.write({"event": "train", "branch": read.budget, "step": at, "branch_step": j + 1,
                           "loss": loss_value, "lr": used, "step_s": dt, "tok_per_s": n_tokens / dt})
            pair.eval()
            with autocast(evaluation=True):
                metrics = heldout.evaluate(per_row=True)
            guard.check_eval(at, metrics)
            pair.train()
            record = {"event": "budget", "budget": read.budget, "step": at, "steps": read.steps,
                      "tokens": read.tokens, "decay_steps": decay, **metrics}
            log.write(record)
            done_reads[read.budget] = record
            if read.budget in save_at:  # staged in the checkpoint directory (a resumed run keeps it)
                save_student(ckpt_dir / f"budget-{read.budget}",
                             {SUMMARY_FILE: json.dumps({"model": model_name, "settings": asdict(settings),
                                                        "fingerprint": fingerprint, "read": record}, indent=2) + "\n"},
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
        for j in range(start_step, n_batches):
            if plan and step >= total_steps:
                break
            loss_value, n_tokens, dt, lr = train_step(step_batch(j), at=step + 1)
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
            if step % ckpt_every == 0 and step < total_steps:
                guard.check_weights(step, params, checkpoint=True)
                payload = gather_checkpoint(raw, optimizer, scheduler,
                                            {"fingerprint": fingerprint, "step": step, "tokens": tokens_seen,
                                             "train_seconds": train_seconds})
                if main:
                    save_checkpoint(ckpt_dir / CHECKPOINT_FILE, payload)
                del payload
            par.barrier()
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

    guard.check_weights(step, params)
    records = log.records if main else []
    evals = [r for r in records if r["event"] == "eval"]
    model = raw.model.swiftkv(True)
    full = gather_model(raw, par)  # under FSDP every rank takes part; rank 0 gets the whole student
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
        "processes": par.world,
        "strategy": par.strategy,
        "gradient_checkpointing": gradient_checkpointing,
        "mixed_precision": mixed_precision,
        "device": str(par.device),
        "teacher_cache": None if cache is None else {"path": str(cache.path), "key": asdict(cache.key),
                                                      "build": cache.build},
        **({"budget_reads": [done_reads[r.budget] for r in plan]} if plan else {}),
        **(extra_summary or {}),
    }
    if main:
        model = full
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
        remove_packed(packed)
        remove_own_files(ckpt_dir, [CHECKPOINT_FILE, LOG_FILE, MARKER])
    par.barrier()
    return summary
