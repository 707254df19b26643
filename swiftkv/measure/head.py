"""The packed scorer's output side: log-probabilities of the asked tokens without the whole (positions, vocabulary)
logits.

A scored position needs only the log-probability of the tokens it is asked to predict, which is that token's logit
minus the log-sum-exp of the row, and its argmax (lm-eval's ``is_greedy``). Projecting every scored position to the
vocabulary at once, then taking ``logsumexp`` and ``argmax``, writes and reads the (positions, vocabulary) logits
several times: on a 2-core CPU with a 49K vocabulary that is about a tenth of a packed forward. ``scored_log_probs``
projects one vocabulary chunk at a time and keeps, per position, each chunk's maximum, argmax and sum of exponentials,
and the asked logits that fall in it; the chunks' sums are then merged as ``logsumexp`` merges them. Same numbers
to fp32 rounding (``tests/test_evaluate.py``).

``final_hidden_states`` lets the model's forward return its final hidden states in place of the logits, for the
models whose logits are exactly ``lm_head(hidden)``: the families SwiftKV converts and their SwiftKV models. Any
other model (soft-capped or scaled logits, a bias) keeps its own head, and ``scored_log_probs`` takes its logits.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

from swiftkv.models import FAMILIES, SWIFTKV_MODEL_TYPES

VOCAB_CHUNK = 8192  # rows of the output projection per matmul (8192 and 4096 measured alike on a 2-core AMD EPYC)

# model types whose causal-LM forward computes logits = lm_head(final hidden states) and nothing more
PLAIN_HEAD_TYPES = frozenset(FAMILIES) | frozenset(SWIFTKV_MODEL_TYPES)


def plain_head(model) -> torch.nn.Linear | None:
    """The model's output projection when its logits are exactly ``lm_head(hidden)``, else None. A head that
    accelerate dispatches (``device_map``: a hook moves its input, or loads offloaded weights) is left to its hook."""
    head = getattr(model, "lm_head", None)
    if getattr(model.config, "model_type", None) not in PLAIN_HEAD_TYPES:
        return None
    if type(head) is not torch.nn.Linear or head.bias is not None or hasattr(head, "_hf_hook"):
        return None
    return head


@contextmanager
def final_hidden_states(model):
    """Inside, the model's ``logits`` are its final hidden states (the output projection is an identity); yields the
    projection for ``scored_log_probs``. Yields None and changes nothing for a model whose logits are more than
    ``lm_head(hidden)`` (``plain_head``)."""
    head = plain_head(model)
    if head is None:
        yield None
        return
    model.lm_head = torch.nn.Identity()
    try:
        yield head
    finally:
        model.lm_head = head


def scored_log_probs(outputs: torch.Tensor, index: torch.Tensor, targets: torch.Tensor,
                     head: torch.nn.Linear | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(targets[k] at position index[k]) as fp32 (K,), each position's argmax (S,)).

    ``outputs`` (S, d): final hidden states, projected here by ``head`` one ``VOCAB_CHUNK`` at a time; or (S, V):
    logits (``head`` None), overwritten when they are fp32. Ties in the argmax go to the lowest token id, as
    ``torch.argmax``."""
    if head is None:
        chunks = [(0, outputs)]
    else:
        weight = head.weight
        chunks = ((start, F.linear(outputs, weight[start:start + VOCAB_CHUNK]))
                  for start in range(0, weight.shape[0], VOCAB_CHUNK))
    picked = torch.empty(index.shape, dtype=torch.float32, device=outputs.device)
    maxima, argmaxes, sums = [], [], []
    for start, logits in chunks:
        logits = logits.float()  # S, chunk
        top, arg = logits.max(dim=-1)  # first maximum of the chunk
        inside = ((targets >= start) & (targets < start + logits.shape[-1])).nonzero().flatten()
        picked[inside] = logits[index[inside], targets[inside] - start]
        sums.append(logits.sub_(top[:, None]).exp_().sum(dim=-1))  # in place: the chunk is not needed again
        maxima.append(top)
        argmaxes.append(arg + start)
    maxima = torch.stack(maxima, dim=-1)  # S, chunks
    top, first = maxima.max(dim=-1)  # the first chunk holding the row's maximum
    norm = top + (torch.stack(sums, dim=-1) * (maxima - top[:, None]).exp()).sum(dim=-1).log()  # logsumexp, S
    argmax = torch.stack(argmaxes, dim=-1).gather(-1, first[:, None])[:, 0]
    return picked - norm[index], argmax
