"""Greedy generation through vLLM's ``LLM`` (run in the vLLM venv): token ids, the engine's KV-cache capacity and
the plugin's per-step counters, as JSON. The correctness test compares its output with transformers.

    python -m swiftkv.vllm_plugin.generate --model DIR --prompts prompts.json -o out.json

``prompts.json`` is a list of token-id lists (already chat-templated), so both runtimes see the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory (a SwiftKV checkpoint or a base model)")
    p.add_argument("--prompts", required=True, help="JSON list of prompt token-id lists")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="token budget per engine step; small values split prompts into chunks")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--kv-cache-gib", type=int, default=1, help="KV-cache size in GiB: VLLM_CPU_KVCACHE_SPACE (CPU build)")
    p.add_argument("--skip-tokenizer-init", action="store_true", help="model dir without a tokenizer (ids only)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    p.add_argument("--logprobs", type=int, default=0,
                   help="also record, per generated token, its log-probability and the top-K (K > 0) candidates")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="ranks (processes) the model is split over; on the CPU build each rank is bound to its own "
                        "share of this process's CPUs (VLLM_CPU_OMP_THREADS_BIND, unless set)")
    p.add_argument("--attention-backend", default=None, help="vLLM attention backend (e.g. FLASH_ATTN on CUDA)")
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True,
                   help="run the model eagerly (default; --no-enforce-eager lets vLLM capture CUDA graphs on a GPU)")
    p.add_argument("--output", "-o", required=True)
    args = p.parse_args(argv)

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    os.environ["SWIFTKV_VLLM_STATS"] = "1"
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model ships model_stats by reference
    if args.tensor_parallel_size > 1 and os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") == "auto":
        # vLLM's automatic binding gives each CPU rank a NUMA node of its own and stops on a one-node machine
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(sorted(os.sched_getaffinity(0)),
                                                                     args.tensor_parallel_size)

    from swiftkv.errors import SwiftKVError
    from swiftkv.vllm_plugin import check_served

    try:
        check_served(args.model)
    except SwiftKVError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from swiftkv.io import write_json
    from swiftkv.vllm_plugin import model_stats

    with open(args.prompts) as f:
        prompts = json.load(f)
    engine_args = dict(model=args.model, dtype=args.dtype, enforce_eager=args.enforce_eager,
                       max_model_len=args.max_model_len, seed=0, tensor_parallel_size=args.tensor_parallel_size)
    if args.max_num_batched_tokens:
        engine_args.update(max_num_batched_tokens=args.max_num_batched_tokens, enable_chunked_prefill=True)
    if args.attention_backend:
        engine_args["attention_backend"] = args.attention_backend
    if args.max_num_seqs:
        engine_args["max_num_seqs"] = args.max_num_seqs
    if args.skip_tokenizer_init:
        engine_args["skip_tokenizer_init"] = True
    start = time.perf_counter()
    llm = LLM(**engine_args)
    startup_s = time.perf_counter() - start
    cache = llm.llm_engine.vllm_config.cache_config
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos,
                            detokenize=not args.skip_tokenizer_init, logprobs=args.logprobs or None)
    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
    generate_s = time.perf_counter() - start
    result = {
        "model": args.model,
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
        "text": [o.outputs[0].text for o in outputs],
        "kv_cache_blocks": cache.num_gpu_blocks,
        "block_size": cache.block_size,
        "kv_cache_tokens": cache.num_gpu_blocks * cache.block_size,  # blocks x tokens per block
        "kv_cache_size_tokens": getattr(cache, "kv_cache_size_tokens", None),  # what the engine logs (per-request
        "kv_cache_max_concurrency": getattr(cache, "kv_cache_max_concurrency", None),  # block rounding)
        "kv_sharing_fast_prefill": cache.kv_sharing_fast_prefill,
        "stats": llm.apply_model(model_stats)[0],
        "engine_args": engine_args,
        "startup_s": startup_s,
        "generate_s": generate_s,
    }
    if args.logprobs:  # per prompt, per generated token: its log-probability and the top-K [id, logprob] by rank
        result["logprobs"] = [[_step(token, step) for token, step in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
                              for o in outputs]
    write_json(args.output, result)
    return 0


def cpu_thread_binding(cpus: list[int], ranks: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU workers sharing ``cpus``: consecutive equal shares, one per
    rank, separated by ``|`` (at least one CPU each; with fewer CPUs than ranks, ranks share CPUs round-robin)."""
    if len(cpus) < ranks:
        return "|".join(str(cpus[r % len(cpus)]) for r in range(ranks))
    share = len(cpus) // ranks
    return "|".join(",".join(map(str, cpus[r * share:(r + 1) * share])) for r in range(ranks))


def _step(token: int, step: dict) -> dict:
    """One generated token's entry of vLLM's logprobs (token id -> Logprob with its rank): the token's log-probability
    and the top candidates in rank order."""
    top = sorted(((tid, lp) for tid, lp in step.items() if lp.rank is not None), key=lambda x: x[1].rank)
    return {"token": int(token), "logprob": float(step[token].logprob),
            "top": [[int(tid), float(lp.logprob)] for tid, lp in top]}


if __name__ == "__main__":
    sys.exit(main())
