"""Peak memory per rank of a distillation step: one process vs DDP vs FSDP2, fp32 vs bf16 frozen weights, with and
without gradient checkpointing; and the same accounting's prediction for Llama-3.1-8B and 70B at the paper's settings.

Each case runs in fresh processes (``torchrun --standalone`` for 2 ranks) on a random-weight model of the shape
given (default: Llama-3.2-1B's, from a config dict: no download), built on the meta device and materialised in
place (the frozen weights directly in their dtype; under FSDP each rank only its shards), then one optimizer step of
the distillation (shared prefix, teacher and student upper layers, KL through the LM head, AdamW on the trainable
``*_swiftkv`` parameters in fp32). Peak resident memory is ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of each
rank (the high-water mark of the process's resident set, imports included); ``baseline`` is the same number once
torch and transformers are imported, before the model exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from swiftkv.provenance import cpu_name

LLAMA_3_2_1B = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                    "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True, "head_dim": 64}
LLAMA_3_1_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                    "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False, "head_dim": 128}
LLAMA_3_1_70B = {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                     "intermediate_size": 28672, "vocab_size": 128256, "tie_word_embeddings": False, "head_dim": 128}
GPU_BYTES = 80e9  # an 80 GB GPU (A100/H100)
FREED_MEMORY_THRESHOLD = 128 * 1024  # --return-freed-memory: blocks above 128 KiB are mmapped, so freed ones go back
CHUNK = 1024  # positions per chunk of full-vocabulary logits (the trainer's default)


@dataclass
class Case:
    strategy: str  # none | ddp | fsdp
    processes: int
    dtype: str  # float32 | bfloat16: the frozen weights
    checkpointing: bool
    rows: int = 1  # rows per rank
    length: int = 32  # tokens per row
    shape: dict = field(default_factory=lambda: dict(LLAMA_3_2_1B))
    device: str = "cpu"  # cpu (gloo; peak resident memory) | cuda (nccl; also the peak of allocated GPU memory)

    @property
    def name(self) -> str:
        return f"{self.strategy}-{self.processes}-{self.dtype}{'-ckpt' if self.checkpointing else ''}"


def default_cases(length: int) -> list[Case]:
    return [Case(s, p, d, c, length=length) for d, c in (("float32", False), ("bfloat16", True))
            for s, p in (("none", 1), ("ddp", 2), ("fsdp", 2))]


# -- the accounting -------------------------------------------------------------------------------------------------


def count_parameters(shape: dict, l: int | None = None) -> tuple[int, int]:
    """(frozen, trainable) parameters of a SwiftKV-50 student (l = L/2, partial scope) of a Llama-shaped model."""
    h, L, inter, v = shape["hidden_size"], shape["num_hidden_layers"], shape["intermediate_size"], shape["vocab_size"]
    d = shape.get("head_dim") or h // shape["num_attention_heads"]
    q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d
    l = L // 2 if l is None else l
    layer = h * q + 2 * h * kv + q * h + 3 * h * inter + 2 * h
    frozen = L * layer + v * h * (1 if shape.get("tie_word_embeddings") else 2) + h
    trainable = (L - l) * (h * q + 2 * h * kv) + h  # q/k/v_proj_swiftkv of layers >= l, norm_swiftkv
    return frozen, trainable


def predict_bytes(shape: dict, strategy: str, processes: int, dtype_bytes: int, checkpointing: bool,
                  tokens_per_rank: int) -> dict:
    """Predicted peak bytes per rank, by part: weights (frozen, in their dtype), trainable (fp32 weights, gradients
    and AdamW's two states: 16 bytes each), both divided by the ranks under FSDP; FSDP's gathered working set (two
    decoder layers); activations of the student's layers >= l (per token and layer,
    9h + 4I values stored for backward, or with checkpointing the layer input plus one layer's recompute), the
    boundary/teacher states and one chunk of full-vocabulary logits (fp32: student, teacher, gradient; under FSDP a
    chunk of every rank's positions against this rank's vocabulary slice). Under FSDP the largest unit is counted
    once more: FSDP2 all-gathers a unit into one buffer and copies it out into the unsharded parameters, so while it
    gathers the unit is held twice (the term that brought the 2-rank CPU prediction from 22 % under the measured
    peak to within 4 %, ``docs/distributed.md``); the embedding and head are not units (split by vocabulary)."""
    h, L, inter, v = shape["hidden_size"], shape["num_hidden_layers"], shape["intermediate_size"], shape["vocab_size"]
    frozen, trainable = count_parameters(shape)
    shards = processes if strategy == "fsdp" else 1
    parts = {"frozen_weights": frozen * dtype_bytes / shards, "trainable_with_adam": trainable * 16 / shards}
    if strategy == "fsdp":  # the embedding and head stay split by vocabulary (swiftkv.distill.vocab): never gathered
        layer = (frozen - v * h * (1 if shape.get("tie_word_embeddings") else 2)) / L
        parts["fsdp_gathered"] = 2 * layer * dtype_bytes
        parts["fsdp_gather_copy"] = layer * dtype_bytes
    upper = L - L // 2
    per_token_layer = (9 * h + 4 * inter) * dtype_bytes
    if checkpointing:
        acts = upper * tokens_per_rank * h * dtype_bytes + tokens_per_rank * per_token_layer
    else:
        acts = upper * tokens_per_rank * per_token_layer
    # the loss's chunk of logits; under FSDP a chunk of every rank's positions against this rank's vocabulary slice
    positions, vocab = (processes * tokens_per_rank, -(-v // processes)) if strategy == "fsdp" else (tokens_per_rank, v)
    parts["activations"] = acts + 4 * tokens_per_rank * h * 4 + 3 * min(CHUNK, positions) * vocab * 4
    parts["total"] = sum(parts.values())
    return parts


def paper_predictions(length: int = 8192, rows_per_gpu: int = 1) -> list[dict]:
    """Per-GPU bytes of Llama-3.1-8B and 70B SwiftKV-50 distillation at the paper's settings (rows of 8192 tokens,
    one per GPU, bf16 frozen weights), by strategy, and the fewest GPUs (powers of two up to 64) that fit 80 GB."""
    out = []
    for name, shape in (("llama-3.1-8b", LLAMA_3_1_8B), ("llama-3.1-70b", LLAMA_3_1_70B)):
        for strategy in ("ddp", "fsdp"):
            for ckpt in (False, True):
                at8 = predict_bytes(shape, strategy, 8, 2, ckpt, rows_per_gpu * length)
                fits = [n for n in (1, 2, 4, 8, 16, 32, 64)
                        if predict_bytes(shape, strategy, n, 2, ckpt, rows_per_gpu * length)["total"] <= GPU_BYTES]
                out.append({"model": name, "strategy": strategy, "checkpointing": ckpt, "gpus": 8,
                            "per_gpu_gb": at8["total"] / 1e9, "parts_gb": {k: b / 1e9 for k, b in at8.items()},
                            "fewest_80gb_gpus": fits[0] if fits else None})
    return out


# -- one case (in each of its processes) ----------------------------------------------------------------------------


def _max_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class PhaseSampler:
    """The resident set sampled every 2 ms on a thread; ``mark(name)`` starts a phase, ``peaks()`` gives each phase's
    highest sample and its last (where the step's memory goes: building, forward, loss, backward, optimizer)."""

    def __init__(self, period: float = 0.002):
        import threading
        import time

        self.clock, self.period, self.samples, self.marks, self.done = time.perf_counter, period, [], [], False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        import time

        while not self.done:
            self.samples.append((self.clock(), self.rss()))
            time.sleep(self.period)

    def mark(self, name: str) -> None:
        self.samples.append((self.clock(), self.rss()))
        self.marks.append((self.clock(), name))

    def peaks(self) -> dict:
        self.mark("end")
        self.done = True
        self.thread.join()
        out = {}
        samples = sorted(self.samples)  # in time order (the thread and mark() append side by side)
        for (start, name), (stop, _) in zip(self.marks, self.marks[1:]):
            inside = [b for t, b in samples if start <= t <= stop]
            out[name] = {"peak_bytes": max(inside), "end_bytes": inside[-1]}
        return out


def run_case(case: Case, out_dir: Path) -> None:
    """One optimizer step of the distillation of ``case``; this rank's peak RSS into ``out_dir/rank-<r>.json``."""
    import torch

    baseline = _max_rss_bytes()
    phases = PhaseSampler()
    phases.mark("build")
    from transformers import LlamaConfig

    from swiftkv.distill.pair import DistillModel, compute_loss, trainable_parameters
    from swiftkv.distill.parallel import Parallel, clip_grad_norm, enable_checkpointing, keep_trainable_fp32
    from swiftkv.distill.settings import DistillSettings
    from swiftkv.distill.vocab import tie_slices
    from swiftkv.models.convert import FAMILIES, set_trainable, swiftkv_config_from

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // case.processes))
    cuda = case.device == "cuda"
    if case.strategy == "fsdp" and case.processes == 1:  # FSDP2 over a one-rank group: its code path on this device
        par = _one_rank_fsdp(cuda)  # (one GPU shards nothing, but runs fully_shard, NCCL and the mixed dtypes)
    else:
        par = Parallel.start(case.strategy, cpu=not cuda)
    dtype = getattr(torch, case.dtype)
    config = LlamaConfig(**case.shape)
    config._attn_implementation = "sdpa"
    L = config.num_hidden_layers
    settings = DistillSettings(num_key_value_layers=L // 2)
    with torch.device("meta"):  # the student's own class on meta (conversion copies weights: there are none here)
        student = FAMILIES["llama"].model_class(swiftkv_config_from(config, L // 2, 1))
    set_trainable(student, "partial")
    for p in student.parameters():  # frozen weights in their dtype, trainable ones fp32 (still on meta: no bytes)
        if not p.requires_grad:
            p.data = p.data.to(dtype)
    keep_trainable_fp32(student)
    pair = DistillModel(student)
    if case.checkpointing:
        enable_checkpointing(student, settings.num_key_value_layers)

    def materialise() -> None:  # each rank allocates what it holds: the whole model, or under FSDP its shards
        rotary = student.model.rotary_emb
        pair.to_empty(device=par.device)
        if case.strategy != "fsdp":  # to_empty gives each module its own copy of a tied weight: tie them again
            student.tie_weights()
        else:  # the same for the embedding's and the head's vocabulary slices
            tie_slices(student)
        student.model.rotary_emb = type(rotary)(config=config).to(par.device)
        torch.manual_seed(0)
        with torch.no_grad():
            for name, p in pair.named_parameters():
                if "norm" in name:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02)

    if case.strategy == "fsdp":  # sharded on meta, then each rank's shards allocated
        model = par.wrap(pair)
        materialise()
    else:  # DDP broadcasts rank 0's weights when it wraps: they must exist
        materialise()
        model = par.wrap(pair)
    params = list(trainable_parameters(pair).values())
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    built = _max_rss_bytes()
    phases.mark("prepare")
    gen = torch.Generator().manual_seed(par.rank)
    ids = torch.randint(0, config.vocab_size, (case.rows, case.length), generator=gen).to(par.device)
    pos = torch.arange(case.length, device=par.device).expand(case.rows, -1)
    batch = {"input_ids": ids, "position_ids": pos, "labels": torch.roll(ids, -1, 1),
             "loss_mask": torch.ones_like(ids, dtype=torch.bool)}
    pair.train()
    counted = par.sum(batch["loss_mask"].sum())
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with torch.autocast(par.device.type, dtype=dtype, enabled=dtype != torch.float32):  # fp32 trainables meet bf16 frozen ones
        phases.mark("forward")
        out = model(ids, pos)
        phases.mark("loss")
        loss = compute_loss(out, batch, student.get_output_embeddings(), settings, counted) * par.world
    phases.mark("backward")
    loss.backward()
    phases.mark("optimizer")
    clip_grad_norm(params, 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    result = {"rank": par.rank, "baseline_bytes": baseline, "built_bytes": built, "peak_bytes": _max_rss_bytes(),
              "loss": float(par.sum(loss.detach() / par.world)), "phases": phases.peaks()}
    if cuda:  # the step's high-water mark of memory torch allocated on this rank's GPU (weights included)
        result["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
    (out_dir / f"rank-{par.rank}.json").write_text(json.dumps(result))
    par.barrier()
    par.stop()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _one_rank_fsdp(cuda: bool):
    """A process group of one rank (nccl on a GPU, gloo on a CPU) so that FSDP2 runs in a single process; ``Parallel``
    would otherwise run one process as strategy none."""
    import socket

    import torch
    import torch.distributed as dist

    from swiftkv.distill.parallel import Parallel

    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1,
                            device_id=device if cuda else None)
    return Parallel(0, 1, device, "fsdp")


def launch_case(case: Case, timeout: int = 1800, mmap_threshold: int | None = None) -> dict:
    """``case`` in fresh processes (torchrun for more than one); per-rank peaks and the accounting's prediction.
    ``mmap_threshold``: glibc's ``MALLOC_MMAP_THRESHOLD_`` for them (None: glibc's default, a threshold that grows
    with the blocks freed, so that freed memory below it can stay resident)."""
    with tempfile.TemporaryDirectory(prefix="swiftkv-mem-") as tmp:
        spec = json.dumps({"case": asdict(case), "out": tmp})
        if case.processes == 1:
            cmd = [sys.executable, "-m", "swiftkv.bench.distill_memory", spec]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                   str(case.processes), "-m", "swiftkv.bench.distill_memory", spec]
        env = {**os.environ, **({"MALLOC_MMAP_THRESHOLD_": str(mmap_threshold)} if mmap_threshold else {})}
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if done.returncode != 0:
            from swiftkv.errors import RunFailed

            tail = [x for x in done.stderr.strip().splitlines() if x.strip()][-1:] or ["no output"]
            raise RunFailed(f"distill-memory case {case.name} failed (exit {done.returncode}): {tail[0][:200]}")
        ranks = sorted((json.loads(p.read_text()) for p in Path(tmp).glob("rank-*.json")), key=lambda r: r["rank"])
    dtype_bytes = 4 if case.dtype == "float32" else 2
    predicted = predict_bytes(case.shape, case.strategy, case.processes, dtype_bytes, case.checkpointing,
                              case.rows * case.length)
    return {"case": case.name, **{k: v for k, v in asdict(case).items() if k != "shape"}, "ranks": ranks,
            "peak_bytes_max_rank": max(r["peak_bytes"] for r in ranks),
            "peak_minus_baseline_bytes_max_rank": max(r["peak_bytes"] - r["baseline_bytes"] for r in ranks),
            "predicted_bytes": predicted,
            **({"peak_gpu_bytes_max_rank": max(r["peak_gpu_bytes"] for r in ranks)} if case.device == "cuda" else {})}


def bench_distill_memory(cases: list[Case], progress=print, mmap_threshold: int | None = None) -> dict:
    import platform

    rows = []
    for case in cases:
        progress(f"{case.name}: running")
        rows.append(launch_case(case, mmap_threshold=mmap_threshold))
    by = {r["case"]: r for r in rows}
    goals = {}

    def ratio(a: str, b: str, key: str = "peak_bytes_max_rank") -> float | None:
        return by[a][key] / by[b][key] if a in by and b in by else None

    goals["fsdp_over_ddp_fp32"] = ratio("fsdp-2-float32", "ddp-2-float32")
    goals["fsdp_over_ddp_fp32_above_baseline"] = ratio("fsdp-2-float32", "ddp-2-float32",
                                                       "peak_minus_baseline_bytes_max_rank")
    goals["bf16_ckpt_over_fp32_one_process"] = ratio("none-1-bfloat16-ckpt", "none-1-float32")
    goals["bf16_ckpt_over_fp32_one_process_above_baseline"] = ratio("none-1-bfloat16-ckpt", "none-1-float32",
                                                                    "peak_minus_baseline_bytes_max_rank")
    threshold = mmap_threshold or os.environ.get("MALLOC_MMAP_THRESHOLD_")
    allocator = f"glibc, MALLOC_MMAP_THRESHOLD_={threshold}" if threshold else "glibc default"
    return {"measure": "resource.getrusage(RUSAGE_SELF).ru_maxrss per rank (peak resident set, imports included)",
            "allocator": allocator,
            "cpu": cpu_name(), "platform": platform.platform(), "shape": cases[0].shape if cases else None,
            "results": rows, "ratios": goals, "paper_predictions": paper_predictions()}


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    run_case(Case(**spec["case"]), Path(spec["out"]))
    sys.exit(0)
