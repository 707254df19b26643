"""One distillation over 1 or N processes: the process group, the global batch split, DDP or FSDP2.

The launcher (torchrun, ``accelerate launch``, or none) starts the processes and sets the usual environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``); ``Parallel.start`` joins the group
(gloo on CPU, nccl on GPUs). What a run means does not depend on the rank count:

- ``--batch-size`` is the global batch (rows per optimizer step over all ranks): rank r trains rows
  ``[r * B/W, (r + 1) * B/W)`` of each global batch; a rank whose share of a short last batch is empty runs one row
  with no counted position (its gradient is zero), so every rank runs the same collectives;
- ``--micro-batch-size`` m: a rank runs its rows m at a time, accumulating gradients (reduced over the ranks once,
  after its last micro-batch); the step, its loss and its gradient are those of the whole global batch;
- each rank's loss is divided by the global batch's counted positions and multiplied by W, so the averaged
  gradient (DDP's all-reduce, FSDP's reduce-scatter) is the single-process gradient of the same global batch.

Strategies: ``none`` (one process), ``ddp`` (``DistributedDataParallel``: every rank holds the whole model,
gradients of the trainable parameters all-reduced), ``fsdp`` (PyTorch FSDP2 ``fully_shard``: every parameter
sharded over the ranks, gathered per unit while it runs). FSDP2 needs one dtype per unit, so the units are: each
module whose own parameters train (the ``*_swiftkv`` projections and norms; with scope full also the trained parts of
layers >= l), then each decoder layer (what is left of it: frozen, in ``--dtype``), then the root. Trainable
parameters are fp32 whatever ``--dtype`` holds the frozen ones in; so are AdamW's states.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field

import torch
from torch import nn

from swiftkv.errors import SwiftKVError

logger = logging.getLogger(__name__)

STRATEGIES = ("none", "ddp", "fsdp")


@dataclass
class Parallel:
    """This process's place in the run: rank, world size, device, strategy."""

    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    strategy: str = "none"

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def start(cls, strategy: str | None = None, cpu: bool = True, expect_processes: int | None = None) -> Parallel:
        """Join the launcher's process group (if it started more than one process) and check what was asked."""
        import torch.distributed as dist

        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        strategy = cls.check_launch(strategy, expect_processes)
        if world == 1 and strategy != "none":
            logger.info("--strategy %s in one process: nothing to split, running it as one process", strategy)
            strategy = "none"
        device = torch.device("cpu") if cpu else torch.device("cuda", local)
        if not cpu:
            torch.cuda.set_device(device)
        if world > 1 and not dist.is_initialized():
            dist.init_process_group("gloo" if cpu else "nccl", device_id=None if cpu else device)
        if world > 1:
            _one_line_on_sigterm(rank, world)
        return cls(rank, world, device, strategy)

    @staticmethod
    def check_launch(strategy: str | None = None, expect_processes: int | None = None,
                     batch_size: int | None = None) -> str:
        """The strategy to run (default: ddp for more than one process, none for one; fsdp under an accelerate FSDP
        config); one line if the launcher started another number of processes than asked, the strategy does not fit
        the process count or the global batch does not split over the processes. Needs no process group (the CLI
        calls it before loading anything)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        expect = expect_processes or int(os.environ.get("SWIFTKV_EXPECT_WORLD_SIZE", "0") or 0) or None
        if expect is not None and expect != world:
            raise SwiftKVError(
                f"asked for {expect} processes but the launcher started {world}; launch with torchrun "
                f"--nproc_per_node {expect}, or accelerate launch --multi_gpu --num_processes {expect} (also on a "
                f"CPU-only machine: accelerate's --cpu starts one process)")
        if strategy is None:  # an accelerate FSDP config (config/accelerate/fsdp.yaml) asks for fsdp
            strategy = "none" if world == 1 else "fsdp" if os.environ.get("ACCELERATE_USE_FSDP") == "true" else "ddp"
        if strategy not in STRATEGIES:
            raise SwiftKVError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
        if world > 1 and strategy == "none":
            raise SwiftKVError(f"--strategy none runs one process, but the launcher started {world}; use ddp or fsdp")
        if batch_size is not None:
            Parallel(world=world).check_batch_size(batch_size)
        return strategy

    # -- collectives (no-ops in one process) --------------------------------------------------------------------

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return value
        import torch.distributed as dist

        value = value.detach().clone()
        dist.all_reduce(value)
        return value

    def all_true(self, flag: bool) -> bool:
        """True on every rank iff true on every rank (a check that must stop all ranks or none)."""
        if self.world == 1:
            return flag
        return bool(self.sum(torch.tensor([0 if flag else 1], device=self.device)).item() == 0)

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def broadcast_object(self, obj):
        """rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj if self.main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_objects(self, obj) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def stop(self) -> None:
        import torch.distributed as dist

        if self.world > 1 and dist.is_initialized():
            dist.destroy_process_group()

    # -- the global batch -------------------------------------------------------------------------------------

    def check_batch_size(self, batch_size: int) -> None:
        if batch_size % self.world:
            raise SwiftKVError(f"--batch-size {batch_size} is the global batch (rows per step over all ranks) and must "
                               f"be divisible by the {self.world} processes; use a multiple of {self.world}")

    def local_rows(self, rows: list) -> list:
        """This rank's share of a global batch's ``rows`` (contiguous; empty on a rank past a short last batch)."""
        if self.world == 1:
            return rows
        per = -(-len(rows) // self.world)
        return rows[self.rank * per:(self.rank + 1) * per]

    def local_micro_batches(self, rows: list, micro: int | None = None) -> list[list]:
        """This rank's share of a global batch's ``rows`` in micro-batches of at most ``micro`` rows (None: one
        micro-batch), as many on every rank (each forward under FSDP is a collective): a rank short of rows gets
        empty ones, run as one row that counts nothing."""
        per = -(-len(rows) // self.world)
        size = micro or per
        mine = self.local_rows(rows)
        return [mine[i * size:(i + 1) * size] for i in range(max(1, -(-per // size)))]

    @contextlib.contextmanager
    def gradient_sync(self, model: nn.Module, sync: bool):
        """Backward passes in this block reduce the gradients over the ranks only if ``sync`` (the last micro-batch of
        a step; the others accumulate locally): DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync``."""
        if sync or self.world == 1 or self.strategy == "none":
            yield
        elif self.strategy == "ddp":
            with model.no_sync():
                yield
        else:
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

    # -- the model ------------------------------------------------------------------------------------------

    def wrap(self, pair: nn.Module) -> nn.Module:
        """The module a training step calls: ``pair`` itself (none; fsdp shards it in place) or its DDP wrapper."""
        if self.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(pair, device_ids=None if self.device.type == "cpu" else [self.device])
        if self.strategy == "fsdp":
            shard_pair(pair, self.device)
        return pair


def _one_line_on_sigterm(rank: int, world: int) -> None:
    """torchrun (and accelerate launch) stop the other ranks with SIGTERM when one fails: say so in one line."""
    import signal
    import sys

    def stopped(signum, frame):
        sys.stderr.write(f"error: rank {rank} of {world} stopped by the launcher: another rank of the run failed or "
                         "was killed (the launcher's report names it); nothing was saved as a result\n")
        sys.stderr.flush()
        os._exit(1)

    signal.signal(signal.SIGTERM, stopped)


def enable_checkpointing(model: nn.Module, l: int) -> None:
    """transformers' gradient checkpointing (non-reentrant ``torch.utils.checkpoint``) on the decoder layers >= l:
    they keep only their input and recompute the rest in backward. Layers < l run without autograd: nothing to keep."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer in model.model.layers[:l]:
        layer.gradient_checkpointing = False


def keep_trainable_fp32(model: nn.Module) -> None:
    """Trainable parameters in fp32 whatever dtype the frozen weights are held in (so are AdamW's states)."""
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()


def shard_pair(pair: nn.Module, device: torch.device) -> None:
    """FSDP2 units, one dtype each: every module owning trainable parameters, then each decoder layer, the
    teacher's frozen copy of layers (scope full), then the root; the embedding and the LM head are split by
    vocabulary instead (``swiftkv.distill.vocab``: the root would hold them gathered for the whole step)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from swiftkv.distill.vocab import shard_vocabulary

    mesh = init_device_mesh(device.type, (int(os.environ["WORLD_SIZE"]),))
    by_vocabulary = shard_vocabulary(pair.model, device)
    layers = pair.model.model.layers
    for module in list(pair.modules()):
        own = list(module.parameters(recurse=False))
        if own and any(p.requires_grad for p in own):
            if not all(p.requires_grad for p in own):
                raise SwiftKVError(f"{type(module).__name__} mixes trained and frozen parameters; FSDP cannot shard it")
            fully_shard(module, mesh=mesh)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    if getattr(pair, "teacher_layers", None) is not None:
        for layer in pair.teacher_layers:
            fully_shard(layer, mesh=mesh)
    fully_shard(pair, mesh=mesh, ignored_params=by_vocabulary)


def weights_from_rank0(par: Parallel, model: nn.Module, train: bool) -> bool:
    """Whether this run's ranks other than 0 built the model on the meta device (no weights loaded: ``swiftkv
    distill`` does so under FSDP), to be filled from rank 0 once sharded; one line where that cannot work."""
    on_meta = any(p.is_meta for p in model.parameters())
    some = not par.all_true(not on_meta) if par.world > 1 else on_meta
    if on_meta and (par.main or par.strategy != "fsdp" or not train):
        raise SwiftKVError("a model built on the meta device (no weights) can only be the model of a rank other than 0 "
                           "of an --strategy fsdp training run, whose shards are filled from rank 0's weights")
    return some


def fill_from_rank0(pair: nn.Module, full_state: dict | None, par: Parallel) -> None:
    """After ``shard_pair``: every rank's shards filled from rank 0's whole weights (``full_state``, the pair's state
    dict taken before sharding; None on the other ranks, whose model was built on the meta device: no weights were
    loaded there). The other ranks allocate their shards and buffers, rank 0's buffers are broadcast (the
    non-persistent ones, like the rotary frequencies, are in no state dict), then PyTorch's
    ``set_model_state_dict(..., broadcast_from_rank0=True)`` sends each tensor and each rank keeps its shard."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from swiftkv.distill.vocab import scatter_slices, sharded_parameters, tie_slices

    if not par.main:
        pair.to_empty(device=par.device)
        tie_slices(pair.model)
    for buf in pair.buffers():
        dist.broadcast(buf, src=0)
    sliced = sharded_parameters(pair)  # the embedding and head: each rank its vocabulary slice of rank 0's weight
    if not par.all_true(not par.main or set(full_state) == set(pair.state_dict())):  # strict=False below: checked here
        raise RuntimeError("rank 0's weights do not name every weight of the sharded model")
    filled = set()
    for name, module in sliced.items():
        if id(module.weight) not in filled:  # a tied head shares the embedding's slice: one scatter
            filled.add(id(module.weight))
            scatter_slices(full_state[name] if par.main else None, module)
    rest = {k: v for k, v in full_state.items() if k not in sliced} if par.main else {}
    set_model_state_dict(pair, rest, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                              strict=not sliced))


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``clip_grad_norm_`` that also takes FSDP's sharded gradients: the norm is the whole gradient's."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    if not any(isinstance(g, DTensor) for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    norm = torch.nn.utils.get_total_norm(grads)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly FSDP-sharded) parameter, on the CPU; a collective under FSDP."""
    from torch.distributed.tensor import DTensor

    t = t.detach()
    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.cpu()


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly FSDP-sharded) tensor."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t
