"""Quality against prompt length (issue 18, part 1): two measures built offline from held-out ShareGPT.

- ``passkey``: a five-digit key hidden at a controlled depth of a long filler made of held-out ShareGPT text, then
  asked for (chat template: the filler and the question are the user turn, "The pass key is" opens the reply). Per
  (prompt length, depth, sample): whether the model's greedy reading of the key is exact (every key token is the
  argmax given the tokens before it, teacher-forced: the same as greedy generation of the key) and the key's
  log-probability. Only the key's positions need logits, so a SwiftKV student runs its later layers for those
  positions alone (``logits_to_keep``): the prefill skip, as served.
- ``context``: the negative log-likelihood (nats/token) of the last ``target_tokens`` tokens of long held-out
  conversations (chat template) given the ``c`` tokens before them, for each context length ``c``: how the loss on
  the same tokens moves as more context comes before them. Per conversation, so the analysis pairs base and
  student on the same conversations and context lengths.

Conversations too short for the longest context are skipped; ``min_conversations`` says how many are needed.
"""

from __future__ import annotations

import logging
import random
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from swiftkv.errors import SwiftKVError
from swiftkv.measure.fidelity import continuation_scores

logger = logging.getLogger(__name__)

NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? Answer with the number only."
ANSWER = "The pass key is"


@dataclass
class LongContextSettings:
    lengths: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)  # passkey prompt lengths (tokens, approx.)
    depths: tuple[float, ...] = (0.1, 0.5, 0.9)  # where the key sits in the filler (0 = start, 1 = end)
    samples: int = 4  # keys per (length, depth)
    contexts: tuple[int, ...] = (128, 512, 2048, 6144)  # context lengths before the scored tokens
    conversations: int = 24  # long held-out conversations for the context measure
    target_tokens: int = 128  # scored tokens at the end of each conversation
    seed: int = 0


def _filler_tokens(tokenizer, conversations, needed: int) -> list[int]:
    """Plain text of held-out conversations, in order, tokenized, at least ``needed`` tokens long."""
    ids: list[int] = []
    for conv in conversations:
        text = "\n\n".join(m["content"] for m in conv.messages) + "\n\n"
        ids += tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= needed:
            return ids
    raise SwiftKVError(f"the held-out conversations hold only {len(ids)} tokens of filler; the passkey task needs "
                       f"{needed} (lower the largest length)")


def _chat(tokenizer) -> tuple[list[int], list[int]]:
    """(ids before the user turn's text, ids after it up to the answer's opening) of the chat template."""
    marker = "\u2063SWIFTKV\u2063"
    messages = [{"role": "user", "content": marker}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + ANSWER
    else:
        text = f"User: {marker}\n\nAssistant: {ANSWER}"
    before, after = text.split(marker)
    return (tokenizer(before, add_special_tokens=False)["input_ids"],
            tokenizer(after, add_special_tokens=False)["input_ids"])


def passkey_prompts(tokenizer, conversations, settings: LongContextSettings) -> list[dict]:
    """Every (length, depth, sample): token ids of the prompt up to the key, the key's token ids, and where the key
    sits. The prompt is cut to the length with filler; the needle is spliced in at the depth, on a token boundary."""
    rng = random.Random(settings.seed)
    head, tail = _chat(tokenizer)  # template around the user turn
    question = tokenizer("\n\n" + QUESTION, add_special_tokens=False)["input_ids"]
    filler = _filler_tokens(tokenizer, conversations, max(settings.lengths) + 64)
    out = []
    for length in settings.lengths:
        for depth in settings.depths:
            for s in range(settings.samples):
                key = f"{rng.randint(10000, 99999)}"
                needle = tokenizer(" " + NEEDLE.format(key=key) + " ", add_special_tokens=False)["input_ids"]
                key_ids = tokenizer(" " + key, add_special_tokens=False)["input_ids"]
                room = length - len(head) - len(tail) - len(question) - len(needle) - len(key_ids)
                if room < 16:
                    raise SwiftKVError(f"passkey length {length} is too short for the template and the question; "
                                       "use lengths of at least 128")
                start = rng.randint(0, len(filler) - room)
                body = filler[start:start + room]
                cut = round(depth * len(body))
                prompt = head + body[:cut] + needle + body[cut:] + question + tail
                out.append({"length": length, "depth": depth, "sample": s, "key": key, "prompt": prompt,
                            "key_ids": key_ids, "tokens": len(prompt) + len(key_ids)})
    return out


def long_conversations(tokenizer, conversations, settings: LongContextSettings) -> list[dict]:
    """The first ``settings.conversations`` held-out conversations (chat template) with at least the longest
    context + target tokens; their ids cut to exactly that many from the end."""
    need = max(settings.contexts) + settings.target_tokens
    out = []
    for conv in conversations:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(conv.messages, tokenize=False)
        else:
            text = "\n\n".join(f"{m['role']}: {m['content']}" for m in conv.messages)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= need:
            out.append({"id": conv.id, "ids": ids[-need:], "total_tokens": len(ids)})
            if len(out) == settings.conversations:
                break
    if not out:
        raise SwiftKVError(f"no held-out conversation has {need} tokens; lower the largest context length")
    if len(out) < settings.conversations:
        logger.warning("only %d held-out conversations have %d tokens (asked for %d)", len(out), need,
                       settings.conversations)
    return out


@torch.inference_mode()
def measure_long_context(model, tokenizer, conversations, settings: LongContextSettings,
                         progress: bool = True) -> dict:
    """Both measures for ``model`` (a base model or a SwiftKV student, which runs with its prefill skip)."""
    import time

    t0 = time.perf_counter()
    window = getattr(model.config, "max_position_embeddings", None)
    if window and max(settings.lengths) > window:
        raise SwiftKVError(f"passkey length {max(settings.lengths)} exceeds the model's window of {window} tokens")
    prompts = passkey_prompts(tokenizer, conversations, settings)
    passkey = []
    for p in tqdm(prompts, desc="long context: passkey", disable=not progress):
        logps, tops = continuation_scores(model, p["prompt"], p["key_ids"])
        hits = [top[0] == t for top, t in zip(tops, p["key_ids"])]  # greedy reading, token by token
        passkey.append({k: p[k] for k in ("length", "depth", "sample", "key", "tokens")}
                       | {"key_logprob": sum(logps), "exact": all(hits)})
    convs = long_conversations(tokenizer, conversations, settings)
    context = []
    for c in tqdm(convs, desc="long context: likelihood", disable=not progress):
        ids = c["ids"]
        target = ids[-settings.target_tokens:]
        for n in settings.contexts:
            before = ids[len(ids) - settings.target_tokens - n:len(ids) - settings.target_tokens]
            logps, _ = continuation_scores(model, before, target)
            context.append({"conversation": c["id"], "context": n, "tokens": len(target), "nll_sum": -sum(logps)})
    return {"settings": asdict(settings), "passkey": passkey, "context": context,
            "conversations": [{"id": c["id"], "total_tokens": c["total_tokens"]} for c in convs],
            "seconds": time.perf_counter() - t0}
