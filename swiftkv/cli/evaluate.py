"""Evaluation commands: heldout-ppl-task, eval, fidelity-teacher, long-context (the task files: ``bigbench``)."""

from __future__ import annotations

import argparse
import contextlib

from swiftkv.cli.options import add_model_args, as_teacher, positive_int, resolve_dtype
from swiftkv.errors import SwiftKVError


def _json_file_name(text: str) -> str:
    """argparse type of eval --lm-eval-name: a bare file name ending in .json (no folder)."""
    if not text.endswith(".json") or "/" in text or text in (".json", "fidelity.json"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file name ending in .json (no folder, not "
                                         "fidelity.json), e.g. heldout.json")
    return text


def cmd_heldout_ppl_task(args) -> None:
    from pathlib import Path

    from transformers import AutoTokenizer

    from swiftkv.data.heldout import heldout_sample, perplexity_docs, write_conversations, write_perplexity_task
    from swiftkv.io import open_output_dir
    from swiftkv.loading import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model, args.resources))
    sample = heldout_sample()
    docs = perplexity_docs(tokenizer, sample, args.documents, args.max_tokens)
    open_output_dir(args.output, args.overwrite, args.output_what)
    print(write_perplexity_task(docs, args.output))
    if args.conversations:
        write_conversations(sample[: args.conversations], Path(args.output) / "conversations.jsonl")


def cmd_eval(args) -> None:
    import json

    import torch

    from swiftkv.io import open_output_dir, write_json
    from swiftkv.loading import check_base_loaded, check_base_model, load_model
    from swiftkv.measure.evaluate import collect_tasks, evaluate_model

    if args.threads:
        torch.set_num_threads(args.threads)
    tasks, include = collect_tasks(args.tasks_json, args.bigbench_manifest, args.bigbench_split, args.task or [],
                                   args.include_path or [], args.limit)
    if not tasks and args.no_fidelity:
        raise SwiftKVError("nothing to evaluate: no tasks given and --no-fidelity; pass --tasks-json, "
                           "--bigbench-manifest or --task, or drop --no-fidelity")
    boundary = _boundary_args(args, tasks)
    cached = None
    if args.fidelity_teacher and not args.no_fidelity:  # read (and refused) before any model loads
        from swiftkv.measure.fidelity_teacher import TeacherOutputs

        cached = TeacherOutputs.load(args.fidelity_teacher)
    with_base = args.base and args.base != args.model and not args.no_fidelity  # a base model is its own teacher
    if with_base:
        check_base_model(args.model, args.base, args.resources)  # vocabulary and frozen weights, before loading
    dtype = resolve_dtype(args.dtype, args.device)
    model, tokenizer = load_model(args.model, dtype=dtype, resources=args.resources)
    model.to(args.device)
    teacher = None
    if with_base:
        teacher, _ = load_model(args.base, dtype=dtype, resources=args.resources)
        check_base_loaded(model, teacher, args.model, args.base)  # again, for hub ids known only now
        teacher.to(args.device)
    if args.teacher:
        as_teacher(model, args.model)
    fidelity = None if args.no_fidelity else _fidelity_settings(args)
    heldout = None
    if args.heldout and fidelity is not None:
        from swiftkv.data.heldout import read_conversations

        heldout = read_conversations(args.heldout)
    if cached is not None:
        from swiftkv.data.heldout import heldout_sample

        cached.check_for(teacher if teacher is not None else model, tokenizer,
                         heldout if heldout is not None else heldout_sample(), fidelity)  # before the tasks run
    with contextlib.ExitStack() as stack:
        recorder = None
        if args.save_boundary:  # written beside, and swapped into place only when the evaluation succeeded
            from swiftkv.io import atomic_dir
            from swiftkv.measure.boundary import BOUNDARY_KIND, BoundaryRecorder

            folder = stack.enter_context(atomic_dir(args.save_boundary, args.overwrite, what=BOUNDARY_KIND))
            recorder = BoundaryRecorder(model, args.boundary_layers, folder, args.kv_cache)
        result, fid = evaluate_model(model, tokenizer, tasks, include, teacher_model=teacher, kv_cache=args.kv_cache,
                                     batch_size=args.batch_size, fidelity=fidelity, heldout=heldout, seed=args.seed,
                                     scorer=args.scorer, positions_per_forward=args.positions_per_forward,
                                     fidelity_teacher=cached, boundary=boundary, boundary_recorder=recorder)
        if recorder is not None:
            recorder.save()
    out = open_output_dir(args.output_dir, args.overwrite, args.output_what)
    if fid is not None:
        fid.update(model=args.model, base=args.base)
        write_json(out / "fidelity.json", fid)
        print(f"fidelity: KL {fid['kl']:.4f}  top-1 {fid['top1']:.3f}  greedy {fid['greedy']:.3f}  ({fid['seconds']:.0f} s)")
    if result is None:
        return
    result["swiftkv"].update(model=args.model, base=args.base, device=args.device, threads=torch.get_num_threads())
    write_json(out / args.lm_eval_name, json.loads(json.dumps(result, default=str)))
    for name, scores in result["results"].items():
        shown = {k: round(v, 4) for k, v in scores.items() if isinstance(v, float) and "stderr" not in k}
        print(f"{name:45s} {shown}")
    print(f"lm-eval: {result['swiftkv']['seconds_lm_eval']:.0f} s")


def _boundary_args(args, tasks):
    """--boundary / --save-boundary checked before any model loads: the recorded states (read), or the folder they
    will be written to (which must be free for them)."""
    if not (args.boundary or args.save_boundary):
        if args.boundary_layers:
            raise SwiftKVError("--boundary-layers without --save-boundary DIR: give the folder to record them in")
        return None
    if args.boundary and args.save_boundary:
        raise SwiftKVError("--boundary (a student takes recorded states) and --save-boundary (a base model records "
                           "them) do not go together; record with the base model first")
    if args.scorer != "packed":
        raise SwiftKVError("boundary states are recorded and used by the packed scorer only; drop --scorer chunked")
    if not tasks:
        raise SwiftKVError("boundary states belong to the tasks' log-likelihoods; give tasks (--tasks-json, "
                           "--bigbench-manifest or --task)")
    if args.save_boundary:
        from swiftkv.io import check_output_dir
        from swiftkv.measure.boundary import BOUNDARY_KIND

        if not args.boundary_layers:
            raise SwiftKVError("--save-boundary needs --boundary-layers L [L ...]: the cuts l of the students that "
                               "will read the states")
        check_output_dir(args.save_boundary, args.overwrite, BOUNDARY_KIND)
        return None
    from swiftkv.measure.boundary import BoundaryStates

    return BoundaryStates.load(args.boundary)


def _fidelity_settings(args):
    from swiftkv.measure.fidelity import FidelitySettings

    return FidelitySettings(
        num_sequences=args.fidelity_sequences, max_tokens=args.fidelity_tokens, num_prompts=args.fidelity_prompts,
        max_prompt_tokens=args.fidelity_prompt_tokens, new_tokens=args.fidelity_new_tokens,
        batch_size=min(args.batch_size, 8))


def cmd_fidelity_teacher(args) -> None:
    import torch

    from swiftkv.data.heldout import heldout_sample, read_conversations
    from swiftkv.loading import load_model
    from swiftkv.measure.fidelity_teacher import teacher_outputs

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, dtype=resolve_dtype(args.dtype, args.device), resources=args.resources)
    model.to(args.device).eval()
    if args.boundary_layers:
        from swiftkv.measure.boundary import check_cuts

        check_cuts(model, args.boundary_layers)  # (1 .. L-1) before the held-out sample is read
    conversations = read_conversations(args.heldout) if args.heldout else heldout_sample()
    out = teacher_outputs(model, tokenizer, conversations, _fidelity_settings(args), progress=not args.no_progress,
                          boundary_layers=args.boundary_layers or ())
    out.save(args.output, args.overwrite)
    states = f", the stream entering layers {' '.join(map(str, sorted(out.boundary)))}" if out.boundary else ""
    print(f"{args.output}: {out.key['sequences']} teacher-forced sequences in {len(out.hidden)} batches, "
          f"{len(out.greedy)} greedy continuations{states} ({out.key['dtype']})")


def _add_fidelity_args(p) -> None:
    p.add_argument("--heldout", default=None, help="held-out conversations for fidelity (JSONL from heldout-ppl-task "
                   "--conversations; default: the held-out ShareGPT split in hash order)")
    p.add_argument("--fidelity-sequences", type=int, default=16)
    p.add_argument("--fidelity-tokens", type=int, default=256)
    p.add_argument("--fidelity-prompts", type=int, default=16)
    p.add_argument("--fidelity-prompt-tokens", type=int, default=160)
    p.add_argument("--fidelity-new-tokens", type=int, default=32)


def cmd_long_context(args) -> None:
    import torch

    from swiftkv.data.heldout import heldout_conversations
    from swiftkv.io import write_json
    from swiftkv.loading import load_model
    from swiftkv.measure.longctx import LongContextSettings, measure_long_context

    if args.threads:
        torch.set_num_threads(args.threads)
    bad = [d for d in args.depths if not 0 <= d <= 1]
    if bad:
        raise SwiftKVError(f"--depths {bad[0]}: a depth is a fraction of the filler, between 0 and 1")
    settings = LongContextSettings(lengths=tuple(args.lengths), depths=tuple(args.depths), samples=args.samples,
                                   contexts=tuple(args.contexts), conversations=args.conversations,
                                   target_tokens=args.target_tokens, seed=args.seed)
    conversations = heldout_conversations(args.heldout)
    model, tokenizer = load_model(args.model, dtype=resolve_dtype(args.dtype), resources=args.resources)
    model.eval()
    result = measure_long_context(model, tokenizer, conversations, settings)
    result.update(model=args.name or args.model, source=args.model)
    write_json(args.output, result, overwrite=args.overwrite)
    exact = sum(p["exact"] for p in result["passkey"]) / len(result["passkey"])
    print(f"passkey: {exact:.1%} exact over {len(result['passkey'])} prompts; context: "
          f"{len(result['conversations'])} conversations; {result['seconds']:.0f} s -> {args.output}")


def add_parsers(sub) -> None:
    """The evaluation commands' parsers on the top-level subparsers ``sub``."""
    p = sub.add_parser("long-context", help="quality against prompt length: passkey retrieval and likelihood vs context",
                       description="Two measures built offline from held-out ShareGPT (swiftkv.measure.longctx): a pass key "
                       "hidden at each --depths of filler text, at each prompt length of --lengths (exact greedy "
                       "reading of the key and its log-probability), and the negative log-likelihood of the last "
                       "--target-tokens tokens of long held-out conversations given each context length of "
                       "--contexts. A SwiftKV checkpoint runs as the student, with its prefill skip.")
    add_model_args(p)
    p.add_argument("--output", "-o", required=True, help="JSON to write (every prompt and conversation)")
    p.add_argument("--name", default=None, help="model name in the output (default: MODEL)")
    p.add_argument("--lengths", type=positive_int, nargs="+", default=[512, 1024, 2048, 4096, 8192],
                   help="passkey prompt lengths in tokens (default: 512 ... 8192)")
    p.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.5, 0.9], help="key positions in the filler")
    p.add_argument("--samples", type=positive_int, default=4, help="keys per (length, depth)")
    p.add_argument("--contexts", type=positive_int, nargs="+", default=[128, 512, 2048, 6144],
                   help="context lengths before the scored tokens")
    p.add_argument("--conversations", type=positive_int, default=24, help="long held-out conversations")
    p.add_argument("--target-tokens", type=positive_int, default=128, help="scored tokens per conversation")
    p.add_argument("--heldout", default=None, help="held-out conversations JSONL (default: ShareGPT's held-out split)")
    p.add_argument("--seed", type=int, default=0, help="keys and filler positions")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    p.set_defaults(func=cmd_long_context, output_kind="file")

    p = sub.add_parser("heldout-ppl-task", help="lm-eval perplexity task over held-out ShareGPT (chat template)")
    p.add_argument("model", help="model whose tokenizer and chat template render the conversations")
    p.add_argument("--resources", default=None)
    p.add_argument("--documents", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=512, help="each conversation is cut to this many tokens")
    p.add_argument("--conversations", type=int, default=0,
                   help="also save the first N held-out conversations (conversations.jsonl) for swiftkv eval --heldout")
    p.add_argument("--output", "-o", required=True, help="output folder (task YAML, JSONL, manifest.json)")
    p.set_defaults(func=cmd_heldout_ppl_task, output_kind="dir",
                   output_what="lm-eval perplexity task (held-out ShareGPT)", output_appends=True)

    p = sub.add_parser("eval", help="lm-eval tasks (+ teacher fidelity) for a base model or a SwiftKV checkpoint",
                       description="Runs lm_eval.simple_evaluate with an HFLM over the loaded model (SwiftKV "
                       "checkpoints as the student, prefill skip on) and saves the full result JSON with per-sample "
                       "outputs; with --base also the fidelity to that teacher on held-out ShareGPT. dtype auto = "
                       "bf16 where fast (CUDA, AVX512-BF16 CPUs), else fp32 (bf16 matmuls are ~60x slower on "
                       "AVX2-only CPUs).")
    add_model_args(p, dtype="auto")
    p.add_argument("--base", default=None, help="the teacher (base model) for fidelity; omit for a base model itself")
    p.add_argument("--tasks-json", default=None, help="JSON list of tasks ({name, metric, num_fewshot, chat_template,"
                   " fewshot_as_multiturn, limit}) or {tasks: [...]} (e.g. the task selection)")
    p.add_argument("--bigbench-manifest", default=None, help="run every task of this manifest on --bigbench-split")
    p.add_argument("--bigbench-split", default="report", choices=["selection", "report"])
    p.add_argument("--task", action="append", help="an lm-eval task name (repeatable)")
    p.add_argument("--include-path", action="append", help="folder of task YAMLs (repeatable)")
    p.add_argument("--kv-cache", default="native", choices=["native", "fp8"], help="fp8: FP8 per-token fake-quant cache")
    p.add_argument("--teacher", action="store_true", help="evaluate a SwiftKV checkpoint as its teacher")
    p.add_argument("--batch-size", type=int, default=16, help="contexts per forward (the chunked scorer)")
    p.add_argument("--scorer", default="packed", choices=["packed", "chunked"],
                   help="log-likelihoods: packed (questions packed into rows under a 4D mask; default) or chunked "
                   "(a prefill, then padded continuation batches); the same numbers (docs/evaluation.md)")
    p.add_argument("--positions-per-forward", type=positive_int, default=1024,
                   help="positions per forward (the packed scorer)")
    p.add_argument("--limit", type=int, default=None, help="at most this many examples per task")
    p.add_argument("--no-fidelity", action="store_true")
    _add_fidelity_args(p)
    p.add_argument("--fidelity-teacher", default=None,
                   help="the teacher's side of the fidelity measure, computed once for every student of the base "
                   "(swiftkv fidelity-teacher; checked against --base, these settings and sequences): the teacher's "
                   "head runs, its layers do not; the numbers are the same")
    p.add_argument("--save-boundary", default=None, metavar="DIR",
                   help="a base model: also record the stream entering each of --boundary-layers for every packed "
                   "row, for its SwiftKV students' --boundary (docs/evaluation.md)")
    p.add_argument("--boundary-layers", type=positive_int, nargs="+", default=None, metavar="L",
                   help="the cuts l to record (the students' num_key_value_layers)")
    p.add_argument("--boundary", default=None, metavar="DIR",
                   help="a SwiftKV student: take the stream entering layer l from its base model's --save-boundary "
                   "folder instead of running layers < l (checked: same embeddings and layers < l, dtype, native KV "
                   "cache); the same numbers at fp32 tolerance")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--output-dir", required=True, help="writes lm_eval.json (with tasks) and fidelity.json (with "
                   "--base or a base model, unless --no-fidelity); with fidelity on, the tasks may be left out")
    p.add_argument("--lm-eval-name", default="lm_eval.json", type=_json_file_name,
                   help="file name of the lm-eval result in --output-dir (default lm_eval.json)")
    p.set_defaults(func=cmd_eval, output_kind="dir", output_what="lm-eval results", output_appends=True)

    p = sub.add_parser("fidelity-teacher", help="the teacher's side of the fidelity measure, computed once per base "
                       "model", description="Runs MODEL (the base model, a student's teacher) over the fidelity "
                       "measure's teacher-forced sequences and generation prompts, as swiftkv eval --base MODEL "
                       "would, and stores its final hidden states and greedy continuations (with --boundary-layers, "
                       "also the stream entering each cut). swiftkv eval STUDENT --base MODEL --fidelity-teacher DIR "
                       "then runs only the teacher's head (and a student at a recorded cut only its layers >= l): the "
                       "same numbers in less time. The fidelity options must be those of the evals it serves.")
    add_model_args(p, dtype="auto")
    _add_fidelity_args(p)
    p.add_argument("--batch-size", type=int, default=8, help="as swiftkv eval's (the fidelity batches are at most 8)")
    p.add_argument("--boundary-layers", type=positive_int, nargs="+", default=None, metavar="L",
                   help="also keep the stream entering these layers (the cuts l of the SwiftKV students it serves): a "
                   "student then takes it instead of running its layers < l (native KV cache; ~0.3 MB per sequence "
                   "of 128 tokens and cut for SmolLM2)")
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--output", "-o", required=True, help="output directory")
    p.set_defaults(func=cmd_fidelity_teacher, output_kind="dir", output_what="fidelity teacher")
