"""Tokenisation and attention-separated packing of conversations (``swiftkv.data.conversations``) into training rows.

Conversations are rendered with the chat template, shuffled by a seed and laid end to end in rows of ``max_length``
tokens; position ids restart at 0 for each conversation, so a row's attention never crosses a conversation. The
stream for a smaller token budget is a prefix of the stream for a larger one (``cut_stream``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from swiftkv.data.conversations import Conversation
from swiftkv.errors import SwiftKVError

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
HELDOUT_SEED = 0  # the held-out distillation sample is the same for every run, whatever the training seed


@dataclass
class Pack:
    """Whole conversations laid end to end in one row; position ids restart at 0 for each conversation."""

    input_ids: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)  # next token of the same conversation; IGNORE_INDEX at its end
    conversation_ids: list[str] = field(default_factory=list)
    assistant: list[bool] | None = None  # per token: inside an assistant message (when the stream knows)

    def __len__(self) -> int:
        return len(self.input_ids)

    def add(self, conversation_id: str, ids: list[int], assistant: list[bool] | None = None) -> None:
        self.input_ids += ids
        self.position_ids += range(len(ids))
        self.labels += ids[1:] + [IGNORE_INDEX]
        self.conversation_ids.append(conversation_id)
        if assistant is not None:
            self.assistant = (self.assistant or []) + list(assistant)


@dataclass
class PackReport:
    """What went into the packs: conversations used, tokens, truncations and skips (reason -> count)."""

    conversations: int = 0
    tokens: int = 0
    truncated: int = 0  # conversations cut to max_length
    truncated_tokens: int = 0  # tokens dropped by those cuts
    packs: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def tokenize_conversation(tokenizer, conversation: Conversation) -> list[int]:
    """Token ids of a whole conversation rendered with the tokenizer's chat template."""
    out = tokenizer.apply_chat_template(conversation.messages, tokenize=True, return_dict=True)
    return list(out["input_ids"])


@dataclass
class Segment:
    """One conversation of the token stream: its ids (truncated to max_length, the last one cut to the budget)."""

    conversation_id: str
    input_ids: list[int]
    truncated_tokens: int = 0  # dropped by the max_length cut
    assistant: list[bool] | None = None  # per token: part of an assistant message (loss_positions="assistant")


def conversation_stream(
    conversations: list[Conversation],
    tokenizer,
    max_length: int,
    token_budget: int | None = None,
    seed: int = 0,
    report: PackReport | None = None,
    assistant_masks: bool = False,
) -> list[Segment]:
    """Shuffle (``seed``), render with the chat template, truncate to ``max_length`` and take conversations in that
    order until ``token_budget`` tokens (None: every conversation); the last one is cut to the budget.
    Deterministic for a seed, and a prefix property holds: the stream for a smaller budget is this stream cut at
    that budget (``cut_stream``), so one stream (and one teacher cache over it) serves every smaller budget."""
    import random

    if max_length < 2:
        raise SwiftKVError(f"max_length={max_length} is too short; use at least 2 tokens (e.g. 2048)")
    if getattr(tokenizer, "chat_template", None) is None:
        raise SwiftKVError("the tokenizer has no chat template; distillation data is rendered with it")
    report = report if report is not None else PackReport()
    order = list(range(len(conversations)))
    random.Random(seed).shuffle(order)
    stream: list[Segment] = []
    for index in order:
        if token_budget is not None and report.tokens >= token_budget:
            break
        conv = conversations[index]
        try:
            ids = tokenize_conversation(tokenizer, conv)
        except Exception as err:  # a template that rejects the turn order, say
            logger.debug("skipping %s: %s", conv.id, err)
            report.skip("chat template error")
            continue
        if len(ids) < 2:
            report.skip("shorter than 2 tokens")
            continue
        dropped = max(0, len(ids) - max_length)
        if dropped:
            report.truncated += 1
            report.truncated_tokens += dropped
            ids = ids[:max_length]
        if token_budget is not None:
            if token_budget - report.tokens < 2:
                break
            ids = ids[: token_budget - report.tokens]  # the last conversation is cut to the budget
        mask = assistant_token_mask(tokenizer, conv, ids) if assistant_masks else None
        stream.append(Segment(conv.id, ids, dropped, mask))
        report.conversations += 1
        report.tokens += len(ids)
    if token_budget is not None and report.tokens < token_budget:
        logger.warning("only %d tokens of data for a budget of %d", report.tokens, token_budget)
    return stream


def cut_stream(stream: list[Segment], token_budget: int | None, report: PackReport | None = None) -> list[Segment]:
    """The stream ``conversation_stream`` gives for a smaller ``token_budget``: the same conversations, cut there."""
    report = report if report is not None else PackReport()
    out = []
    for seg in stream:
        if token_budget is not None and (report.tokens >= token_budget or token_budget - report.tokens < 2):
            break
        n = len(seg.input_ids) if token_budget is None else min(len(seg.input_ids), token_budget - report.tokens)
        out.append(Segment(seg.conversation_id, seg.input_ids[:n], seg.truncated_tokens,
                           None if seg.assistant is None else seg.assistant[:n]))
        report.conversations += 1
        report.tokens += n
        if seg.truncated_tokens:
            report.truncated += 1
            report.truncated_tokens += seg.truncated_tokens
    return out


def pack_stream(stream: list[Segment], max_length: int, report: PackReport | None = None) -> list[Pack]:
    """Lay the stream's conversations end to end, greedily, into rows of at most ``max_length`` tokens."""
    packs, current = [], Pack()
    for seg in stream:
        if len(current) + len(seg.input_ids) > max_length:
            packs.append(current)
            current = Pack()
        current.add(seg.conversation_id, seg.input_ids, seg.assistant)
    if len(current):
        packs.append(current)
    if report is not None:
        report.packs = len(packs)
    return packs


def pack_conversations(
    conversations: list[Conversation],
    tokenizer,
    max_length: int,
    token_budget: int | None = None,
    seed: int = 0,
    report: PackReport | None = None,
    assistant_masks: bool = False,
) -> list[Pack]:
    """``conversation_stream`` packed into rows of at most ``max_length`` tokens (``pack_stream``). Only the
    conversations needed for the budget are tokenised; skipped and truncated ones are counted in ``report``."""
    report = report if report is not None else PackReport()
    stream = conversation_stream(conversations, tokenizer, max_length, token_budget, seed, report, assistant_masks)
    return pack_stream(stream, max_length, report)


def assistant_token_mask(tokenizer, conversation: Conversation, ids: list[int]) -> list[bool]:
    """Per token of the rendered conversation (``ids``, possibly cut short): inside an assistant message?

    Each assistant message's span is where the rendering grows from "the conversation before it, with the generation
    prompt" to "the conversation through it" (chat templates render a conversation's prefix as a prefix); the
    tokens whose text starts inside a span are marked (offsets of a fast tokenizer)."""
    msgs = conversation.messages
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True) if i else ""
        through = tokenizer.apply_chat_template(msgs[: i + 1], tokenize=False)
        if not (text.startswith(through) and through.startswith(before)):
            raise SwiftKVError("the chat template does not render a conversation's beginning as a prefix of the "
                               "whole; --loss-positions assistant cannot locate the assistant tokens: use 'all'")
        spans.append((len(before), len(through)))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc["input_ids"][: len(ids)]) != list(ids):
        raise SwiftKVError("tokenising the rendered chat text does not give the chat template's tokens; "
                           "--loss-positions assistant cannot locate the assistant tokens: use 'all'")
    return [any(a <= start < b for a, b in spans) for start, _ in enc["offset_mapping"][: len(ids)]]


def collate_packs(packs: list[Pack], pad_token_id: int = 0) -> dict:
    """Stack packs into (B, S) tensors. Padding at the end of a row is one more segment (positions restart at 0)
    with ``loss_mask`` 0, so the rows need no attention mask and transformers detects the packing from
    ``position_ids`` (no attention crosses a conversation boundary or reaches into the padding)."""
    import torch

    width = max(len(p) for p in packs)
    input_ids = torch.full((len(packs), width), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(packs), width), dtype=torch.long)
    labels = torch.full((len(packs), width), IGNORE_INDEX, dtype=torch.long)
    loss_mask = torch.zeros((len(packs), width), dtype=torch.bool)
    assistant = torch.zeros((len(packs), width), dtype=torch.bool) if all(p.assistant for p in packs) else None
    for row, p in enumerate(packs):
        n = len(p)
        input_ids[row, :n] = torch.tensor(p.input_ids)
        position_ids[row, :n] = torch.tensor(p.position_ids)
        position_ids[row, n:] = torch.arange(width - n)
        labels[row, :n] = torch.tensor(p.labels)
        loss_mask[row, :n] = True
        if assistant is not None:
            assistant[row, :n] = torch.tensor(p.assistant)
    batch = {"input_ids": input_ids, "position_ids": position_ids, "labels": labels, "loss_mask": loss_mask}
    if assistant is not None:
        batch["assistant_mask"] = assistant  # B,S: tokens of assistant messages (loss_positions="assistant")
    return batch
