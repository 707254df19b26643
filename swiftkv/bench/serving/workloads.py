"""Workloads shared by every engine: random-token prompts, Poisson arrivals, and ShareGPT requests by I/O ratio.

ShareGPT requests (paper Table A.3) follow vLLM's own ShareGPT benchmark: the prompt is a conversation's first
user turn, the output length is the length of the reply that followed it; prompts shorter than 4 or longer than
``max_input_len`` tokens and replies shorter than 4 tokens are dropped. A request passes the filter ``min_ratio``
when prompt length / reply length >= min_ratio (original lengths, before any cap); the reply is then capped at
``max_output_len`` tokens so that a small CPU finishes. Both engines read the same selected file, so they run the
same prompts with the same output lengths.
"""

from __future__ import annotations

import json
import logging
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from swiftkv.errors import SwiftKVError
from swiftkv.io import write_json

logger = logging.getLogger(__name__)

MIN_LEN = 4  # vLLM's ShareGPT pruning: prompts and replies shorter than this are dropped


def random_prompts(num: int, length: int, vocab_size: int, seed: int = 0) -> torch.Tensor:
    """(num, length) token ids drawn uniformly, away from the low ids where tokenizers keep special tokens."""
    low = 100 if vocab_size > 1000 else 1
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, vocab_size, (num, length), generator=gen)


def poisson_arrivals(num: int, rate: float, seed: int = 0) -> list[float]:
    """Arrival times (s from the start) of ``num`` requests at ``rate`` requests/s; ``inf`` = all at once."""
    if rate == float("inf"):
        return [0.0] * num
    if rate <= 0:
        raise SwiftKVError(f"request rate must be > 0, got {rate}")
    rng = random.Random(seed)
    t, times = 0.0, []
    for _ in range(num):
        t += rng.expovariate(rate)
        times.append(t)
    return times


@dataclass
class Request:
    id: str
    prompt: str
    reply: str  # the reply, cut to the output cap (what vLLM's ShareGPT loader measures)
    input_len: int
    output_len: int
    reply_len: int  # the original reply length (the filter uses this)


def _first_exchange(messages: list[dict]) -> tuple[str, str] | None:
    for i, m in enumerate(messages[:-1]):
        if m["role"] == "user":
            nxt = messages[i + 1]
            return (m["content"], nxt["content"]) if nxt["role"] == "assistant" else None
    return None


def candidate_requests(conversations, tokenizer, max_input_len: int, max_output_len: int) -> list[Request]:
    """Every conversation's first exchange that passes vLLM's ShareGPT pruning, reply capped to ``max_output_len``."""
    pairs = [(c.id, *ex) for c in conversations if (ex := _first_exchange(c.messages)) is not None]
    if not pairs:
        return []
    prompt_ids = tokenizer([p for _, p, _ in pairs])["input_ids"]
    reply_ids = tokenizer([r for _, _, r in pairs])["input_ids"]
    out = []
    for (cid, prompt, reply), p_ids, r_ids in zip(pairs, prompt_ids, reply_ids):
        if not MIN_LEN <= len(p_ids) <= max_input_len or len(r_ids) < MIN_LEN:
            continue
        text, out_len = reply, len(r_ids)
        if out_len > max_output_len:
            text = tokenizer.decode(r_ids[:max_output_len], skip_special_tokens=True)
            out_len = len(tokenizer(text)["input_ids"])  # what a re-tokenising engine will count
            if out_len < MIN_LEN:
                continue
        out.append(Request(cid, prompt, text, len(p_ids), out_len, len(r_ids)))
    return out


def workload_stats(requests: list[Request]) -> dict:
    """Lengths and input/output ratios of a request set (ratio of sums is what sets the prefill share)."""
    if not requests:
        return {"num_requests": 0}
    ins = [r.input_len for r in requests]
    outs = [r.output_len for r in requests]
    return {
        "num_requests": len(requests),
        "mean_input_len": statistics.mean(ins),
        "mean_output_len": statistics.mean(outs),
        "ratio_of_sums": sum(ins) / sum(outs),
        "mean_ratio": statistics.mean(i / o for i, o in zip(ins, outs)),
        "uncapped_ratio_of_sums": sum(ins) / sum(r.reply_len for r in requests),
    }


def select_sharegpt(
    tokenizer,
    min_ratios: list[float],
    num_requests: int,
    max_input_len: int = 1024,
    max_output_len: int = 64,
    split: str = "train",
    seed: int = 0,
    conversations=None,
) -> dict:
    """For each minimum ratio, ``num_requests`` requests sampled (seeded) from those that pass it."""
    if conversations is None:
        from swiftkv.data.conversations import sharegpt_split

        conversations = sharegpt_split(split)
    pool = candidate_requests(conversations, tokenizer, max_input_len, max_output_len)
    logger.info("ShareGPT %s: %d conversations, %d usable first exchanges", split, len(conversations), len(pool))
    filters = []
    for ratio in min_ratios:
        passing = [r for r in pool if r.input_len / r.reply_len >= ratio]
        chosen = random.Random(f"{seed}-{ratio}").sample(passing, min(num_requests, len(passing)))
        if not chosen:
            raise SwiftKVError(
                f"no ShareGPT request has input/output ratio >= {ratio} with prompts <= {max_input_len} tokens; "
                "lower the filter or raise max_input_len"
            )
        if len(chosen) < num_requests:
            logger.warning("min ratio %s: only %d requests pass (asked for %d)", ratio, len(chosen), num_requests)
        filters.append({"min_ratio": ratio, "passing": len(passing), **workload_stats(chosen),
                        "requests": [r.__dict__ for r in chosen]})
    return {
        "source": f"ShareGPT V3 ({split} split), first user turn -> first reply",
        "split": split,
        "settings": {"min_ratios": list(min_ratios), "num_requests": num_requests, "max_input_len": max_input_len,
                     "max_output_len": max_output_len, "seed": seed},
        "usable": len(pool),
        "filters": filters,
    }


def load_selection(path: str | Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SwiftKVError(f"{path} not found; make it with: swiftkv bench sharegpt-requests MODEL -o {path}") from None
    if "filters" not in data:
        raise SwiftKVError(f"{path} is not a ShareGPT request selection (no 'filters'); remake it with swiftkv bench sharegpt-requests")
    return data


def requests_of(filter_entry: dict) -> list[Request]:
    return [Request(**r) for r in filter_entry["requests"]]


def write_vllm_sharegpt(requests: list[Request], path: str | Path) -> None:
    """The requests in the ShareGPT file format that ``vllm bench throughput --dataset-name sharegpt`` reads."""
    write_json(path, [
        {"id": r.id, "conversations": [{"from": "human", "value": r.prompt}, {"from": "gpt", "value": r.reply}]}
        for r in requests
    ])
