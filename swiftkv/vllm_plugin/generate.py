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
    p.add_argument("--output", "-o", required=True)
    args = p.parse_args(argv)

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    os.environ["SWIFTKV_VLLM_STATS"] = "1"
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model ships model_stats by reference

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
    engine_args = dict(model=args.model, dtype=args.dtype, enforce_eager=True, max_model_len=args.max_model_len,
                       seed=0)
    if args.max_num_batched_tokens:
        engine_args.update(max_num_batched_tokens=args.max_num_batched_tokens, enable_chunked_prefill=True)
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


def _step(token: int, step: dict) -> dict:
    """One generated token's entry of vLLM's logprobs (token id -> Logprob with its rank): the token's log-probability
    and the top candidates in rank order."""
    top = sorted(((tid, lp) for tid, lp in step.items() if lp.rank is not None), key=lambda x: x[1].rank)
    return {"token": int(token), "logprob": float(step[token].logprob),
            "top": [[int(tid), float(lp.logprob)] for tid, lp in top]}


if __name__ == "__main__":
    sys.exit(main())
