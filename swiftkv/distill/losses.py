"""Distillation losses over the LM head, chunked so that full-vocabulary logits exist for one chunk at a time.

The head (``lm_head``) is frozen in every SwiftKV training scope, so the loss only needs a gradient with respect to
the student's final hidden states. ``HeadLoss`` computes, chunk by chunk, the loss and that gradient in the
forward pass (autograd on the chunk's logits, then the logits are freed) and hands the stored gradient back in the
backward pass. Full-vocabulary logits are therefore materialised once per position for the student and once for
the teacher, and never kept for the backward pass. The distillation KL (``HeadKL``) does the same with the gradient
in closed form (``kl_and_grad``): its elementwise work over the (n, V) logits cost as much as the head's matmuls
when it went through autograd.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

ChunkLoss = Callable[[torch.Tensor, tuple[torch.Tensor, ...]], torch.Tensor]  # (student logits, targets) -> sum


def kl_sum(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Sum over positions of KL(teacher || student) of the temperature-scaled softmaxes, times T^2 (paper §3.3)."""
    t = temperature
    log_q = F.log_softmax(student_logits.float() / t, dim=-1)  # N,V
    log_p = F.log_softmax(teacher_logits.float() / t, dim=-1)  # N,V
    return F.kl_div(log_q, log_p, log_target=True, reduction="sum") * (t * t)


class HeadLoss(torch.autograd.Function):
    """``sum_chunks loss_fn(head(hidden[chunk]), targets[chunk])`` with its gradient computed chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, loss_fn: ChunkLoss, chunk_size: int, *targets):
        grad = torch.zeros_like(hidden)  # N,H
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], chunk_size):
            stop = start + chunk_size
            with torch.enable_grad():
                h = hidden[start:stop].detach().requires_grad_(True)  # n,H
                logits = F.linear(h, weight.detach(), None if bias is None else bias.detach())  # n,V
                loss = loss_fn(logits, tuple(t[start:stop] for t in targets))
                (g,) = torch.autograd.grad(loss, h)
            grad[start:stop] = g
            total += loss.detach().float()
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return (grad * grad_output.to(grad.dtype), None, None, None, None) + (None,) * (len(ctx.needs_input_grad) - 5)


def head_loss(hidden: torch.Tensor, head: torch.nn.Linear, loss_fn: ChunkLoss, *targets, chunk_size: int = 1024):
    """Sum of ``loss_fn`` over positions of ``hidden`` (N, H) through the frozen ``head``; grad flows to ``hidden``."""
    if head.weight.requires_grad:
        raise ValueError("head_loss needs a frozen head (its weight gets no gradient)")
    return HeadLoss.apply(hidden, head.weight, head.bias, loss_fn, chunk_size, *targets)


def row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise dot products in the inputs' dtype (fp32 logits), also under autocast, which would run ``vecdot`` in
    bf16 (a bf16 run's KL then lost ~1e-3 of its value to rounding)."""
    with torch.autocast(a.device.type, enabled=False):
        return torch.linalg.vecdot(a, b)


@torch.no_grad()
def kl_and_grad(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """T^2 * KL(teacher_T || student_T) summed over rows, and its gradient with respect to the student logits — in
    closed form, reusing the two logit buffers (both are overwritten: the student's ends as the gradient).

    With s = student / T, t = teacher / T, p = softmax(t), q = softmax(s):
    row KL = sum_v p_v (t_v - s_v) + lse(s) - lse(t), and d(T^2 KL)/d student = T (q - p).
    The same numbers as ``kl_sum`` + autograd up to fp32 round-off, in a few passes over the (n, V) logits instead
    of a dozen (the loss's elementwise work was as costly as the LM head's matmuls)."""
    s, t = student_logits.float().div_(temperature), teacher_logits.float().div_(temperature)  # n,V
    lse_s, lse_t = torch.logsumexp(s, dim=-1, keepdim=True), torch.logsumexp(t, dim=-1, keepdim=True)  # n,1
    p = torch.sub(t, lse_t).exp_()  # n,V: softmax(t)
    kl = (row_dot(p, t) - row_dot(p, s)).sum() + (lse_s - lse_t).sum()
    grad = s.sub_(lse_s).exp_().sub_(p).mul_(temperature)  # n,V: T (q - p), in the student's buffer
    return kl * (temperature * temperature), grad


def grad_through_head(g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``g @ w`` for the fp32 logit gradients ``g`` (n, V) and the frozen head ``w`` (V, H): in fp32 for an fp32 head;
    for a bf16 or fp16 head in its dtype (fp32 accumulation inside the product), as autocast computes a linear layer's
    backward, and as the trainer's autocast did when it recast an fp32 copy of the head: that copy (2.1 GB for
    Llama-3.1-8B) is no longer made."""
    return g @ w if w.dtype == torch.float32 else g.to(w.dtype) @ w


class HeadKL(torch.autograd.Function):
    """``distill_kl``: the loss and its gradient with respect to the student's hidden states, chunk by chunk, in
    closed form (``kl_and_grad``); the backward pass hands back the stored gradient."""

    @staticmethod
    def forward(ctx, hidden, teacher_hidden, weight, bias, temperature: float, chunk_size: int):
        grad = torch.empty_like(hidden)  # N,H
        total = hidden.new_zeros((), dtype=torch.float32)
        w = weight.detach()
        b = None if bias is None else bias.detach()
        for start in range(0, hidden.shape[0], chunk_size):
            stop = start + chunk_size
            s = F.linear(hidden[start:stop].detach(), w, b)  # n,V
            t = F.linear(teacher_hidden[start:stop].detach(), w, b)  # n,V
            loss, g = kl_and_grad(s, t, temperature)
            grad[start:stop] = grad_through_head(g, w).to(grad.dtype)  # n,H, in fp32
            total += loss
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad * grad_output.to(grad.dtype), None, None, None, None, None


def distill_kl(student_hidden, teacher_hidden, head, temperature: float = 2.0, chunk_size: int = 1024):
    """Summed T^2-scaled KL(teacher || student) over the N positions given (both (N, H), teacher detached)."""
    if head.weight.requires_grad:
        raise ValueError("distill_kl needs a frozen head (its weight gets no gradient)")
    if getattr(head, "vocab_parallel", False):  # FSDP: the head split by vocabulary over the ranks
        from swiftkv.distill.vocab import sharded_kl

        return sharded_kl(student_hidden, teacher_hidden, head, temperature, chunk_size)
    return HeadKL.apply(student_hidden, teacher_hidden.detach(), head.weight, head.bias, temperature, chunk_size)


def distill_kl_autograd(student_hidden, teacher_hidden, head, temperature: float = 2.0, chunk_size: int = 1024):
    """``distill_kl`` through autograd on ``kl_sum`` (``HeadLoss``): the trainer's loss before the closed form, kept
    as its reference (tests) and as the loss of the "shared_prefix" step of ``swiftkv bench distill``."""
    if getattr(head, "vocab_parallel", False):
        raise ValueError("distill_kl_autograd needs the whole head; distill_kl takes a vocabulary-sharded one")

    def fn(logits, targets):
        (teacher,) = targets
        with torch.no_grad():
            teacher_logits = head(teacher)  # n,V
        return kl_sum(logits, teacher_logits, temperature)

    return head_loss(student_hidden, head, fn, teacher_hidden.detach(), chunk_size=chunk_size)


def lm_cross_entropy(student_hidden, labels, head, chunk_size: int = 1024):
    """Summed cross-entropy of the ground-truth next tokens ``labels`` (N,) at the N positions given."""
    if getattr(head, "vocab_parallel", False):  # FSDP: the head split by vocabulary over the ranks
        from swiftkv.distill.vocab import sharded_cross_entropy

        return sharded_cross_entropy(student_hidden, labels, head, chunk_size)

    def fn(logits, targets):
        (target,) = targets
        return F.cross_entropy(logits.float(), target, reduction="sum")

    return head_loss(student_hidden, head, fn, labels, chunk_size=chunk_size)


@torch.no_grad()
def eval_metrics(student_hidden, teacher_hidden, labels, head, chunk_size: int = 1024) -> dict[str, float]:
    """Sums over positions: KL(teacher || student) at T = 1 (nats), top-1 agreement (student's argmax = teacher's),
    and both models' NLL of the next token where ``labels`` has one (labels < 0 are skipped); counts included so
    that sums from several batches can be pooled."""
    if getattr(head, "vocab_parallel", False):  # FSDP: the head split by vocabulary over the ranks
        from swiftkv.distill.vocab import sharded_metrics

        return sharded_metrics(student_hidden, teacher_hidden, labels, head, chunk_size)
    out = {"kl_sum": 0.0, "top1_sum": 0, "positions": 0, "student_nll_sum": 0.0, "teacher_nll_sum": 0.0,
           "labelled": 0}
    for start in range(0, student_hidden.shape[0], chunk_size):
        s = head(student_hidden[start:start + chunk_size]).float()
        t = head(teacher_hidden[start:start + chunk_size]).float()
        y = labels[start:start + chunk_size]
        out["kl_sum"] += float(kl_sum(s, t, 1.0))
        out["top1_sum"] += int((s.argmax(-1) == t.argmax(-1)).sum())
        out["positions"] += s.shape[0]
        keep = y >= 0
        if keep.any():
            out["student_nll_sum"] += float(F.cross_entropy(s[keep], y[keep], reduction="sum"))
            out["teacher_nll_sum"] += float(F.cross_entropy(t[keep], y[keep], reduction="sum"))
            out["labelled"] += int(keep.sum())
    return out
