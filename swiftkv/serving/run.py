"""``swiftkv bench serve`` and ``swiftkv bench sharegpt-requests``: from arguments to a result JSON."""

from __future__ import annotations

import logging
import platform
import sys
from pathlib import Path

from swiftkv.errors import SwiftKVError
from swiftkv.io import open_output_dir, write_json
from swiftkv.serving.variants import parse_variants

logger = logging.getLogger(__name__)

MIB = 1 << 20


def hardware_label(hw: dict, device: str) -> str:
    """Short text naming the machine a number was measured on (figure legends, table columns)."""
    if device.startswith("cuda") and hw.get("gpu"):
        count = hw.get("gpu_count", 1)
        return f"{count}x {hw['gpu']}" if count > 1 else hw["gpu"]
    isa = hw.get("cpu_isa")
    return f"{hw.get('cpu', 'CPU')}, {hw.get('cpu_count')} CPUs" + (f" ({isa})" if isa else "")


def machine(device: str) -> dict:
    import torch

    from swiftkv.bench import hardware

    hw = hardware()
    hw["cpu_isa"] = getattr(torch.backends.cpu, "get_cpu_capability", lambda: None)()
    if torch.cuda.is_available():
        hw["gpu_count"] = torch.cuda.device_count()
    hw["label"] = hardware_label(hw, device)
    return hw


def _workload(args) -> dict:
    if args.study == "throughput":
        return {"input_lens": args.input_lens, "output_len": args.output_len, "num_requests": args.num_requests}
    if args.study == "latency":
        return {"input_len": args.input_lens[0], "output_len": args.output_len, "num_requests": args.num_requests,
                "request_rates": args.request_rates}
    if args.study == "kv-limit":
        return {"input_len": args.input_lens[0], "output_len": args.output_len, "num_requests": args.num_requests,
                "kv_limits_mib": args.kv_limits_mib}
    return {"requests": args.requests}


def _check_args(args) -> None:
    if args.study == "latency" and not args.request_rates:
        raise SwiftKVError("the latency study needs --request-rates")
    if args.study == "kv-limit" and not args.kv_limits_mib:
        raise SwiftKVError("the kv-limit study needs --kv-limits-mib")
    if args.study == "sharegpt" and not args.requests:
        raise SwiftKVError("the sharegpt study needs --requests FILE (made by: swiftkv bench sharegpt-requests)")
    if args.study in ("latency", "kv-limit") and len(args.input_lens) != 1:
        raise SwiftKVError(f"the {args.study} study takes one --input-lens value")


def _study(engine, args, filters):
    w = _workload(args)
    if args.study == "throughput":
        return engine.throughput(w["input_lens"], w["output_len"], w["num_requests"])
    if args.study == "latency":
        return engine.latency(w["input_len"], w["output_len"], w["num_requests"], w["request_rates"])
    if args.study == "kv-limit":
        return engine.kv_limit(w["input_len"], w["output_len"], w["num_requests"],
                               [int(m * MIB) for m in w["kv_limits_mib"]])
    return engine.sharegpt(filters)


def bench_serve(args) -> dict:
    """Run one study on one engine and write the result JSON (also when the engine cannot run here)."""
    from swiftkv.serving.workloads import load_selection

    _check_args(args)
    specs = parse_variants(args.variant)
    filters = None
    if args.study == "sharegpt":
        selection = load_selection(args.requests)
        filters = [f for f in selection["filters"] if not args.min_ratios or f["min_ratio"] in args.min_ratios]
    result = {"benchmark": "serve", "engine": args.engine, "study": args.study, "model": args.model,
              "device": args.device, "variants": [s.to_dict() for s in specs], "workload": _workload(args)}
    if args.engine == "hf":
        result.update(_run_hf(args, specs, filters))
    else:
        result.update(_run_vllm(args, specs, filters))
    write_json(args.output, result, overwrite=getattr(args, "overwrite", False))
    return result


def _run_hf(args, specs, filters) -> dict:
    import torch
    import transformers

    from swiftkv.serving.hf import HFEngine, HFSettings, settings_dict
    from swiftkv.serving.models import load_bench_model
    from swiftkv.device import resolve_dtype

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        why = f"transformers on {args.device} needs a CUDA GPU and this machine has none"
        if args.on_unavailable == "error":
            raise SwiftKVError(why + "; use --device cpu")
        print(f"not measured here: {why}", file=sys.stderr)
        return {"status": "not_measured", "reason": why, "hardware": machine(args.device),
                "results": [{"variant": s.id, "label": s.label or s.id, "status": "not_measured", "reason": why}
                            for s in specs]}
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype, args.device)
    model, tokenizer = load_bench_model(args.model, dtype, args.device, args.resources, seed=args.seed)
    settings = HFSettings(batch_size=args.batch_size, warmup=args.warmup, repeats=args.repeats, seed=args.seed,
                          max_batch=args.max_batch, memory=not args.no_memory)
    engine = HFEngine(model, specs, settings, tokenizer)
    rows = _study(engine, args, filters)
    return {"status": "measured", "engine_version": f"transformers {transformers.__version__}",
            "dtype": str(dtype).replace("torch.", ""), "hardware": machine(args.device),
            "settings": settings_dict(settings), "num_hidden_layers": model.config.num_hidden_layers, "results": rows}


def _run_vllm(args, specs, filters) -> dict:
    import shlex

    from swiftkv.device import fast_dtype
    from swiftkv.loading import resolve_model
    from swiftkv.serving.models import is_config_file
    from swiftkv.serving.vllm import Unavailable, VllmEngine, VllmSettings, settings_dict

    if is_config_file(args.model):
        raise SwiftKVError("vLLM needs a model directory or hub id, not a config JSON (random weights are hf-only)")
    dtype = args.dtype if args.dtype != "auto" else str(fast_dtype(args.device)).replace("torch.", "")
    model = resolve_model(args.model, args.resources)  # a bad model fails before anything is written
    workdir = open_output_dir(args.workdir or Path(args.output).with_suffix(""), getattr(args, "overwrite", False),
                              "vLLM raw outputs and logs").resolve()
    settings = VllmSettings(
        command=shlex.split(args.vllm_command), device=args.device, dtype=dtype,
        kv_cache_bytes=int(args.kv_cache_mib * MIB) if args.kv_cache_mib else None, max_model_len=args.max_model_len,
        threads=args.threads, warmup=args.warmup, repeats=args.repeats, seed=args.seed,
        engine_args=shlex.split(args.vllm_args or ""), workdir=str(workdir),
    )
    engine = VllmEngine(model, specs, settings)
    info = {"dtype": dtype, "hardware": machine(args.device), "settings": settings_dict(settings),
            "model_path": model}
    try:
        engine.check_available()
    except Unavailable as why:
        if args.on_unavailable == "error":
            raise SwiftKVError(str(why)) from None
        print(f"not measured here: {why}", file=sys.stderr)
        rows = [{"variant": s.id, "label": s.label or s.id, "status": "not_measured", "reason": str(why)} for s in specs]
        return {**info, "status": "not_measured", "reason": str(why), "results": rows}
    rows = _study(engine, args, filters)
    return {**info, "status": "measured", "engine_version": f"vllm {engine.version}", "results": rows,
            "platform": platform.platform()}
