"""The transformers engine: batched ``generate()`` of base, SwiftKV and AcrossKV wirings of one model, same process.

Every variant shares the base model's weights (SwiftKV students come from ``convert_to_swiftkv``: the
reference init, untrained, which times exactly like a trained checkpoint). ``generate`` asks for the last
position's logits only, which is what triggers SwiftKV's prefill skip. Each generate call is timed by a streamer
that stamps the first token (prefill done) and the end, so every row also says where its time went.

Timing: warm-up calls, then ``repeats`` rounds with the variants interleaved inside each round (drift and the
neighbours' load hit every variant alike), in an order drawn per round from the seed and recorded
(``round_orders``); medians with quartiles. ``concurrency``: the requests one generate call runs at once.
Memory: after timing, one extra call per variant with large allocations unpooled measures the KV cache that
``generate`` built (``cache_bytes``) and the peak RSS (CPU) or allocator peak (CUDA) above the level before the call.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig
from transformers.generation.streamers import BaseStreamer

from swiftkv.bench.serving.memory import PeakMemory, large_allocations_unpooled
from swiftkv.bench.serving.predict import predicted_speedup
from swiftkv.bench.serving.variants import VariantSpec, reference_of, round_order
from swiftkv.bench.serving.workloads import Request, poisson_arrivals, random_prompts, workload_stats
from swiftkv.bench.speed import summarize
from swiftkv.errors import SwiftKVError
from swiftkv.models.cache import cache_bytes, expected_cache_bytes
from swiftkv.models.convert import convert_to_swiftkv

logger = logging.getLogger(__name__)

WARMUP_PROMPT = 128  # tokens of a warm-up call's prompt (kernels and thread pools warm up; no full round paid)


@dataclass
class HFSettings:
    batch_size: int = 4  # requests per generate call (throughput, sharegpt uses 1: lengths differ)
    warmup: int = 1  # untimed short generate calls per variant before timing
    repeats: int = 3  # timed rounds, variants interleaved within each
    max_batch: int = 64  # cap on batch size (latency server, kv-limit)
    seed: int = 0
    memory: bool = True  # measure KV cache and peak memory after timing


class _Clock(BaseStreamer):
    """Time stamps of generate's streaming calls: the prompt (before prefill), then one per generated token."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.end_time = 0.0

    def put(self, value) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        self.end_time = time.perf_counter()


@dataclass
class Timing:
    total_s: float
    prefill_s: float  # call start -> first token
    decode_s: float  # first token -> last token
    kv_cache_bytes: int = 0
    new_tokens: int = 0  # generated tokens per row (the streamer's count)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class HFEngine:
    """Variants of one base model, and the four studies run on them."""

    name = "hf"

    def __init__(self, base, specs: list[VariantSpec], settings: HFSettings, tokenizer=None, progress: bool = True):
        self.base = base
        self.tokenizer = tokenizer
        self.settings = settings
        self.progress = progress
        self.device = next(base.parameters()).device
        self.specs = {s.id: s for s in specs}
        self.models = {s.id: self._build(s) for s in specs}
        self.reference = reference_of(specs).id
        pad = getattr(base.generation_config, "pad_token_id", None)
        if pad is None:
            pad = getattr(base.config, "pad_token_id", None)
        self.pad_id = 0 if pad is None else pad if isinstance(pad, int) else pad[0]

    def _build(self, spec: VariantSpec):
        if spec.model is not None:
            raise SwiftKVError(
                f"variant {spec.id}: the hf engine wires variants from the base model (give l and g, e.g. "
                f"{spec.id}=15,3); a separate 'model' is for the vllm engine"
            )
        if not spec.is_swiftkv:
            return self.base
        if getattr(self.base.config, "swiftkv", None) is not None:
            raise SwiftKVError("give the hf engine a base model, not a SwiftKV checkpoint: it converts the variants itself")
        return convert_to_swiftkv(self.base, spec.num_key_value_layers, spec.key_value_group_size)

    # -- one generate call --------------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, model, ids: torch.Tensor, output_len: int, keep_cache: bool = False) -> Timing:
        """Generate exactly ``output_len`` tokens for every row of ``ids`` (greedy, no EOS stop)."""
        config = GenerationConfig(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False,
                                  eos_token_id=None, pad_token_id=self.pad_id, return_dict_in_generate=keep_cache)
        clock = _Clock()
        _sync(self.device)
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config,
                             streamer=clock)
        _sync(self.device)
        t1 = time.perf_counter()
        first = clock.stamps[1] if len(clock.stamps) > 1 else t1
        kv = cache_bytes(out.cache) if keep_cache and getattr(out, "cache", None) is not None else 0
        del out
        made = max(0, len(clock.stamps) - 1)
        if made != output_len:
            raise RuntimeError(f"generate made {made} tokens per row where {output_len} were asked for")
        return Timing(t1 - t0, first - t0, t1 - first, kv, made)

    def _warmup(self, ids: torch.Tensor) -> None:
        short = ids[:, -min(ids.shape[1], WARMUP_PROMPT):]
        for _ in range(self.settings.warmup):
            for model in self.models.values():
                self.generate(model, short, 2)

    def _measure_memory(self, jobs: list[tuple[dict, str, torch.Tensor, int]]) -> None:
        """After all timing of a study: one call per (row, variant, batch, output length), memory into the row."""
        if not self.settings.memory or not jobs:
            return
        if self.device.type != "cuda" and not large_allocations_unpooled():
            logger.warning("could not unpool large allocations: peak RSS rises include reused allocator memory")
        kind = "cuda_allocated" if self.device.type == "cuda" else "rss"
        for row, name, ids, output_len in tqdm(jobs, desc="memory", disable=not self.progress, leave=False):
            with PeakMemory(self.device) as mem:
                timing = self.generate(self.models[name], ids, output_len, keep_cache=True)
            row.update({"kv_cache_bytes": timing.kv_cache_bytes, f"peak_{kind}_bytes": mem.peak,
                        f"peak_{kind}_delta_bytes": mem.delta})

    def _predicted(self, spec: VariantSpec, lengths: list[tuple[int, int]]) -> float | None:
        return predicted_speedup(self.base.config, lengths, spec.num_key_value_layers, spec.key_value_group_size)

    def _rows_with_speedup(self, rows: list[dict], key: str = "throughput_tok_s") -> list[dict]:
        """``speedup``: ratio of medians; ``paired_speedup``: median over rounds of the same round's ratio (each
        round runs every variant back to back, so this one cancels slow drifts of a shared machine)."""
        ref = next((r for r in rows if r["variant"] == self.reference), None)
        for r in rows:
            r["speedup"] = r[key] / ref[key] if ref and r.get(key) and ref.get(key) else None
            if r["speedup"] is not None and "elapsed_times_s" in r:
                pairs = zip(ref["elapsed_times_s"], r["elapsed_times_s"])
                r["paired_speedup"] = statistics.median(b / t for b, t in pairs)
        return rows

    def _timed_rounds(self, plans: dict[str, list[tuple[torch.Tensor, int]]],
                      desc: str) -> tuple[dict[str, list[Timing]], list[list[str]]]:
        """``repeats`` rounds; in each, every variant runs all its (batch, output length) calls, in an order drawn
        per round (``round_order``: no variant always runs first, or right after another). Returns the timings per
        variant in round order and each round's order."""
        rounds = {name: [] for name in plans}
        orders = [round_order(list(plans), self.settings.seed, desc, rep) for rep in range(self.settings.repeats)]
        bar = tqdm(total=self.settings.repeats * len(plans), desc=desc, disable=not self.progress, leave=False)
        for order in orders:
            for name in order:
                parts = [self.generate(self.models[name], ids, out) for ids, out in plans[name]]
                rounds[name].append(Timing(sum(p.total_s for p in parts), sum(p.prefill_s for p in parts),
                                           sum(p.decode_s for p in parts)))
                bar.update()
        bar.close()
        return rounds, orders

    def _throughput_row(self, name: str, timings: list[Timing], tokens: int) -> dict:
        spec = self.specs[name]
        times = [t.total_s for t in timings]
        tput = [tokens / t for t in times]
        stats = summarize(times)
        return {
            "variant": name,
            "label": spec.label or name,
            "num_key_value_layers": spec.num_key_value_layers,
            "key_value_group_size": spec.key_value_group_size if spec.is_swiftkv else None,
            "throughput_tok_s": tokens / stats["median_s"],
            "throughput_runs_tok_s": tput,  # one per round, in round order (paired with the other variants')
            "throughput_q1_tok_s": statistics.quantiles(tput, n=4)[0] if len(tput) > 1 else tput[0],
            "throughput_q3_tok_s": statistics.quantiles(tput, n=4)[2] if len(tput) > 1 else tput[0],
            "elapsed_s": stats["median_s"],
            "elapsed_times_s": times,
            "prefill_s": statistics.median(t.prefill_s for t in timings),
            "decode_s": statistics.median(t.decode_s for t in timings),
            "total_tokens": tokens,
        }

    # -- studies ------------------------------------------------------------------------------------------------

    def throughput(self, input_lens: list[int], output_len: int, num_requests: int) -> list[dict]:
        """Combined (input + output) tokens/s vs input length at a fixed output length (paper Fig. 3)."""
        rows, jobs = [], []
        bs = self.settings.batch_size
        for length in input_lens:
            prompts = random_prompts(num_requests, length, self.base.config.vocab_size, self.settings.seed).to(self.device)
            batches = [(prompts[i:i + bs], output_len) for i in range(0, num_requests, bs)]
            self._warmup(batches[0][0])
            rounds, orders = self._timed_rounds({name: batches for name in self.models}, f"throughput in={length}")
            tokens = num_requests * (length + output_len)
            point = []
            for name, timings in rounds.items():
                row = {"input_len": length, "output_len": output_len, "num_requests": num_requests, "batch_size": bs,
                       "concurrency": min(bs, num_requests), "round_orders": orders,
                       **self._throughput_row(name, timings, tokens),
                       "predicted_speedup": self._predicted(self.specs[name], [(length, output_len)] * num_requests)}
                jobs.append((row, name, batches[0][0], output_len))
                point.append(row)
            rows += self._rows_with_speedup(point)
        self._measure_memory(jobs)
        return rows

    def kv_limit(self, input_len: int, output_len: int, num_requests: int, limits_bytes: list[int]) -> list[dict]:
        """Throughput when the KV cache may hold at most ``limit`` bytes: batch = how many requests fit (Table 3)."""
        rows, jobs = [], []
        prompts = random_prompts(num_requests, input_len, self.base.config.vocab_size, self.settings.seed).to(self.device)
        elem = next(self.base.parameters()).element_size()
        self._warmup(prompts[:1])
        for limit in limits_bytes:
            fits, per_request = {}, {}
            for name, model in self.models.items():
                per_request[name] = expected_cache_bytes(model.config, input_len + output_len, 1, elem,
                                                         swiftkv=self.specs[name].is_swiftkv)
                fits[name] = min(self.settings.max_batch, num_requests, limit // per_request[name])
            plans = {n: [(prompts[i:i + fits[n]], output_len) for i in range(0, num_requests, fits[n])]
                     for n in self.models if fits[n] > 0}
            rounds, orders = self._timed_rounds(plans, f"kv-limit {limit / 2**20:.0f} MiB")
            tokens = num_requests * (input_len + output_len)
            point = []
            for name in self.models:
                base = {"kv_limit_bytes": limit, "input_len": input_len, "output_len": output_len,
                        "num_requests": num_requests, "kv_bytes_per_request": per_request[name]}
                if name not in rounds:
                    spec = self.specs[name]
                    point.append({**base, "variant": name, "label": spec.label or name, "batch_size": 0,
                                  "status": "does_not_fit", "throughput_tok_s": None,
                                  "reason": f"one request needs {per_request[name] / 2**20:.1f} MiB of KV cache"})
                    continue
                # requests at once: the batch, as many as the limit holds (every call but maybe the last is full)
                row = {**base, "batch_size": fits[name], "concurrency": fits[name], "round_orders": orders,
                       **self._throughput_row(name, rounds[name], tokens),
                       "predicted_speedup": self._predicted(self.specs[name], [(input_len, output_len)] * num_requests)}
                jobs.append((row, name, plans[name][0][0], output_len))
                point.append(row)
            rows += self._rows_with_speedup(point)
        self._measure_memory(jobs)
        return rows

    def latency(self, input_len: int, output_len: int, num_requests: int, rates: list[float]) -> list[dict]:
        """TTFT and TPOT vs request rate (Fig. 4): Poisson arrivals served by a static-batching loop.

        Whenever the engine is free it takes every request that has arrived (up to ``max_batch``) and generates
        them as one batch; TTFT counts from arrival (queueing included), TPOT is the decode time per token.
        """
        if output_len < 2:
            raise SwiftKVError("the latency study needs output_len >= 2 (TPOT is measured between tokens)")
        prompts = random_prompts(num_requests, input_len, self.base.config.vocab_size, self.settings.seed).to(self.device)
        self._warmup(prompts[:1])
        rows = []
        for rate in rates:
            arrivals = poisson_arrivals(num_requests, rate, self.settings.seed)
            point = []
            for name, model in tqdm(self.models.items(), desc=f"latency rate={rate}", disable=not self.progress,
                                    leave=False):
                spec = self.specs[name]
                stats = self._replay(model, prompts, arrivals, output_len)
                point.append({"variant": name, "label": spec.label or name, "request_rate": rate,
                              "input_len": input_len, "output_len": output_len, "num_requests": num_requests,
                              "num_key_value_layers": spec.num_key_value_layers, **stats})
            for r in point:
                ref = next(p for p in point if p["variant"] == self.reference)
                r["ttft_speedup"] = ref["median_ttft_ms"] / r["median_ttft_ms"]
                r["tpot_speedup"] = ref["median_tpot_ms"] / r["median_tpot_ms"]
            rows += point
        return rows

    def _replay(self, model, prompts: torch.Tensor, arrivals: list[float], output_len: int) -> dict:
        n = len(arrivals)
        ttft, tpot, e2e, batches = [0.0] * n, [0.0] * n, [0.0] * n, []
        start = time.perf_counter()
        served = 0
        while served < n:
            now = time.perf_counter() - start
            if arrivals[served] > now:
                time.sleep(arrivals[served] - now)
                continue
            end = served
            while end < n and arrivals[end] <= now and end - served < self.settings.max_batch:
                end += 1
            call = time.perf_counter() - start
            t = self.generate(model, prompts[served:end], output_len)
            first, done = call + t.prefill_s, call + t.total_s
            for i in range(served, end):
                ttft[i] = first - arrivals[i]
                tpot[i] = t.decode_s / (output_len - 1)
                e2e[i] = done - arrivals[i]
            batches.append(end - served)
            served = end
        duration = time.perf_counter() - start
        tokens = n * (prompts.shape[1] + output_len)

        def ms(values, q=None):
            vals = sorted(v * 1e3 for v in values)
            return statistics.median(vals) if q is None else vals[min(len(vals) - 1, int(q * len(vals)))]

        return {
            # per request, in arrival order (the same order, prompts and arrivals for every variant at this rate)
            "ttft_ms": [round(v * 1e3, 3) for v in ttft], "tpot_ms": [round(v * 1e3, 3) for v in tpot],
            "median_ttft_ms": ms(ttft), "mean_ttft_ms": statistics.mean(ttft) * 1e3, "p90_ttft_ms": ms(ttft, 0.9),
            "median_tpot_ms": ms(tpot), "mean_tpot_ms": statistics.mean(tpot) * 1e3, "p90_tpot_ms": ms(tpot, 0.9),
            "median_e2el_ms": ms(e2e), "duration_s": duration, "throughput_tok_s": tokens / duration,
            "mean_batch_size": statistics.mean(batches),
        }

    def sharegpt(self, filters: list[dict]) -> list[dict]:
        """Real prompts filtered by minimum input/output ratio (Table A.3), one request per generate call."""
        if self.tokenizer is None:
            raise SwiftKVError("the sharegpt study needs the model's tokenizer; a config-only (random weights) model has none")
        rows = []
        for entry in filters:
            requests = [Request(**r) for r in entry["requests"]]
            encoded = [self.tokenizer(r.prompt, return_tensors="pt")["input_ids"].to(self.device) for r in requests]
            for ids, r in zip(encoded, requests):
                if ids.shape[1] != r.input_len:
                    raise SwiftKVError(f"request {r.id} tokenises to {ids.shape[1]} tokens, the selection says "
                                       f"{r.input_len}: remake the selection with this model's tokenizer")
            plan = [(ids, r.output_len) for ids, r in zip(encoded, requests)]
            self._warmup(encoded[0])
            rounds, orders = self._timed_rounds({name: plan for name in self.models},
                                                f"sharegpt ratio>={entry['min_ratio']}")
            tokens = sum(r.input_len + r.output_len for r in requests)
            lengths = [(r.input_len, r.output_len) for r in requests]
            point = []
            for name, timings in rounds.items():
                row = {"min_ratio": entry["min_ratio"], "passing": entry.get("passing"), **workload_stats(requests),
                       "batch_size": 1, "concurrency": 1, "round_orders": orders,
                       **self._throughput_row(name, timings, tokens),
                       "predicted_speedup": self._predicted(self.specs[name], lengths)}
                point.append(row)
            rows += self._rows_with_speedup(point)
        return rows


def settings_dict(settings: HFSettings) -> dict:
    return asdict(settings)
