"""Benchmark commands (``swiftkv bench ...``) of the model, the distillation and the evaluation: prefill, distill,
distill-memory, eval.
The serving ones (serve, vllm, served-fidelity, sharegpt-requests) are ``swiftkv.cli.serving``."""

from __future__ import annotations

from swiftkv.cli.options import (DefaultsFormatter, add_model_args, as_teacher, positive_int, resolve_device,
                                 resolve_dtype, unit_fraction)
from swiftkv.errors import SwiftKVError


def cmd_bench_prefill(args) -> None:
    import torch

    from swiftkv.bench.speed import PrefillBench, bench_prefill
    from swiftkv.io import write_json
    from swiftkv.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, args.device)
    from swiftkv.bench.serving.models import is_config_file

    if args.random_weights or is_config_file(args.model):  # timing only: a config is enough, no weights or hub
        from transformers import AutoModelForCausalLM

        from swiftkv.measure.flops import load_config

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


def cmd_bench_distill(args) -> None:
    import torch

    from swiftkv.bench.speed import DistillBench, bench_distill
    from swiftkv.data.conversations import load_conversations, split_conversations
    from swiftkv.data.packing import collate_packs, pack_conversations
    from swiftkv.io import write_json
    from swiftkv.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype, args.device)
    if args.random_weights:  # a config file (e.g. config/models/*.json): random weights, random packed rows
        from transformers import AutoConfig, AutoModelForCausalLM

        from swiftkv.bench.speed import random_packed_batches

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


def cmd_bench_distill_memory(args) -> None:
    from swiftkv.bench.distill_memory import (FREED_MEMORY_THRESHOLD, LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_2_1B, Case,
                                              bench_distill_memory, default_cases)
    from swiftkv.io import write_json

    cases = default_cases(args.length)
    if args.device == "cuda":  # one GPU: a process holds the whole model; FSDP over one rank shards nothing but runs
        cases = [Case("none", 1, "bfloat16", True, length=args.length),  # fully_shard, NCCL and the mixed dtypes
                 Case("none", 1, "bfloat16", False, length=args.length),
                 Case("fsdp", 1, "bfloat16", True, length=args.length)]
    if args.cases:
        known = {c.name: c for c in cases}
        unknown = sorted(set(args.cases) - set(known))
        if unknown:
            raise SwiftKVError(f"unknown case(s) {', '.join(unknown)}; use some of {', '.join(known)}")
        cases = [known[n] for n in args.cases]
    if args.shape:
        import json

        named = {"llama-3.2-1b": LLAMA_3_2_1B, "llama-3.1-8b": LLAMA_3_1_8B, "llama-3.1-70b": LLAMA_3_1_70B}
        try:
            shape = named[args.shape] if args.shape in named else {**LLAMA_3_2_1B, **json.loads(args.shape)}
        except (ValueError, TypeError):
            raise SwiftKVError(f"--shape {args.shape!r}: give one of {', '.join(named)} or a JSON dict of config "
                               "fields") from None
        cases = [Case(c.strategy, c.processes, c.dtype, c.checkpointing, c.rows, c.length, shape, args.device)
                 for c in cases]
    else:
        cases = [Case(c.strategy, c.processes, c.dtype, c.checkpointing, c.rows, c.length, c.shape, args.device)
                 for c in cases]
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SwiftKVError("--device cuda: torch sees no CUDA device here; run on a GPU machine or use --device cpu")
    result = bench_distill_memory(cases, progress=lambda m: print(m, flush=True),
                                  mmap_threshold=FREED_MEMORY_THRESHOLD if args.return_freed_memory else None)
    from swiftkv import io

    result["command"] = io.COMMAND
    write_json(args.output, result, overwrite=args.overwrite)
    gib = 2 ** 30
    print(f"peak resident memory per rank (ru_maxrss, max over ranks), {result['cpu']}, "
          f"allocator: {result['allocator']}:")
    for r in result["results"]:
        print(f"{r['case']:>24}: {r['peak_bytes_max_rank'] / gib:6.2f} GiB  "
              f"({r['peak_minus_baseline_bytes_max_rank'] / gib:.2f} GiB above the {r['ranks'][0]['baseline_bytes'] / gib:.2f} GiB after imports; predicted "
              f"{r['predicted_bytes']['total'] / gib:.2f} GiB)"
              + (f"; peak allocated GPU memory {r['peak_gpu_bytes_max_rank'] / gib:.2f} GiB" if "peak_gpu_bytes_max_rank"
                 in r else ""))
    print("resident set by phase of the step (sampled every 2 ms; peak / at the end, GiB, the rank with the highest peak):")
    for r in result["results"]:
        rank = max(r["ranks"], key=lambda x: x["peak_bytes"])
        print(f"{r['case']:>24}: " + ", ".join(f"{name} {p['peak_bytes'] / gib:.2f}/{p['end_bytes'] / gib:.2f}"
                                               for name, p in rank["phases"].items()))
    for k, v in result["ratios"].items():
        if v is not None:
            print(f"{k}: {v:.2f}")
    print("predicted per GPU at the paper's settings (rows of 8192 tokens, one per GPU, bf16 frozen weights, 8 GPUs):")
    for r in result["paper_predictions"]:
        print(f"{r['model']:>14} {r['strategy']:>4}{' +ckpt' if r['checkpointing'] else '      '}: "
              f"{r['per_gpu_gb']:6.1f} GB/GPU on 8; fewest 80 GB GPUs: {r['fewest_80gb_gpus'] or 'more than 64'}")


def cmd_bench_eval(args) -> None:
    import torch

    from swiftkv.bench.evaluation import bench_eval
    from swiftkv.io import write_json
    from swiftkv.loading import load_model
    from swiftkv.measure.evaluate import collect_tasks

    if args.threads:
        torch.set_num_threads(args.threads)
    tasks, include = collect_tasks(args.tasks_json, args.bigbench_manifest, args.bigbench_split, args.task or [],
                                   args.include_path or [], args.limit)
    if not tasks:
        raise SwiftKVError("nothing to time: pass --bigbench-manifest, --tasks-json or --task")
    if len(set(args.scorers)) != len(args.scorers):
        raise SwiftKVError(f"--scorers {' '.join(args.scorers)} names a scorer twice; name each once")
    boundary = None
    if ("boundary" in args.scorers) != bool(args.boundary):
        raise SwiftKVError("the boundary scorer and --boundary DIR go together: name both (a base model's "
                           "swiftkv eval --save-boundary folder) or neither")
    if args.boundary:
        from swiftkv.measure.boundary import BoundaryStates

        boundary = BoundaryStates.load(args.boundary)  # read (and refused) before the model loads
    model, tokenizer = load_model(args.model, dtype=resolve_dtype(args.dtype, "cpu"), resources=args.resources)
    if args.teacher:
        as_teacher(model, args.model)
    result = bench_eval(model, tokenizer, tasks, include, scorers=tuple(args.scorers), repeats=args.repeats,
                        warmup_limit=args.warmup_limit, batch_size=args.batch_size,
                        positions_per_forward=args.positions_per_forward, kv_cache=args.kv_cache, seed=args.seed,
                        boundary=boundary)
    result["model"] = args.name or args.model
    write_json(args.output, result, overwrite=args.overwrite)
    for scorer, row in result["summary"].items():
        rates = ", ".join(f"{r:.2f}" for r in row["examples_per_s"])
        print(f"{scorer:>8}: median {row['median_examples_per_s']:.2f} examples/s ({rates}); "
              f"{result['speedup'][scorer]:.2f}x {result['reference']}; scorer {row['median_seconds_scoring']:.1f} s "
              f"of {row['median_seconds']:.1f} s")
    for scorer, agree in result["agreement"].items():
        print(f"{scorer} vs {result['reference']}: {agree['requests']} requests, largest log-likelihood difference "
              f"{agree['max_abs_loglikelihood_diff']:.2e}, greedy flags equal: {agree['greedy_flags_equal']}, "
              f"scores equal: {agree['scores_equal']}")


def add_parsers(bench) -> None:
    """The benchmark commands' parsers on the ``swiftkv bench`` subparsers ``bench``."""
    from swiftkv.cli import serving

    p = bench.add_parser("prefill", help="prefill forward time: base vs SwiftKV at several l, same process",
                         description="Times one prefill (prompt -> next-token logits, cache on) of the base model and "
                         "of SwiftKV students with l = round(L * fraction), warm-up then interleaved repeats. MODEL may also be a "
                         "config JSON (e.g. config/models/llama-3.1-8b-instruct.json): random weights, no hub needed.")
    add_model_args(p, dtype="auto")
    p.add_argument("--lengths", type=positive_int, nargs="+", default=[512, 2048], help="prompt lengths in tokens")
    p.add_argument("--fractions", type=unit_fraction, nargs="+", default=[0.5, 0.25],
                   help="kept fraction of layers for each student, in (0, 1] (0.5 -> l = L/2)")
    p.add_argument("--batch-size", type=positive_int, default=1)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda where visible; default)")
    p.add_argument("--include-noskip", action="store_true", help="also time students without the prefill skip")
    p.add_argument("--random-weights", action="store_true",
                   help="MODEL is a config.json (or a directory holding one): time a randomly initialised model of "
                   "that shape (e.g. config/models/llama-3.1-8b-instruct.json on a GPU, no hub needed)")
    p.add_argument("--name", default=None, help="model name in the JSON (default: MODEL)")
    p.add_argument("--output", "-o", required=True, help="JSON file to write")
    p.set_defaults(func=cmd_bench_prefill, output_kind="file")
    p = bench.add_parser("distill", help="distillation step tokens/s: naive vs shared-prefix vs teacher-cached step",
                         description="Times one distillation step (forward, backward, AdamW) on packed ShareGPT rows "
                         "four ways in the same process, interleaved: naive (full teacher forward + full student "
                         "forward/backward with all logits), shared_prefix (the trainer before the teacher cache: "
                         "layers < l once, chunked autograd loss), uncached (the trainer without a cache today: the "
                         "closed-form loss) and cached (the trainer with a teacher cache: only the student's layers "
                         ">= l and the heads); also the rate a teacher cache is built at and the largest loss "
                         "difference between the paths. JSON keys: tokens_per_s.{naive,shared_prefix,uncached,cached},"
                         " cache_build_tokens_per_s, loss_max_abs_diff.",
                         formatter_class=DefaultsFormatter)
    add_model_args(p, dtype="auto")
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
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--output", "-o", required=True, help="JSON file to write")
    p.set_defaults(func=cmd_bench_distill, output_kind="file")

    p = bench.add_parser("distill-memory", help="peak memory per rank of a distillation step: 1 process, DDP, FSDP",
                         description="Runs one distillation step (SwiftKV-50, partial scope) of a random-weight model "
                         "of Llama-3.2-1B's shape (no download) in fresh processes per case: one process, DDP and FSDP2 "
                         "on 2 ranks (torchrun, gloo on CPU), each with fp32 frozen weights, and with bf16 frozen "
                         "weights plus gradient checkpointing. Peak resident memory per rank is "
                         "resource.getrusage(RUSAGE_SELF).ru_maxrss. Also prints the same accounting's prediction per "
                         "GPU for Llama-3.1-8B and 70B at the paper's settings, and how many 80 GB GPUs each needs.",
                         formatter_class=DefaultsFormatter)
    p.add_argument("--length", type=positive_int, default=32, help="tokens per row (one row per rank)")
    p.add_argument("--cases", nargs="+", help="only these cases (e.g. none-1-float32 fsdp-2-float32)")
    p.add_argument("--shape", help="the model's shape: llama-3.2-1b (default), llama-3.1-8b, llama-3.1-70b, or a JSON dict "
                   "overriding fields of the default (e.g. a smaller one for a quick check)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: the cases above on gloo, peak resident memory; cuda: one GPU, bf16 frozen weights with "
                   "and without checkpointing, also the peak of allocated GPU memory")
    p.add_argument("--return-freed-memory", action="store_true",
                   help="run the cases with glibc's mmap threshold fixed at 128 KiB (MALLOC_MMAP_THRESHOLD_), so that "
                   "memory torch frees goes back to the system: the resident peak is then what the step holds at "
                   "once, not also what glibc kept of memory freed earlier (FSDP frees each gathered layer)")
    p.add_argument("--output", "-o", required=True, help="JSON file to write")
    p.set_defaults(func=cmd_bench_distill_memory, output_kind="file")

    p = bench.add_parser("eval", help="evaluation examples/s: the log-likelihood scorers (chunked, packed, packed "
                         "with a base model's boundary states) side by side",
                         description="Runs an lm-eval suite (what `swiftkv eval` runs, without fidelity) once per "
                         "scorer per repeat on one loaded model, the order alternating between repeats, after an "
                         "untimed warm-up pass per scorer. Prints and saves examples/s per run, the median per scorer, "
                         "each median's ratio to the first scorer's, the time spent inside the scorer, and the largest "
                         "difference between the scorers' logged log-likelihoods. JSON keys: summary.<scorer>."
                         "median_examples_per_s, speedup.<scorer>, agreement.<scorer>.max_abs_loglikelihood_diff.",
                         formatter_class=DefaultsFormatter)
    add_model_args(p)
    p.add_argument("--bigbench-manifest", default=None, help="every task of this manifest (swiftkv bigbench build)")
    p.add_argument("--bigbench-split", default="report", choices=["selection", "report"])
    p.add_argument("--tasks-json", default=None, help="JSON list of tasks, as `swiftkv eval --tasks-json`")
    p.add_argument("--task", action="append", help="an lm-eval task name (repeatable)")
    p.add_argument("--include-path", action="append", help="folder of task YAMLs (repeatable)")
    p.add_argument("--limit", type=positive_int, default=None, help="at most this many examples per task")
    p.add_argument("--scorers", nargs="+", choices=["chunked", "packed", "boundary"], default=["chunked", "packed"],
                   help="scorers to time; the first is the reference of the ratios and differences (boundary: the "
                   "packed scorer given --boundary's states, a SwiftKV student only)")
    p.add_argument("--boundary", default=None, metavar="DIR",
                   help="the base model's boundary states (swiftkv eval BASE --save-boundary DIR) for the boundary "
                   "scorer")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed runs per scorer, interleaved")
    p.add_argument("--warmup-limit", type=positive_int, default=4, help="examples per task in the untimed warm-up")
    p.add_argument("--batch-size", type=positive_int, default=16, help="contexts per forward (chunked scorer)")
    p.add_argument("--positions-per-forward", type=positive_int, default=1024, help="positions per forward (packed)")
    p.add_argument("--kv-cache", default="native", choices=["native", "fp8"])
    p.add_argument("--teacher", action="store_true", help="time a SwiftKV checkpoint as its teacher")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--name", default=None, help="model name in the JSON (default: MODEL)")
    p.add_argument("--output", "-o", required=True, help="JSON file to write")
    p.set_defaults(func=cmd_bench_eval, output_kind="file")
    serving.add_parsers(bench)
