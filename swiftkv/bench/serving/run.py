"""``swiftkv bench serve``: one study on one engine, from a typed request (``ServeRequest``) to a result JSON."""

from __future__ import annotations

import logging
import platform
import sys
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from swiftkv.bench.serving.variants import parse_variants
from swiftkv.errors import SwiftKVError
from swiftkv.io import check_output_dir, open_output_dir, write_json

logger = logging.getLogger(__name__)

MIB = 1 << 20


@dataclass
class ServeRequest:
    """One serving study on one engine (``swiftkv bench serve``'s options, typed; defaults as the command's)."""

    model: str
    engine: str  # hf | vllm
    study: str  # throughput | latency | kv-limit | sharegpt
    output: str  # the result JSON
    variant: list[str] | None = None  # variant specs (swiftkv.bench.serving.variants.parse_variants)
    noise_floor: bool = False  # measure the reference variant twice, interleaved: the base-vs-base noise floor
    input_lens: list[int] = field(default_factory=lambda: [1024])
    output_len: int = 64
    num_requests: int = 4
    request_rates: list[float] | None = None
    kv_limits_mib: list[float] | None = None
    requests: str | None = None  # sharegpt: the selection JSON
    min_ratios: list[float] | None = None
    batch_size: int = 4
    max_batch: int = 64
    warmup: int = 1
    repeats: int = 3
    seed: int = 0
    dtype: str = "auto"
    device: str = "cpu"
    threads: int | None = None
    resources: str | None = None
    no_memory: bool = False
    vllm_command: str | None = None  # None: VllmSettings' default (vllm on PATH)
    vllm_args: str = ""
    kv_cache_mib: float | None = 1024
    max_model_len: int | None = None
    workdir: str | None = None
    on_unavailable: str = "error"  # error | mark (write the reason, not measured)
    overwrite: bool = False

    @classmethod
    def from_options(cls, options) -> "ServeRequest":
        """From any object with these attributes (the command's parsed options); absent ones keep the defaults."""
        return cls(**{f.name: getattr(options, f.name) for f in fields(cls) if hasattr(options, f.name)})

    def to_args(self) -> list[str]:
        """The ``swiftkv bench serve`` arguments of this request (their parse gives it back, ``from_options``):
        MODEL, then --FIELD for every field away from its default (each variant as its own --variant)."""
        args = [self.model]
        for f in fields(self):
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            if f.name == "model" or (value == default and default is not MISSING) or value is False:
                continue
            flag = "--" + f.name.replace("_", "-")
            if value is True:
                args.append(flag)
            elif f.name == "variant":
                args += [a for spec in value for a in ("--variant", spec)]
            elif isinstance(value, list):
                args += [flag, *map(str, value)]
            elif str(value).startswith("-"):  # e.g. --vllm-args=--tensor-parallel-size 2
                args.append(f"{flag}={value}")
            else:
                args += [flag, str(value)]
        return args


def hardware_label(hw: dict, device: str) -> str:
    """Short text naming the machine a number was measured on (figure legends, table columns)."""
    if device.startswith("cuda") and hw.get("gpu"):
        count = hw.get("gpu_count", 1)
        return f"{count}x {hw['gpu']}" if count > 1 else hw["gpu"]
    isa = hw.get("cpu_isa")
    return f"{hw.get('cpu', 'CPU')}, {hw.get('cpu_count')} CPUs" + (f" ({isa})" if isa else "")


def machine(device: str) -> dict:
    import torch

    from swiftkv.bench.speed import hardware

    hw = hardware()
    hw["cpu_isa"] = getattr(torch.backends.cpu, "get_cpu_capability", lambda: None)()
    if torch.cuda.is_available():
        hw["gpu_count"] = torch.cuda.device_count()
    hw["label"] = hardware_label(hw, device)
    return hw


def _workload(request: ServeRequest) -> dict:
    if request.study == "throughput":
        return {"input_lens": request.input_lens, "output_len": request.output_len, "num_requests": request.num_requests}
    if request.study == "latency":
        return {"input_len": request.input_lens[0], "output_len": request.output_len, "num_requests": request.num_requests,
                "request_rates": request.request_rates}
    if request.study == "kv-limit":
        return {"input_len": request.input_lens[0], "output_len": request.output_len, "num_requests": request.num_requests,
                "kv_limits_mib": request.kv_limits_mib}
    return {"requests": request.requests}


def _check_request(request: ServeRequest) -> None:
    if request.study == "latency" and not request.request_rates:
        raise SwiftKVError("the latency study needs --request-rates")
    if request.study == "kv-limit" and not request.kv_limits_mib:
        raise SwiftKVError("the kv-limit study needs --kv-limits-mib")
    if request.study == "sharegpt" and not request.requests:
        raise SwiftKVError("the sharegpt study needs --requests FILE (made by: swiftkv bench sharegpt-requests)")
    if request.study in ("latency", "kv-limit") and len(request.input_lens) != 1:
        raise SwiftKVError(f"the {request.study} study takes one --input-lens value")


def _study(engine, request: ServeRequest, filters):
    w = _workload(request)
    if request.study == "throughput":
        return engine.throughput(w["input_lens"], w["output_len"], w["num_requests"])
    if request.study == "latency":
        return engine.latency(w["input_len"], w["output_len"], w["num_requests"], w["request_rates"])
    if request.study == "kv-limit":
        return engine.kv_limit(w["input_len"], w["output_len"], w["num_requests"],
                               [int(m * MIB) for m in w["kv_limits_mib"]])
    return engine.sharegpt(filters)


def bench_serve(request: ServeRequest) -> dict:
    """Run one study on one engine and write the result JSON (also when the engine cannot run here)."""
    from swiftkv.bench.serving.workloads import load_selection

    _check_request(request)
    specs = parse_variants(request.variant, request.noise_floor)
    filters = None
    if request.study == "sharegpt":
        selection = load_selection(request.requests)
        filters = [f for f in selection["filters"] if not request.min_ratios or f["min_ratio"] in request.min_ratios]
    result = {"benchmark": "serve", "engine": request.engine, "study": request.study, "model": request.model,
              "device": request.device, "variants": [s.to_dict() for s in specs], "workload": _workload(request)}
    if request.engine == "hf":
        result.update(_run_hf(request, specs, filters))
    else:
        result.update(_run_vllm(request, specs, filters))
    write_json(request.output, result, overwrite=request.overwrite)
    return result


def _run_hf(request: ServeRequest, specs, filters) -> dict:
    import torch
    import transformers

    from swiftkv.bench.serving.hf import HFEngine, HFSettings, settings_dict
    from swiftkv.bench.serving.models import load_bench_model
    from swiftkv.device import resolve_dtype

    if request.device.startswith("cuda") and not torch.cuda.is_available():
        why = f"transformers on {request.device} needs a CUDA GPU and this machine has none"
        if request.on_unavailable == "error":
            raise SwiftKVError(why + "; use --device cpu")
        print(f"not measured here: {why}", file=sys.stderr)
        return {"status": "not_measured", "reason": why, "hardware": machine(request.device),
                "results": [{"variant": s.id, "label": s.label or s.id, "status": "not_measured", "reason": why}
                            for s in specs]}
    if request.threads:
        torch.set_num_threads(request.threads)
    dtype = resolve_dtype(request.dtype, request.device)
    model, tokenizer = load_bench_model(request.model, dtype, request.device, request.resources, seed=request.seed)
    settings = HFSettings(batch_size=request.batch_size, warmup=request.warmup, repeats=request.repeats, seed=request.seed,
                          max_batch=request.max_batch, memory=not request.no_memory)
    engine = HFEngine(model, specs, settings, tokenizer)
    rows = _study(engine, request, filters)
    return {"status": "measured", "engine_version": f"transformers {transformers.__version__}",
            "dtype": str(dtype).replace("torch.", ""), "hardware": machine(request.device),
            "settings": settings_dict(settings), "num_hidden_layers": model.config.num_hidden_layers, "results": rows}


def _run_vllm(request: ServeRequest, specs, filters) -> dict:
    import shlex

    from swiftkv.bench.serving.models import is_config_file
    from swiftkv.bench.serving.vllm import Unavailable, VllmEngine, VllmSettings, settings_dict
    from swiftkv.device import fast_dtype
    from swiftkv.loading import resolve_model

    if is_config_file(request.model):
        raise SwiftKVError("vLLM needs a model directory or hub id, not a config JSON (random weights are hf-only)")
    dtype = request.dtype if request.dtype != "auto" else str(fast_dtype(request.device)).replace("torch.", "")
    model = resolve_model(request.model, request.resources)  # a bad model fails before anything is written
    what = "vLLM raw outputs and logs"
    workdir = check_output_dir(request.workdir or Path(request.output).with_suffix(""), request.overwrite, what,
                               replace=False).resolve()  # created once the engine is known to run here
    settings = VllmSettings(
        command=shlex.split(request.vllm_command) if request.vllm_command else VllmSettings().command,
        device=request.device, dtype=dtype,
        kv_cache_bytes=int(request.kv_cache_mib * MIB) if request.kv_cache_mib else None, max_model_len=request.max_model_len,
        threads=request.threads, warmup=request.warmup, repeats=request.repeats, seed=request.seed,
        engine_args=shlex.split(request.vllm_args or ""), workdir=str(workdir),
    )
    engine = VllmEngine(model, specs, settings)
    info = {"dtype": dtype, "hardware": machine(request.device), "settings": settings_dict(settings),
            "model_path": model}
    try:
        engine.check_available()
    except Unavailable as why:
        if request.on_unavailable == "error":
            raise SwiftKVError(str(why)) from None
        print(f"not measured here: {why}", file=sys.stderr)
        rows = [{"variant": s.id, "label": s.label or s.id, "status": "not_measured", "reason": str(why)} for s in specs]
        return {**info, "status": "not_measured", "reason": str(why), "results": rows}
    open_output_dir(workdir, request.overwrite, what)
    rows = _study(engine, request, filters)
    return {**info, "status": "measured", "engine_version": f"vllm {engine.version}", "results": rows,
            "platform": platform.platform()}
