"""Distillation commands: distill, teacher-cache."""

from __future__ import annotations

import argparse
import contextlib
import os

from swiftkv.cli.options import add_model_args, non_negative_int, number, positive_int, resolve_dtype
from swiftkv.errors import RunFailed, SwiftKVError


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


def _distill_output_what(args) -> str:
    """What distill writes (its kind of output): a distilled checkpoint, or with --log-only its log."""
    return "distillation log (--log-only)" if args.log_only else "distilled checkpoint"


def distill_settings(args):
    """The run's ``DistillSettings`` from the parsed options: the student from --variant's sheet row and/or the
    explicit flags (explicit wins), the rest from the training options; validated."""
    import dataclasses

    from swiftkv.data.variants import distill_options, variant_row
    from swiftkv.distill import DistillSettings

    options = {}
    if args.variant:
        options.update(distill_options(variant_row(args.model_id or args.model, args.variant, args.variants)))
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
    return settings


@contextlib.contextmanager
def one_line_rank_failures():
    """Under a launcher, a collective that fails because another rank died (killed, out of memory) is one line
    naming this rank, not a traceback from inside torch.distributed; the launcher's report names the dead one."""
    import torch.distributed as dist

    try:
        yield
    except (dist.DistError, RuntimeError) as err:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        lost = isinstance(err, dist.DistError) or any(
            word in str(err) for word in ("gloo", "Gloo", "NCCL", "Connection", "connection", "closed by peer"))
        if world == 1 or not lost:
            raise
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the launcher's stop must not cut this line short
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RunFailed(f"rank {os.environ.get('RANK', '?')} of {world} stopped: another rank of the run failed or was "
                        f"killed (the launcher's report names it); nothing was saved as a result ({first[:160]})") from None


def cmd_distill(args) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = distill_settings(args)
    from dataclasses import asdict

    from swiftkv.data.conversations import load_conversations, split_conversations
    from swiftkv.distill import train
    from swiftkv.distill.parallel import Parallel
    from swiftkv.loading import check_student_shape, load_model

    strategy = Parallel.check_launch(args.strategy, args.processes, settings.batch_size)  # before any loading
    check_student_shape(args.model, args.resources, settings.num_key_value_layers, settings.key_value_group_size,
                        settings.key_value_heads)
    cache = None
    if args.teacher_cache:  # opened (and checked: layout, finite values) before the model loads
        from swiftkv.distill.teacher_cache import TeacherCache

        cache = TeacherCache(args.teacher_cache)
    # FSDP over N processes: only rank 0 reads the weights; the others build the model on the meta device and get
    # their shards from rank 0 once it is sharded (a model larger than one rank's memory never exists N times)
    meta = strategy == "fsdp" and settings.train and int(os.environ.get("RANK", "0")) != 0
    base, tokenizer = load_model(args.model, dtype=args.dtype, resources=args.resources, meta=meta)
    train_convs = heldout_convs = source = None  # with a teacher cache the packed data come from it
    if not args.teacher_cache:
        conversations, source_report = load_conversations(settings.data)
        train_convs, heldout_convs = split_conversations(conversations)
        source = asdict(source_report)
    with one_line_rank_failures():
        summary = train(base, tokenizer, settings, args.output, train_conversations=train_convs,
                        heldout_conversations=heldout_convs, model_name=args.model_id or args.model,
                        checkpoint_dir=args.checkpoint_dir, resume=args.resume, cpu=True if args.cpu else None,
                        mixed_precision=args.mixed_precision, progress=not args.no_progress,
                        extra_summary={"variant": args.name or args.variant, "source_report": source},
                        overwrite=args.overwrite, teacher_cache=cache, save_at=dict(args.save_at or []),
                        log_only=args.log_only, strategy=args.strategy, processes=args.processes,
                        gradient_checkpointing=args.gradient_checkpointing, micro_batch_size=args.micro_batch_size)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) != 0:  # rank 0 reports
        return
    init, final = summary["heldout_initial"], summary["heldout_final"]
    if init and final:
        print(f"held-out KL {init['heldout_kl']:.4f} -> {final['heldout_kl']:.4f} nats/token "
              f"({summary['train_tokens']} tokens, {summary['train_tok_per_s'] or 0:.0f} tok/s)")
    print(args.output)


def cmd_teacher_cache(args) -> None:
    import torch

    from swiftkv.data.conversations import load_conversations, split_conversations
    from swiftkv.distill.teacher_cache import TeacherCacheSettings, build_teacher_cache
    from swiftkv.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, dtype=resolve_dtype(args.dtype), resources=args.resources)
    train_convs, heldout_convs = split_conversations(load_conversations(args.data)[0])
    settings = TeacherCacheSettings(layers=args.layers, data=args.data, seed=args.seed, max_length=args.max_length,
                                    tokens=args.tokens, heldout_tokens=args.heldout_tokens,
                                    storage_dtype=args.cache_dtype)
    meta = build_teacher_cache(model, tokenizer, args.output, settings, train_conversations=train_convs,
                               heldout_conversations=heldout_convs, overwrite=args.overwrite,
                               progress=not args.no_progress)
    build = meta["build"]
    print(f"{args.output}: {build['train_tokens']} training tokens at {build['tokens_per_s']:.0f} tok/s, layers "
          f"{meta['key']['layers']}, {meta['key']['dtype']}")


def add_parsers(sub) -> None:
    """The distillation commands' parsers on the top-level subparsers ``sub``."""
    p = sub.add_parser(
        "distill", help="distil a SwiftKV student from its base model (KL to the teacher, paper defaults)",
        description="Convert MODEL to a SwiftKV student and train it against the same model with SwiftKV off. The "
        "layers below l run once per step for both; only the student's SwiftKV parts train (--scope full: every "
        "layer >= l). Data: conversations rendered with the chat template, packed with attention separation. Writes "
        "a SwiftKV checkpoint (Snowflake format) with train_log.jsonl and distill.json beside it; checkpoints go to "
        "OUTPUT.ckpt/ while it runs (--resume continues from there).",
    )
    add_model_args(p)
    p.add_argument("--output", "-o", required=True, help="output directory (written atomically at the end)")
    g = p.add_argument_group("student (from the variants sheet, or explicit; explicit flags win)")
    g.add_argument("--variant", help="row of the variants sheet, e.g. swiftkv-50")
    g.add_argument("--variants", default="config/variants.tsv",
                   help="variants sheet (TSV; default config/variants.tsv)")
    g.add_argument("--model-id", help="the model's id in the sheet (default: MODEL)")
    g.add_argument("--name", help="the student's name in distill.json (default: --variant); the pipeline passes the "
                   "sheet row as explicit flags with its name")
    g.add_argument("--num-key-value-layers", "-l", type=positive_int, help="l: layers that keep their own K/V")
    g.add_argument("--key-value-group-size", "-g", type=positive_int, help="g: AcrossKV group size")
    g.add_argument("--kv-heads", type=positive_int, help="MQA student: KV heads of the SwiftKV K/V in layers >= l")
    g.add_argument("--loss", choices=["kl", "lm", "kl+hidden"], help="kl (default), lm (next-token CE), kl+hidden")
    g.add_argument("--scope", choices=["partial", "full"], help="partial (SwiftKV parts, default) or full (layers >= l)")
    g.add_argument("--loss-positions", choices=["all", "assistant"],
                   help="all real tokens (default) or assistant tokens only, still averaged over all positions "
                   "(Snowflake's current recipe)")
    g.add_argument("--no-train", action="store_true", help="save the converted student untrained (w/o distillation)")
    g = p.add_argument_group("training (paper defaults)")
    g.add_argument("--tokens", type=non_negative_int, help="training token budget per epoch, 0 = all the data (default 100000)")
    g.add_argument("--epochs", type=positive_int, help="passes over the budget's packs (default 1; the paper: 2)")
    g.add_argument("--max-length", type=positive_int, help="tokens per packed row (default 2048)")
    g.add_argument("--batch-size", type=positive_int, help="packed rows per optimizer step over all processes (the "
                   "global batch; a multiple of the process count; default 1)")
    g.add_argument("--lr", type=number(0, low_open=True), help="AdamW learning rate (default 3e-4)")
    g.add_argument("--weight-decay", type=number(0), help="AdamW weight decay (default 0.05)")
    g.add_argument("--warmup-ratio", type=number(0, 1, high_open=True), help="linear warm-up share of the steps, then cosine (default 0.05)")
    g.add_argument("--schedule", choices=["cosine", "wsd"],
                   help="lr schedule: cosine (default) or wsd (warmup-stable-decay, read at --read-budgets)")
    g.add_argument("--read-budgets", type=_budgets,
                   help="wsd: token budgets read along one run, e.g. 2048,4096,8192 (--tokens = the largest): at "
                   "each, a branch decays the lr over the budget's last --decay-ratio of steps and is evaluated")
    g.add_argument("--warmup-steps", type=non_negative_int, help="wsd: linear warm-up steps, then constant (default 2)")
    g.add_argument("--decay-ratio", type=number(0, 1, low_open=True), help="wsd: share of a budget's steps its decay takes (default 0.2)")
    g.add_argument("--save-at", type=_save_at, action="append", metavar="BUDGET=DIR",
                   help="wsd: also save the student read at BUDGET to DIR (repeatable); OUTPUT gets the largest")
    g.add_argument("--temperature", type=number(0, low_open=True), help="distillation temperature T; the loss is T^2 * KL (default 2)")
    g.add_argument("--hidden-weight", type=number(0), help="weight of the hidden-state MSE in kl+hidden (default 1)")
    g.add_argument("--max-grad-norm", type=number(0), help="gradient clipping, 0 = off (default 1)")
    g.add_argument("--seed", type=int, help="data order seed (default 0)")
    g.add_argument("--data", choices=["sharegpt", "hub"], help="sharegpt (embedded, default) or hub (paper data)")
    g.add_argument("--chunk-size", type=positive_int, help="positions per chunk of full-vocabulary logits (default 1024)")
    g = p.add_argument_group("evaluation, checkpoints, hardware")
    g.add_argument("--heldout-tokens", type=non_negative_int, help="held-out tokens for the KL in the log (default 4096)")
    g.add_argument("--eval-every", type=_eval_every,
                   help="steps between held-out evaluations, or 'end' for only the ones before and after training "
                   "(default: 5 per run)")
    g.add_argument("--checkpoint-every", type=positive_int, help="steps between checkpoints (default: 10 per run)")
    g.add_argument("--checkpoint-dir", help="where checkpoints go while training (default OUTPUT.ckpt)")
    g.add_argument("--log-only", action="store_true",
                   help="OUTPUT gets the run's summary (distill.json) and training log, not the student's weights "
                   "(for runs read only through their held-out numbers, e.g. an lr sweep: saves ~4 bytes/parameter)")
    g.add_argument("--resume", action="store_true", help="continue from the last checkpoint of the same settings")
    g.add_argument("--teacher-cache", help="a teacher cache (swiftkv teacher-cache) for these settings: the teacher's "
                   "side and the packed data come from it, so a step runs only the student's layers >= l")
    g.add_argument("--cpu", action="store_true", help="train on the CPU even if a GPU is present")
    g.add_argument("--strategy", choices=["none", "ddp", "fsdp"],
                   help="how processes split the work (docs/distributed.md): ddp (default for more than one process: "
                   "every rank holds the model), fsdp (PyTorch FSDP2: weights sharded over the ranks), none (one "
                   "process)")
    g.add_argument("--processes", type=positive_int,
                   help="refuse to run unless the launcher started this many processes (also "
                   "$SWIFTKV_EXPECT_WORLD_SIZE): catches a launcher that silently starts fewer")
    g.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute the student's layers >= l in backward instead of keeping their activations")
    g.add_argument("--micro-batch-size", type=positive_int,
                   help="rows per forward pass on each process, gradients accumulated over the step (default: all of "
                   "a process's share of --batch-size at once); the same step, less activation memory")
    g.add_argument("--mixed-precision", choices=["no", "bf16", "fp16"],
                   help="autocast (default: bf16 where the hardware is fast at it, else none)")
    g.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_distill, output_kind="dir", output_what=_distill_output_what, check_model=False)

    p = sub.add_parser(
        "teacher-cache", help="the frozen teacher's side of every distillation of a model, computed once",
        description="One no-grad pass of the teacher (MODEL with SwiftKV off) over the distillation token stream (the "
        "same packing, order and seed the trainer uses) and the held-out sample; stores, per token, the residual "
        "stream entering each --layers l (and the last layer) and the final normed hidden state, plus the packed "
        "stream itself. `swiftkv distill --teacher-cache DIR` then runs only the student's layers >= l per step. "
        "One cache serves every variant, budget up to --tokens and loss of that seed.")
    add_model_args(p)
    p.add_argument("--layers", type=positive_int, nargs="+", required=True,
                   help="the l values of the students it will serve (e.g. 22 15 11)")
    p.add_argument("--tokens", type=positive_int, required=True, help="training tokens (the largest budget served)")
    p.add_argument("--max-length", type=positive_int, default=2048, help="tokens per packed row (default 2048)")
    p.add_argument("--heldout-tokens", type=non_negative_int, default=4096, help="held-out tokens (default 4096, as distill)")
    p.add_argument("--seed", type=int, default=0, help="data order seed (default 0, as distill)")
    p.add_argument("--data", choices=["sharegpt", "hub"], default="sharegpt")
    p.add_argument("--cache-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="storage precision (default float32: the trainer's numbers exactly; bfloat16: half the disk)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--output", "-o", required=True, help="output directory")
    p.set_defaults(func=cmd_teacher_cache, output_kind="dir", output_what="teacher cache")
