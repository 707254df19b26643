"""Teacher fidelity of a student on held-out conversations: measures that stay sensitive on a small model.

- ``kl``: KL(teacher || student) of the next-token distributions (T = 1), per token, teacher-forced over held-out
  ShareGPT conversations (chat template applied). Each position's student logits are what the student would
  predict if the prompt ended there, i.e. with every earlier position's later-layer K/V coming from the SwiftKV
  projections: exactly the quantity SwiftKV changes.
- ``top1``: how often the student's argmax next token equals the teacher's, same positions.
- ``greedy``: both models greedily continue the first user turn of held-out conversations (chat template,
  generation prompt); the score of a prompt is the length of the common prefix of the two continuations over
  the teacher's continuation length (1 = identical). The student generates with its prefill skip.

Every measure is kept per conversation, so that the analysis can bootstrap over conversations.

The teacher's side is the same for every student of a model: ``swiftkv.measure.fidelity_teacher`` computes it once
(the final hidden state of every teacher-forced batch and the teacher's greedy continuations) and
``measure_fidelity(..., cached=...)`` reads it, re-applying the teacher's own head (its ``ForCausalLM`` forward with
the backbone's output given), so the numbers equal a run that computes the teacher itself (``tests/test_fidelity.py``).
Asked for (``boundary_layers``), it also keeps the stream entering each cut l on every teacher-forced batch: a SwiftKV
student whose embeddings and layers < l are the teacher's (checked by fingerprint) then takes it instead of running
them, with the native KV cache, and runs only its own part.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from swiftkv.measure.boundary import given_boundary

if TYPE_CHECKING:
    from swiftkv.measure.fidelity_teacher import TeacherOutputs

logger = logging.getLogger(__name__)


@dataclass
class FidelitySettings:
    num_sequences: int = 16  # teacher-forced conversations
    max_tokens: int = 256  # tokens per teacher-forced conversation
    num_prompts: int = 16  # greedy-continuation prompts
    max_prompt_tokens: int = 192
    new_tokens: int = 32
    batch_size: int = 8


def render(tokenizer, messages: list[dict]) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)


def teacher_forced_sequences(tokenizer, conversations, n: int, max_tokens: int) -> list[list[int]]:
    """Token ids of the first ``n`` conversations (chat template), each cut to ``max_tokens``."""
    out = []
    for conv in conversations:
        ids = tokenizer(render(tokenizer, conv.messages), add_special_tokens=False)["input_ids"][:max_tokens]
        if len(ids) >= 16:
            out.append(ids)
        if len(out) == n:
            break
    return out


def generation_prompts(tokenizer, conversations, n: int, max_prompt_tokens: int) -> list[list[int]]:
    """The first user turn of each conversation with the generation prompt, at most ``max_prompt_tokens``
    (longer prompts are skipped, so that every prompt is complete)."""
    out = []
    for conv in conversations:
        first = next(m for m in conv.messages if m["role"] == "user")
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([first], add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"]
        else:
            ids = tokenizer(f"user: {first['content']}\n\nassistant:", add_special_tokens=False)["input_ids"]
        ids = list(ids)
        if 4 <= len(ids) <= max_prompt_tokens:
            out.append(ids)
        if len(out) == n:
            break
    return out


def _pad(seqs: list[list[int]], pad_id: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if side == "right":
            ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
        else:
            ids[i, width - len(s):], mask[i, width - len(s):] = torch.tensor(s), 1
    return ids, mask


def _logits(model, ids, mask, cache_factory=None) -> torch.Tensor:
    kwargs = {"use_cache": False}
    if cache_factory is not None:
        kwargs = {"use_cache": True, "cache": cache_factory(model.config)}
    return model(input_ids=ids, attention_mask=mask, **kwargs).logits.float()


@functools.cache
def _given_output():
    from transformers.modeling_outputs import BaseModelOutputWithPast

    class GivenOutput(BaseModelOutputWithPast):
        """The decoder's output with only ``last_hidden_state``; a family's other fields (MoE router logits ...)
        read as None, as when they are not asked for."""

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return None

    return GivenOutput


@contextlib.contextmanager
def _backbone_returns(model, hidden: torch.Tensor):
    """Within the block, ``model``'s decoder (``get_decoder()``) returns ``hidden`` as its last hidden state instead
    of running, so ``model(...)`` applies only its own head (slicing, soft-capping: whatever the family does)."""
    backbone = model.get_decoder()
    backbone.forward = lambda *args, **kwargs: _given_output()(last_hidden_state=hidden)
    try:
        yield
    finally:
        del backbone.forward  # the instance attribute: the class's forward again


def _teacher_logits(teacher, ids, mask, hidden=None) -> torch.Tensor:
    if hidden is None:
        return _logits(teacher, ids, mask)
    with _backbone_returns(teacher, hidden.to(next(teacher.parameters()).device)):
        return _logits(teacher, ids, mask)


@torch.inference_mode()
def teacher_forced(teacher, student, sequences, batch_size: int = 8, cache_factory=None, progress: bool = True,
                   teacher_hidden: list[torch.Tensor] | None = None,
                   student_boundary: list[torch.Tensor] | None = None):
    """Per sequence: summed KL(teacher || student), top-1 agreements and the number of positions.

    ``student`` may be ``teacher`` itself (then only ``cache_factory`` can make them differ). ``teacher_hidden``: the
    teacher's final hidden state of each batch (``TeacherOutputs.hidden``), so that only its head runs.
    ``student_boundary``: the stream entering the SwiftKV student's layer l on each batch (``TeacherOutputs.boundary``,
    checked by ``TeacherOutputs.boundary_for``), so that it runs only its own part."""
    rows = []
    for k, start in enumerate(tqdm(range(0, len(sequences), batch_size), desc="fidelity: teacher-forced",
                                   disable=not progress)):
        batch = sequences[start : start + batch_size]
        ids, mask = _pad(batch, 0, "right")
        hidden = None if teacher_hidden is None else teacher_hidden[k]
        t_logp = F.log_softmax(_teacher_logits(teacher, ids, mask, hidden), dim=-1)  # B,S,V
        if student is teacher and cache_factory is None:
            s_logp = t_logp
        else:
            states = None if student_boundary is None else student_boundary[k].to(next(student.parameters()).device)
            with given_boundary(student, states):
                s_logp = F.log_softmax(_logits(student, ids, mask, cache_factory), dim=-1)  # B,S,V
        kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1)  # B,S
        agree = (t_logp.argmax(-1) == s_logp.argmax(-1)).float()  # B,S
        for i, seq in enumerate(batch):
            n = len(seq)
            rows.append({"tokens": n, "kl_sum": float(kl[i, :n].sum()), "top1_agree": float(agree[i, :n].sum())})
    return rows


@torch.inference_mode()
def continuation_scores(model, prompt: list[int], continuation: list[int], k: int = 1):
    """Teacher-forced on ``continuation`` after ``prompt``: the log-probability of each continuation token and the
    top-k token ids at its position. Only those positions get logits (``logits_to_keep``), so a SwiftKV student
    runs its later layers for them alone, as when it generates."""
    if not continuation:
        return [], []
    ids = torch.tensor([prompt + continuation[:-1]])
    n = len(continuation)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, logits_to_keep=n).logits[0]
    logp = F.log_softmax(logits.float(), dim=-1)  # n, V: position i predicts continuation[i]
    target = torch.tensor(continuation)
    return logp.gather(1, target[:, None])[:, 0].tolist(), logp.topk(k, dim=-1).indices.tolist()


@torch.inference_mode()
def greedy_continuations(model, prompts, new_tokens: int, pad_id: int, eos_id, batch_size: int = 8,
                         cache_factory=None, progress: bool = True, desc: str = "greedy") -> list[list[int]]:
    """Greedy continuations (without the prompt, cut after the first EOS) of left-padded prompt batches."""
    out = []
    for start in tqdm(range(0, len(prompts), batch_size), desc=f"fidelity: {desc}", disable=not progress):
        batch = prompts[start : start + batch_size]
        ids, mask = _pad(batch, pad_id, "left")
        kwargs = {}
        if cache_factory is not None:
            kwargs["past_key_values"] = cache_factory(model.config)
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=1,
                             do_sample=False, pad_token_id=pad_id, eos_token_id=eos_id, **kwargs)
        for row in gen[:, ids.shape[1]:].tolist():
            cut = []
            for tok in row:
                cut.append(tok)
                if eos_id is not None and tok in (eos_id if isinstance(eos_id, list) else [eos_id]):
                    break
            out.append(cut)
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _pad_and_eos(tokenizer):
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    return pad_id, tokenizer.eos_token_id


def measure_fidelity(teacher, student, tokenizer, conversations, settings: FidelitySettings,
                     cache_factory=None, progress: bool = True, cached: TeacherOutputs | None = None) -> dict:
    """All three measures for ``student`` against ``teacher`` on held-out ``conversations`` (a list of
    ``swiftkv.data.conversations.Conversation``); per-conversation rows plus the totals. ``cached``: the teacher's
    side from ``teacher_outputs`` (checked against ``teacher``, these settings and these sequences first)."""
    seqs = teacher_forced_sequences(tokenizer, conversations, settings.num_sequences, settings.max_tokens)
    prompts = generation_prompts(tokenizer, conversations, settings.num_prompts, settings.max_prompt_tokens)
    states, cut = None, None
    if cached is not None:
        cached.check(teacher, settings, seqs, prompts)
        if student is not teacher:
            cut, why = cached.boundary_for(student, cache_factory)
            if cut is None and why:
                logger.warning("the student runs its layers < l itself in the fidelity measure: %s", why)
            states = cached.boundary.get(cut) if cut is not None else None
    rows = teacher_forced(teacher, student, seqs, settings.batch_size, cache_factory, progress,
                          None if cached is None else cached.hidden, states)
    pad_id, eos_id = _pad_and_eos(tokenizer)
    if cached is not None:
        t_gen = cached.greedy
    else:
        t_gen = greedy_continuations(teacher, prompts, settings.new_tokens, pad_id, eos_id, settings.batch_size,
                                     None, progress, "teacher greedy")
    if student is teacher and cache_factory is None:
        s_gen = t_gen
    else:
        s_gen = greedy_continuations(student, prompts, settings.new_tokens, pad_id, eos_id, settings.batch_size,
                                     cache_factory, progress, "student greedy")
    greedy = [
        {"teacher_tokens": len(t), "student_tokens": len(s), "common_prefix": common_prefix(t, s),
         "agreement": common_prefix(t, s) / max(1, len(t)), "teacher": tokenizer.decode(t), "student": tokenizer.decode(s)}
        for t, s in zip(t_gen, s_gen)
    ]
    tokens = sum(r["tokens"] for r in rows)
    return {
        "settings": asdict(settings),
        "boundary_layer": cut,  # the student took the teacher's stream entering this layer (None: ran every layer)
        "kl": sum(r["kl_sum"] for r in rows) / max(1, tokens),
        "top1": sum(r["top1_agree"] for r in rows) / max(1, tokens),
        "greedy": sum(g["agreement"] for g in greedy) / max(1, len(greedy)),
        "teacher_forced": rows,
        "greedy_rows": greedy,
    }
