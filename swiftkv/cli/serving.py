"""Serving benchmark commands (``swiftkv bench ...``): serve, vllm, served-fidelity, sharegpt-requests."""

from __future__ import annotations

import argparse
from pathlib import Path

from swiftkv.cli.options import DefaultsFormatter, add_model_args, positive_int
from swiftkv.errors import SwiftKVError


def cmd_bench_vllm(args) -> None:
    from pathlib import Path

    from swiftkv.bench.vllm_throughput import ThroughputBench, bench_vllm_throughput, vllm_python
    from swiftkv.io import open_output_dir, write_json
    from swiftkv.loading import resolve_model

    models = {}
    for item in args.models:
        label, sep, name = item.partition("=")
        if not sep or not label or not name:
            raise SwiftKVError(f"model {item!r} is not LABEL=MODEL (e.g. base=smollm2-135m swiftkv=results/ckpt)")
        models[label] = resolve_model(name, args.resources)
    settings = ThroughputBench(
        input_len=args.input_len, output_len=args.output_len, num_prompts=args.num_prompts, repeats=args.repeats,
        dtype=args.dtype, kv_cache_gib=args.kv_cache_gib, kv_cache_bytes=args.kv_cache_bytes,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens, threads=args.threads)
    workdir = open_output_dir(args.workdir or Path(args.output).with_suffix(""), args.overwrite,
                              "vLLM raw outputs and logs")
    result = bench_vllm_throughput(models, settings, vllm_python(args.vllm_venv), workdir)
    write_json(args.output, result, overwrite=args.overwrite)
    for row in result["results"]:
        print(f"{row['label']:>12} l={row['num_key_value_layers']:>3} g={row['key_value_group_size']}"
              f"  {row['tokens_per_s']:8.1f} tok/s  speedup {row['speedup']:.2f}x"
              f"  KV cache {row['kv_cache_tokens']} tokens ({row['kv_cache_ratio']:.2f}x)")


def cmd_bench_served_fidelity(args) -> None:
    from pathlib import Path

    from swiftkv.bench.served_fidelity import BF16_TOLERANCE, ServedFidelitySettings, Tolerance, served_fidelity
    from swiftkv.bench.vllm_throughput import vllm_python
    from swiftkv.data.heldout import heldout_conversations
    from swiftkv.io import open_output_dir, write_json
    from swiftkv.loading import load_model

    python = vllm_python(args.vllm_venv)
    skip = {"both": ("skip", "noskip"), "on": ("skip",), "off": ("noskip",)}[args.prefill_skip]
    settings = ServedFidelitySettings(num_prompts=args.num_prompts, max_prompt_tokens=args.max_prompt_tokens,
                                      new_tokens=args.new_tokens, top_k=args.top_k,
                                      max_num_batched_tokens=args.max_num_batched_tokens, dtype=args.engine_dtype,
                                      attention_backend=args.attention_backend,
                                      enforce_eager=not args.cuda_graphs, prefill_skip=skip)
    tolerance = Tolerance() if args.engine_dtype == "float32" else BF16_TOLERANCE
    conversations = heldout_conversations(args.heldout)
    base, tokenizer = load_model(args.model, dtype="float32", resources=args.resources)
    if getattr(base.config, "swiftkv", None) is not None:
        raise SwiftKVError(f"{args.model} is a SwiftKV checkpoint; give its base model (students are converted here)")
    L = base.config.num_hidden_layers
    bad = [g for g in args.group_sizes if (L - args.num_key_value_layers) % g]
    if not 1 <= args.num_key_value_layers < L or bad:
        raise SwiftKVError(f"-l {args.num_key_value_layers} -g {' '.join(map(str, args.group_sizes))}: need "
                           f"1 <= l < L = {L} and every g dividing L - l")
    workdir = open_output_dir(args.workdir or Path(args.output).with_suffix(""), args.overwrite,
                              "served-fidelity checkpoints, vLLM outputs and logs")
    result = served_fidelity(base, tokenizer, conversations, args.num_key_value_layers, args.group_sizes, python,
                             workdir, settings, tolerance)
    result.update(model=args.name or args.model, source=args.model)
    write_json(args.output, result, overwrite=args.overwrite)
    for name, c in result["configs"].items():
        print(f"{name:>10}: greedy {c['greedy_mean']:.3f} (identical {c['greedy_identical']:.0%}), log-prob |diff| "
              f"max {c['logprob_max_abs']:.2e} mean {c['logprob_mean_abs']:.2e}, top-{settings.top_k} overlap "
              f"{c['topk_mean']:.3f}: {'within tolerance' if c['within_tolerance'] else 'OUTSIDE ' + ', '.join(c['outside'])}")


def cmd_bench_serve(args) -> None:
    from swiftkv.bench.serving.run import ServeRequest, bench_serve

    if args.vllm_command is None and Path("bin/vllm-env").is_file():  # a checkout: its CPU build in .venv-vllm
        args.vllm_command = "bin/vllm-env vllm"
    result = bench_serve(ServeRequest.from_options(args))
    for row in result["results"]:
        keys = [k for k in ("input_len", "request_rate", "kv_limit_bytes", "min_ratio") if k in row]
        where = " ".join(f"{k}={row[k]}" for k in keys)
        if row.get("status") == "not_measured":
            print(f"{row['variant']:>24} {where}  not measured: {row.get('reason')}")
        elif "median_ttft_ms" in row:
            print(f"{row['variant']:>24} {where}  TTFT {row['median_ttft_ms']:.0f} ms  TPOT {row['median_tpot_ms']:.1f} ms")
        elif row.get("throughput_tok_s"):
            speed = f"  speedup {row['speedup']:.2f}x" if row.get("speedup") else ""
            speed += f" (paired {row['paired_speedup']:.2f}x)" if row.get("paired_speedup") else ""
            pred = f" (predicted {row['predicted_speedup']:.2f}x)" if row.get("predicted_speedup") else ""
            print(f"{row['variant']:>24} {where}  {row['throughput_tok_s']:.1f} tok/s{speed}{pred}")
        else:
            print(f"{row['variant']:>24} {where}  {row.get('status')}: {row.get('reason')}")
    print(args.output)


def cmd_bench_sharegpt_requests(args) -> None:
    from transformers import AutoTokenizer

    from swiftkv.bench.serving.workloads import select_sharegpt
    from swiftkv.io import write_json
    from swiftkv.loading import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model, args.resources))
    selection = select_sharegpt(tokenizer, args.min_ratios, args.num_requests, args.max_input_len,
                                args.max_output_len, args.split, args.seed)
    selection["model"] = args.model
    write_json(args.output, selection)  # refuses to replace a file it did not write
    for f in selection["filters"]:
        print(f"min ratio {f['min_ratio']:>6}: {f['passing']:>6} pass, {f['num_requests']} chosen, "
              f"input/output {f['ratio_of_sums']:.2f} (ratio of sums)")
    print(args.output)


def _workdir(args) -> list[str]:
    """A benchmark's work folder (raw outputs, logs): --workdir, else the output path without its suffix."""
    from pathlib import Path

    return [str(args.workdir or Path(args.output).with_suffix(""))]


def add_parsers(bench) -> None:
    """The serving benchmarks' parsers on the ``swiftkv bench`` subparsers ``bench``."""
    from swiftkv.bench.serving import ENGINES, STUDIES

    p = bench.add_parser("served-fidelity", help="the plugin-served student vs the transformers student, held-out "
                         "prompts", formatter_class=DefaultsFormatter,
                         description="Converts MODEL to SwiftKV students (-l, each -g), serves each with our vLLM plugin "
                         "(prefill skip on and off; the vLLM venv) and compares with the same student in transformers "
                         "on held-out prompts: greedy agreement, |log-prob difference| of every generated token "
                         "(transformers teacher-forced on vLLM's continuation) and top-k overlap, each against a stated "
                         "tolerance (swiftkv.bench.served_fidelity.Tolerance; BF16_TOLERANCE for a bf16 engine). "
                         "Transformers in fp32 on the CPU; the engine in --engine-dtype.")
    add_model_args(p)
    p.add_argument("--num-key-value-layers", "-l", type=positive_int, required=True, help="l of the students")
    p.add_argument("--group-sizes", "-g", type=positive_int, nargs="+", default=[1, 3], help="AcrossKV g per student")
    p.add_argument("--num-prompts", type=positive_int, default=64, help="held-out prompts")
    p.add_argument("--max-prompt-tokens", type=positive_int, default=160, help="longer first turns are skipped")
    p.add_argument("--new-tokens", type=positive_int, default=32, help="tokens generated per prompt (fewer at EOS)")
    p.add_argument("--top-k", type=positive_int, default=5, help="k of the top-k overlap")
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help="vLLM's token budget per step (small values: chunked prefill and mixed batches)")
    p.add_argument("--heldout", default=None, help="held-out conversations JSONL (default: ShareGPT's held-out split)")
    p.add_argument("--engine-dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="the vLLM engine's dtype (FlashAttention on CUDA needs bfloat16 or float16); transformers "
                   "runs fp32")
    p.add_argument("--attention-backend", default=None, help="vLLM attention backend, e.g. FLASH_ATTN (default: "
                   "vLLM's choice)")
    p.add_argument("--cuda-graphs", action="store_true", help="let vLLM capture CUDA graphs (no --enforce-eager; "
                   "on CUDA only: the plugin keeps the CPU backend eager)")
    p.add_argument("--prefill-skip", choices=["both", "on", "off"], default="both",
                   help="serve each student with the prefill skip on, off, or both")
    p.add_argument("--vllm-venv", default=None, help="the vLLM venv (default $VLLM_VENV or ./.venv-vllm)")
    p.add_argument("--workdir", default=None, help="checkpoints, vLLM outputs and logs (default: beside --output)")
    p.add_argument("--name", default=None, help="model name in the JSON (default: MODEL)")
    p.add_argument("--output", "-o", required=True, help="JSON file to write")
    p.set_defaults(func=cmd_bench_served_fidelity, output_kind="file", extra_dirs=_workdir)

    p = bench.add_parser("vllm", help="vLLM throughput of a base model vs SwiftKV checkpoints (plugin), same run",
                         description="Runs vLLM's own `vllm bench throughput` (random prompts, fixed lengths) in the "
                         "vLLM venv for each LABEL=MODEL, the first being the baseline, and writes tokens/s, speedup "
                         "and the engine's KV-cache capacity (tokens) per model as JSON.")
    p.add_argument("models", nargs="+", help="LABEL=MODEL, MODEL an embedded id or a model directory; e.g. "
                   "base=smollm2-135m swiftkv=results/ckpt-l15 acrosskv=results/ckpt-l15-g3")
    p.add_argument("--input-len", type=int, default=1024, help="prompt tokens per request (default 1024)")
    p.add_argument("--output-len", type=int, default=16, help="generated tokens per request (default 16)")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--repeats", type=int, default=1, help="runs per model, interleaved across models")
    p.add_argument("--dtype", default="float32", help="vLLM dtype (default float32: bf16 is slow without AVX512-BF16)")
    p.add_argument("--kv-cache-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE for every model (default 1)")
    p.add_argument("--kv-cache-bytes", type=int, default=None, help="KV-cache bytes instead (memory-limited runs)")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--threads", type=positive_int, default=2, help="OMP_NUM_THREADS of the engine (default 2)")
    p.add_argument("--vllm-venv", default=None, help="vLLM venv (default $VLLM_VENV or .venv-vllm)")
    p.add_argument("--resources", default=None, help="resources folder (default $SWIFTKV_RESOURCES or ./resources)")
    p.add_argument("--workdir", default=None, help="per-run logs and JSON (default: the output path without suffix)")
    p.add_argument("--output", "-o", required=True, help="JSON file to write")
    p.set_defaults(func=cmd_bench_vllm, output_kind="file", extra_dirs=_workdir)

    p = bench.add_parser(
        "serve", help="serving benchmark: throughput / latency / KV-limit / ShareGPT, hf or vLLM engine",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run one serving study of MODEL on one engine and write a JSON of rows (one per point and "
        "variant).\n\n"
        "engines:\n"
        "  hf    transformers generate() in this process; variants are SwiftKV wirings of MODEL (prefill skip)\n"
        "  vllm  the vLLM CLI in its own environment (--vllm-command): vllm bench throughput / vllm serve +\n"
        "        vllm bench serve on 127.0.0.1; every server is stopped when the run ends or fails\n"
        "studies:\n"
        "  throughput  combined (input+output) tokens/s vs --input-lens at --output-len (paper Fig. 3)\n"
        "  latency     TTFT / TPOT vs --request-rates, Poisson arrivals (Fig. 4)\n"
        "  kv-limit    throughput when the KV cache may hold --kv-limits-mib (Table 3)\n"
        "  sharegpt    real prompts by minimum input/output ratio from --requests (Table A.3)\n"
        "variants (--variant, repeatable; default: base):\n"
        "  base | ID=l | ID=l,g | JSON {\"id\", \"model\", \"num_key_value_layers\", \"key_value_group_size\",\n"
        "  \"env\", \"args\", \"label\"} (vllm: a model directory served with extra env / engine args)\n\n"
        "example: swiftkv bench serve smollm2-135m --engine hf --study throughput --input-lens 1024 --output-len 64 \\\n"
        "           --variant base --variant swiftkv-50=15 --variant swiftkv-50-acrosskv-3=15,3 -o tput.json")
    p.add_argument("model", help="embedded id, model directory, hub id, or (hf engine) a config JSON for random weights")
    p.add_argument("--engine", choices=ENGINES, required=True)
    p.add_argument("--study", choices=STUDIES, required=True)
    p.add_argument("--variant", action="append", metavar="SPEC", help="a variant (see above); repeat for several")
    p.add_argument("--noise-floor", action="store_true",
                   help="measure the reference variant (base) a second time, interleaved with the others, as the "
                   "variant '<id>-again': its speedup over the reference is the noise floor of every speedup")
    p.add_argument("--input-lens", type=int, nargs="+", default=[1024], help="prompt lengths (latency, kv-limit: one)")
    p.add_argument("--output-len", type=int, default=64, help="generated tokens per request (default 64)")
    p.add_argument("--num-requests", type=int, default=4, help="requests per point (default 4)")
    p.add_argument("--request-rates", type=float, nargs="+", help="latency: requests/s (inf = all at once)")
    p.add_argument("--kv-limits-mib", type=float, nargs="+", help="kv-limit: KV-cache budgets in MiB")
    p.add_argument("--requests", help="sharegpt: the selection JSON from `swiftkv bench sharegpt-requests`")
    p.add_argument("--min-ratios", type=float, nargs="+", help="sharegpt: run only these filters of the selection")
    p.add_argument("--batch-size", type=int, default=4, help="hf: requests per generate call (default 4)")
    p.add_argument("--max-batch", type=int, default=64, help="hf: largest batch (latency server, kv-limit)")
    p.add_argument("--warmup", type=int, default=1,
                   help="hf: untimed short generate calls per variant; vllm: warm-up requests per run (default 1)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (hf) / engine runs (vllm) per point")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, or auto (bf16 only where fast; default auto)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--threads", type=positive_int, default=None, help="torch / OMP threads (default: all this process may use)")
    p.add_argument("--resources", default=None, help="resources folder (default $SWIFTKV_RESOURCES or ./resources)")
    p.add_argument("--no-memory", action="store_true", help="hf: skip the peak-memory pass")
    p.add_argument("--vllm-command", default=None,
                   help="how to call the vLLM CLI (default: bin/vllm-env vllm where the current folder has it, the "
                   "CPU build in .venv-vllm; else vllm on PATH)")
    p.add_argument("--vllm-args", default="", help="extra engine arguments for every variant, e.g. "
                   "'--tensor-parallel-size 8'")
    p.add_argument("--kv-cache-mib", type=float, default=1024, help="vllm: KV-cache space in MiB (default 1024)")
    p.add_argument("--max-model-len", type=int, default=None, help="vllm: model length (default: the study's longest)")
    p.add_argument("--workdir", default=None, help="vllm: raw outputs and logs (default: OUTPUT without .json)")
    p.add_argument("--on-unavailable", choices=("error", "mark"), default="error",
                   help="when the engine cannot run here (no GPU, no vLLM): fail (default) or write a result "
                   "marked not measured, with the reason")
    p.add_argument("--output", "-o", required=True, help="JSON file to write")
    p.set_defaults(func=cmd_bench_serve, output_kind="file", extra_dirs=_workdir)

    p = bench.add_parser(
        "sharegpt-requests", help="select ShareGPT requests by minimum input/output ratio (Table A.3 workloads)",
        description="First user turn -> prompt, the reply's length -> output length (capped); for each minimum "
        "ratio, --num-requests sampled (seeded) among the requests that pass it. Both engines read the result.")
    p.add_argument("model", help="the model whose tokenizer counts tokens (embedded id or directory)")
    p.add_argument("--min-ratios", type=float, nargs="+", default=[0, 0.2, 2, 20, 100])
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--max-input-len", type=int, default=1024, help="drop longer prompts (vLLM's ShareGPT limit)")
    p.add_argument("--max-output-len", type=int, default=64, help="cap on the reply length")
    p.add_argument("--split", choices=("train", "heldout"), default="train")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resources", default=None)
    p.add_argument("--output", "-o", required=True)
    p.set_defaults(func=cmd_bench_sharegpt_requests, output_kind="file")
