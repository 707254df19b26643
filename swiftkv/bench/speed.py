"""Benchmarks measured in-process: warm-up, repeats interleaved across variants, median and spread.

``bench_prefill``: time of one prefill forward (prompt in, next-token logits out) of the base model and of SwiftKV
students at several l, for several prompt lengths, all in the same process on the same weights.
"""

from __future__ import annotations

import logging
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from swiftkv.measure.flops import prefill_flops
from swiftkv.models.convert import convert_to_swiftkv
from swiftkv.provenance import cpu_name

logger = logging.getLogger(__name__)


def kept_layers(num_layers: int, fraction: float) -> int:
    """l for a kept fraction of layers (SwiftKV at 50% skips half: fraction 0.5 -> l = L/2), at least 1."""
    return max(1, min(num_layers, round(num_layers * fraction)))


def hardware() -> dict:
    info = {
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def summarize(times: list[float]) -> dict:
    qs = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return {"median_s": statistics.median(times), "q1_s": qs[0], "q3_s": qs[2], "min_s": min(times), "times_s": times}


@dataclass
class PrefillBench:
    lengths: list[int] = field(default_factory=lambda: [512, 2048])
    fractions: list[float] = field(default_factory=lambda: [0.5, 0.25])  # kept fraction of layers: l = L * f (1.0 = base)
    batch_size: int = 1
    warmup: int = 2
    repeats: int = 5
    seed: int = 0
    include_noskip: bool = False  # also time the student with every position through every layer


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def bench_prefill(model, settings: PrefillBench, progress: bool = True) -> dict:
    """Time the prefill of ``model`` (a plain base model) against its SwiftKV students; return a JSON-able dict."""
    device = next(model.parameters()).device
    num_layers = model.config.num_hidden_layers
    variants = {"base": model}
    for f in settings.fractions:
        l = kept_layers(num_layers, f)
        if l == num_layers or f"swiftkv-l{l}" in variants:
            continue  # l = L is the base model itself
        student = convert_to_swiftkv(model, l)
        variants[f"swiftkv-l{l}"] = student
        if settings.include_noskip:
            noskip = convert_to_swiftkv(model, l)
            noskip.model.prefill_skip = False
            variants[f"swiftkv-l{l}-noskip"] = noskip
    gen = torch.Generator().manual_seed(settings.seed)
    rows = []
    total = len(settings.lengths) * (settings.warmup + settings.repeats) * len(variants)
    bar = tqdm(total=total, desc="bench prefill", disable=not progress)
    for length in settings.lengths:
        ids = torch.randint(0, model.config.vocab_size, (settings.batch_size, length), generator=gen).to(device)
        times = {name: [] for name in variants}
        for rep in range(settings.warmup + settings.repeats):
            for name, m in variants.items():  # interleaved, so drift hits every variant alike
                _sync(device)
                t0 = time.perf_counter()
                m(input_ids=ids, logits_to_keep=1, use_cache=True)
                _sync(device)
                if rep >= settings.warmup:
                    times[name].append(time.perf_counter() - t0)
                bar.update()
        base = statistics.median(times["base"])
        base_flops = prefill_flops(model.config, length, logits_to_keep=1)["total"]
        for name, ts in times.items():
            m = variants[name]
            l = getattr(m.config, "num_key_value_layers", num_layers)
            flops = prefill_flops(model.config, length, l, getattr(m.config, "key_value_group_size", 1),
                                  logits_to_keep=1)["total"]
            if name.endswith("-noskip"):
                flops = base_flops  # every position runs every layer
            row = {
                "variant": name,
                "num_key_value_layers": getattr(m.config, "num_key_value_layers", num_layers),
                "prefill_tokens": length * settings.batch_size,
                "length": length,
                "batch_size": settings.batch_size,
                **summarize(ts),
            }
            row["predicted_flops"] = flops * settings.batch_size  # swiftkv.measure.flops.prefill_flops, this forward
            row["predicted_ratio"] = flops / base_flops
            row["speedup"] = base / row["median_s"]
            row["paired_speedup_median"] = statistics.median(b / t for b, t in zip(times["base"], ts))
            rows.append(row)
    bar.close()
    return {
        "benchmark": "prefill",
        "num_hidden_layers": num_layers,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "device": str(device),
        "settings": asdict(settings),
        "hardware": hardware(),
        "results": rows,
    }


@dataclass
class DistillBench:
    num_key_value_layers: int = 15
    temperature: float = 2.0
    warmup: int = 1
    repeats: int = 3
    chunk_size: int = 1024  # positions per chunk of full-vocabulary logits in the trainer's loss


STEPS = ("naive", "shared_prefix", "uncached", "cached")


def bench_distill(base_model, batches: list[dict], settings: DistillBench, progress: bool = True) -> dict:
    """Time one distillation step (forward, backward, AdamW) four ways on the same batches, interleaved:

    - ``naive``: a full teacher forward (no_grad, all logits) + a full student forward and backward (all logits);
    - ``shared_prefix``: the trainer's step before the teacher cache: layers < l once for teacher and student (no
      autograd there), the teacher's layers >= l under no_grad, the chunked loss through the head with autograd
      (``distill_kl_autograd``);
    - ``uncached``: the trainer's step today without a cache: the same with the closed-form loss (``distill_kl``);
    - ``cached``: the trainer's step with a teacher cache (``swiftkv.distill.teacher_cache``): only the student's layers
      >= l and the heads run (closed-form loss); the cached values come from one teacher pass over the same batches
      (timed too: ``cache_build_tokens_per_s``, the rate a cache is built at).

    Wall time and process CPU time are both recorded: on a shared machine the CPU time (tokens per CPU-second,
    times the cores used) says what the step would do with the cores to itself. ``loss_max_abs_diff``: the largest
    difference between the three paths' losses on the same batch with the same weights (before any timing step).
    """
    from swiftkv.distill import DistillModel, DistillSettings, build_student, compute_loss
    from swiftkv.distill.losses import distill_kl_autograd, kl_sum
    from swiftkv.distill.teacher_cache import teacher_states

    device = next(base_model.parameters()).device
    dset = DistillSettings(num_key_value_layers=settings.num_key_value_layers, temperature=settings.temperature,
                           chunk_size=settings.chunk_size)
    student = build_student(base_model, dset)
    pair = DistillModel(student).train()
    head = student.get_output_embeddings()
    params = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-6)
    l = settings.num_key_value_layers

    def build_cache(batch):
        values = teacher_states(student.model, batch["input_ids"], batch["position_ids"], [l])
        return {"boundary": values[f"h{l}"], "teacher": values["final"]}

    student.swiftkv(False)
    cached = [build_cache(b) for b in batches]  # also a warm-up of the teacher pass
    student.swiftkv(True)

    def naive_loss(batch, _):
        mask = batch["loss_mask"]
        kw = dict(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)  # packed rows
        with torch.no_grad():
            teacher = student.swiftkv(False)(**kw).logits
        logits = student.swiftkv(True)(**kw).logits
        return kl_sum(logits[mask], teacher[mask], dset.temperature) / mask.sum()

    def shared_loss(batch, _):
        out = pair(batch["input_ids"], batch["position_ids"])
        mask = batch["loss_mask"]
        return distill_kl_autograd(out.student[mask], out.teacher[mask], head, dset.temperature,
                                   dset.chunk_size) / mask.sum()

    def uncached_loss(batch, _):
        return compute_loss(pair(batch["input_ids"], batch["position_ids"]), batch, head, dset)

    def cached_loss(batch, values):
        out = pair(batch["input_ids"], batch["position_ids"], values["boundary"], values["teacher"])
        return compute_loss(out, batch, head, dset)

    losses = {"naive": naive_loss, "shared_prefix": shared_loss, "uncached": uncached_loss, "cached": cached_loss}
    first = {name: [float(fn(b, c).detach()) for b, c in zip(batches, cached)] for name, fn in losses.items()}
    loss_diff = max(abs(a - b) for name in STEPS for a, b in zip(first[name], first["shared_prefix"]))

    times = {name: [] for name in STEPS}
    cpu_times = {name: [] for name in STEPS}  # process CPU time: the work done, whatever else shares the cores
    build_times = []
    tokens = [int(b["loss_mask"].sum()) for b in batches]
    bar = tqdm(total=(settings.warmup + settings.repeats) * (len(STEPS) + 1) * len(batches), desc="bench distill",
               disable=not progress)
    for rep in range(settings.warmup + settings.repeats):
        student.swiftkv(False)
        _sync(device)
        t0 = time.perf_counter()
        for batch in batches:  # the cache build, at the same point of the interleaving
            build_cache(batch)
            bar.update()
        _sync(device)
        student.swiftkv(True)
        if rep >= settings.warmup:
            build_times.append(time.perf_counter() - t0)
        for name in STEPS:  # interleaved, so drift hits every path alike
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            for batch, values in zip(batches, cached):
                losses[name](batch, values).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                bar.update()
            _sync(device)
            if rep >= settings.warmup:
                times[name].append(time.perf_counter() - t0)
                cpu_times[name].append(time.process_time() - c0)
    bar.close()
    rows = []
    for name, ts in times.items():
        row = {"step": name, "tokens": sum(tokens), **summarize(ts)}
        row["tok_per_s"] = sum(tokens) / row["median_s"]
        row["tok_per_s_q1"] = sum(tokens) / row["q3_s"]  # the slower quartile of times = the lower one of rates
        row["tok_per_s_q3"] = sum(tokens) / row["q1_s"]
        row["cpu_s_median"] = statistics.median(cpu_times[name])
        row["tok_per_cpu_s"] = sum(tokens) / row["cpu_s_median"]
        rows.append(row)
    by = {r["step"]: r for r in rows}
    for row in rows:
        row["speedup_vs_naive"] = by["naive"]["median_s"] / row["median_s"]
        row["speedup_vs_shared_prefix"] = by["shared_prefix"]["median_s"] / row["median_s"]
    return {
        "benchmark": "distill_step",
        "num_hidden_layers": base_model.config.num_hidden_layers,
        "num_key_value_layers": l,
        "batch_shapes": [list(b["input_ids"].shape) for b in batches],
        "dtype": str(next(base_model.parameters()).dtype).replace("torch.", ""),
        "settings": asdict(settings),
        "hardware": hardware(),
        "tokens_per_s": {r["step"]: r["tok_per_s"] for r in rows},
        "cache_build_tokens_per_s": sum(tokens) / statistics.median(build_times),
        "cache_build": summarize(build_times),
        "loss_max_abs_diff": loss_diff,
        "losses": first,
        "results": rows,
    }


def random_packed_batches(vocab_size: int, length: int, count: int, seed: int = 0, device="cpu") -> list[dict]:
    """Packed rows of random tokens (conversations of 200-2000 tokens, position ids restarting) for speed tests of
    models with random weights, where no tokenizer or data is at hand."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        ids, pos = [], []
        while len(ids) < length:
            n = min(int(torch.randint(200, 2000, (1,), generator=gen)), length - len(ids))
            ids += torch.randint(0, vocab_size, (n,), generator=gen).tolist()
            pos += range(n)
        rows.append({
            "input_ids": torch.tensor([ids], device=device),
            "position_ids": torch.tensor([pos], device=device),
            "labels": torch.tensor([ids[1:] + [-100]], device=device),
            "loss_mask": torch.ones(1, length, dtype=torch.bool, device=device),
        })
    return rows
