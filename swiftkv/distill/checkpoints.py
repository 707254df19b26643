"""What a distillation run keeps while it runs: its JSONL log, its checkpoints (save, load, resume) and the gathering of
a sharded student."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import torch

from swiftkv.distill.pair import DistillModel, trainable_parameters

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
    from swiftkv.distill.vocab import gather_slices, sharded_parameters

    model = pair.model
    if not any(isinstance(p, DTensor) for p in model.parameters()):
        return model if par.main else None
    sliced = sharded_parameters(model)  # the embedding and head, split by vocabulary (not DTensors)
    state = {n: gather_slices(p, sliced[n]) if n in sliced else full_tensor(p) for n, p in model.named_parameters()}
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

