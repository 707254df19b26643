"""The embedding and the LM head split by vocabulary over the ranks of an FSDP run.

Under FSDP2 the embedding and the LM head sit in the root unit, which stays gathered from the forward pass until the
end of the backward pass (the loss reads the head after the forward); for a small model that is a large part of the
peak (Llama-3.2-1B: a tied 128256 x 2048 matrix, a fifth of the weights, 1 GiB in fp32, held twice while it is
gathered). Both are frozen in every SwiftKV scope, so ``shard_vocabulary`` takes them out of FSDP (its
``ignored_params``) and keeps on rank r only rows [r * ceil(V/W), (r + 1) * ceil(V/W)) of each, as plain tensors:

- the embedding (``ShardedEmbedding``): the ranks' token ids are gathered, each rank looks up the ids it holds (zeros
  for the others) and the results are summed over the ranks (one rank holds each id, so the sum is exact);
- the losses (``sharded_kl``, ``sharded_cross_entropy``, ``sharded_metrics``): the ranks' final hidden states are
  gathered a chunk of positions at a time (``chunks``: at most ``chunk_size`` rows over all ranks, so the memory
  does not grow with the ranks), each rank computes the logits of its vocabulary slice for those positions, the
  log-sum-exp over the whole vocabulary from each slice's max and sum (all-reduced), the loss per position and its
  gradient with respect to the hidden states from its slice, summed over the ranks; each rank keeps its own
  positions. The same numbers as the one-process losses up to fp32 summation order (tests/test_vocab_parallel.py).

Nothing here trains: the embedding and the head get no gradient, so no gradient is reduced for them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from swiftkv.distill.losses import grad_through_head, row_dot


def vocab_bounds(vocab: int, world: int, rank: int) -> tuple[int, int]:
    """Rows [start, stop) of a vocabulary of ``vocab`` entries that rank ``rank`` of ``world`` holds."""
    per = -(-vocab // world)
    start = min(rank * per, vocab)
    return start, min(start + per, vocab)


class _Sliced(nn.Module):
    """This rank's rows [start, stop) of a frozen (V, H) weight."""

    vocab_parallel = True

    def __init__(self, weight: nn.Parameter, vocab: int, rank: int, world: int):
        super().__init__()
        self.weight, self.vocab, self.rank, self.world = weight, vocab, rank, world
        self.start, self.stop = vocab_bounds(vocab, world, rank)

    def extra_repr(self) -> str:
        return f"rows [{self.start}, {self.stop}) of {self.vocab}, rank {self.rank} of {self.world}"


class ShardedEmbedding(_Sliced):
    """An embedding lookup from the ranks' vocabulary slices (a collective: every rank calls it as often)."""

    def __init__(self, weight, vocab, rank, world, scale: torch.Tensor | None = None):
        super().__init__(weight, vocab, rank, world)
        self.register_buffer("embed_scale", scale, persistent=False)  # Gemma's sqrt(hidden) scale (or None)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.weight.requires_grad:
            raise RuntimeError("a vocabulary-sharded embedding is frozen: it has no gradient")
        flat = input_ids.reshape(-1, 1)
        out = self.weight.new_empty((flat.shape[0], self.weight.shape[-1]))
        for a, rows in chunks(flat.shape[0], EMBED_CHUNK, flat.device):
            ids = rows.gather(flat[a:a + rows.mine_count]).reshape(-1)  # every rank's ids of this chunk
            local = ids - self.start
            hit = (local >= 0) & (local < self.stop - self.start)
            part = F.embedding(local.clamp(0, max(self.stop - self.start - 1, 0)), self.weight) * hit[:, None]
            dist.all_reduce(part)  # one rank holds each id: the sum is its row
            out[a:a + rows.mine_count] = rows.mine(part)
        out = out.reshape(*input_ids.shape, self.weight.shape[-1])
        return out if self.embed_scale is None else out * self.embed_scale.to(out.dtype)


class ShardedHead(_Sliced):
    """The LM head's vocabulary slice; only the sharded losses apply it. ``tied``: the same slice as the embedding's
    (``tie_slices`` ties them again after ``to_empty``, which gives each module its own tensor)."""

    def __init__(self, weight, vocab, rank, world, tied: bool = False):
        super().__init__(weight, vocab, rank, world)
        self.tied = tied

    def forward(self, hidden):
        raise RuntimeError("a vocabulary-sharded LM head has no logits of its own; the losses of "
                           "swiftkv.distill.vocab apply it")

    def local_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, stop - start) fp32 logits of this rank's vocabulary slice."""
        return F.linear(hidden, self.weight).float()


EMBED_CHUNK = 8192  # positions per rank gathered at once for the embedding lookup


class Rows:
    """One chunk of positions: ``sizes[r]`` rows from rank r, gathered in rank order; this rank's part of it."""

    def __init__(self, sizes: list[int], rank: int):
        self.sizes, self.total = sizes, sum(sizes)
        self.start = sum(sizes[:rank])
        self.mine_count = sizes[rank]

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's (sizes[r], ...) rows ``x``, concatenated in rank order."""
        width = max(self.sizes)
        padded = x.new_zeros((width, *x.shape[1:]))
        padded[:x.shape[0]] = x
        parts = [torch.empty_like(padded) for _ in self.sizes]
        dist.all_gather(parts, padded)
        return torch.cat([p[:n] for p, n in zip(parts, self.sizes)])

    def mine(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.start:self.start + self.mine_count]


def chunks(n: int, positions: int, device: torch.device):
    """(first local row, Rows) of every chunk of the ranks' positions, as many on every rank: chunk c holds rows
    [c * k, (c + 1) * k) of each rank's n_r (k = positions / world), so at most ``positions`` rows are gathered at
    once whatever the ranks and their row counts."""
    world, rank = dist.get_world_size(), dist.get_rank()
    counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([n], device=device))
    counts = [int(c) for c in counts]
    per = max(1, positions // world)
    for a in range(0, max(counts), per):
        yield a, Rows([min(max(c - a, 0), per) for c in counts], rank)


def _lse(x: torch.Tensor) -> torch.Tensor:
    """(n, 1) log-sum-exp over the whole vocabulary of the rows of the ranks' slices ``x`` (n, V_r)."""
    m = x.amax(-1, keepdim=True) if x.shape[-1] else x.new_full((x.shape[0], 1), float("-inf"))
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    s = (x - m).exp().sum(-1, keepdim=True)
    dist.all_reduce(s)
    return m + s.log()


def _picked(x: torch.Tensor, labels: torch.Tensor, head: _Sliced) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's value at its label (summed over the ranks: one holds it), and where this rank holds the label."""
    local = labels - head.start
    hit = (local >= 0) & (local < head.stop - head.start)
    rows = hit.nonzero().squeeze(-1)
    value = x.new_zeros(x.shape[0])
    value[rows] = x[rows, local[rows]]
    dist.all_reduce(value)
    return value, rows, local[rows]


def _kl_rows(s: torch.Tensor, t: torch.Tensor, lse_s: torch.Tensor, lse_t: torch.Tensor):
    """Each row's KL(softmax(t) || softmax(s)) over the whole vocabulary, from the ranks' slices of the logits and the
    whole log-sum-exps (the slices' shares of sum p (t - s) all-reduced); and softmax(t) on this rank's slice."""
    p = torch.sub(t, lse_t).exp_()
    part = row_dot(p, t) - row_dot(p, s)
    dist.all_reduce(part)
    return part + (lse_s - lse_t).squeeze(-1), p


class ShardedKL(torch.autograd.Function):
    """``losses.HeadKL`` over vocabulary slices: this rank's summed T^2 KL(teacher || student), gradient stored."""

    @staticmethod
    def forward(ctx, hidden, teacher_hidden, head: ShardedHead, temperature: float, chunk_size: int):
        grad = torch.empty_like(hidden)
        total = hidden.new_zeros((), dtype=torch.float32)
        w = head.weight.detach()
        for a, rows in chunks(hidden.shape[0], chunk_size, hidden.device):
            mine = slice(a, a + rows.mine_count)
            s = head.local_logits(rows.gather(hidden[mine].detach())).div_(temperature)  # n,V_r
            t = head.local_logits(rows.gather(teacher_hidden[mine].detach())).div_(temperature)
            lse_s, lse_t = _lse(s), _lse(t)
            kl, p = _kl_rows(s, t, lse_s, lse_t)
            g = grad_through_head(s.sub_(lse_s).exp_().sub_(p).mul_(temperature), w).float()  # n,H: slice's share
            dist.all_reduce(g)
            total += rows.mine(kl).sum()
            grad[mine] = rows.mine(g).to(grad.dtype)
        ctx.save_for_backward(grad)
        return total * (temperature * temperature)

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad * grad_output.to(grad.dtype), None, None, None, None


class ShardedCrossEntropy(torch.autograd.Function):
    """This rank's summed cross-entropy of ``labels`` over vocabulary slices, gradient stored."""

    @staticmethod
    def forward(ctx, hidden, labels, head: ShardedHead, chunk_size: int):
        grad = torch.empty_like(hidden)
        total = hidden.new_zeros((), dtype=torch.float32)
        w = head.weight.detach()
        for a, rows in chunks(hidden.shape[0], chunk_size, hidden.device):
            mine = slice(a, a + rows.mine_count)
            s = head.local_logits(rows.gather(hidden[mine].detach()))
            lse = _lse(s)
            picked, hit, local = _picked(s, rows.gather(labels[mine].reshape(-1, 1)).reshape(-1), head)
            q = s.sub_(lse).exp_()  # softmax on this slice
            q[hit, local] -= 1.0
            g = grad_through_head(q, w).float()
            dist.all_reduce(g)
            total += rows.mine(lse.squeeze(-1) - picked).sum()
            grad[mine] = rows.mine(g).to(grad.dtype)
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad * grad_output.to(grad.dtype), None, None, None


def sharded_kl(student_hidden, teacher_hidden, head: ShardedHead, temperature: float, chunk_size: int):
    return ShardedKL.apply(student_hidden, teacher_hidden.detach(), head, temperature, chunk_size)


def sharded_cross_entropy(student_hidden, labels, head: ShardedHead, chunk_size: int):
    return ShardedCrossEntropy.apply(student_hidden, labels, head, chunk_size)


def _argmax(x: torch.Tensor, head: _Sliced) -> torch.Tensor:
    """Each row's argmax over the whole vocabulary (the first of equal maxima, as ``torch.argmax``)."""
    value, index = x.max(-1)
    values = [torch.empty_like(value) for _ in range(head.world)]
    indices = [torch.empty_like(index) for _ in range(head.world)]
    dist.all_gather(values, value.contiguous())
    dist.all_gather(indices, (index + head.start).contiguous())
    best = torch.stack(values).argmax(0)  # the lowest rank among equal maxima holds the lowest index
    return torch.stack(indices).gather(0, best[None]).squeeze(0)


@torch.no_grad()
def sharded_metrics(student_hidden, teacher_hidden, labels, head: ShardedHead, chunk_size: int) -> dict:
    """``losses.eval_metrics`` over vocabulary slices: this rank's sums (KL at T = 1, top-1, both NLLs)."""
    out = {"kl_sum": 0.0, "top1_sum": 0, "positions": student_hidden.shape[0], "student_nll_sum": 0.0,
           "teacher_nll_sum": 0.0, "labelled": int((labels >= 0).sum())}
    for a, rows in chunks(student_hidden.shape[0], chunk_size, student_hidden.device):
        mine = slice(a, a + rows.mine_count)
        s = head.local_logits(rows.gather(student_hidden[mine]))
        t = head.local_logits(rows.gather(teacher_hidden[mine]))
        y = rows.gather(labels[mine].reshape(-1, 1)).reshape(-1)
        lse_s, lse_t = _lse(s), _lse(t)
        out["top1_sum"] += int(rows.mine(_argmax(s, head) == _argmax(t, head)).sum())
        keep = rows.mine(y) >= 0
        for key, x, lse in (("student_nll_sum", s, lse_s), ("teacher_nll_sum", t, lse_t)):
            picked, _, _ = _picked(x, y, head)
            out[key] += float(rows.mine(lse.squeeze(-1) - picked)[keep].sum())
        out["kl_sum"] += float(rows.mine(_kl_rows(s, t, lse_s, lse_t)[0]).sum())
    return out


def shard_vocabulary(model: nn.Module, device: torch.device) -> set[nn.Parameter]:
    """Replace ``model``'s embedding and LM head by this rank's vocabulary slices of them (one shared slice when they
    are tied), on ``device``; returns the new parameters, for ``fully_shard(..., ignored_params=...)``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if emb.weight.requires_grad or head.weight.requires_grad or getattr(head, "bias", None) is not None:
        raise RuntimeError("vocabulary sharding needs a frozen embedding and a frozen LM head without bias")
    tied = head.weight is emb.weight
    vocab = emb.weight.shape[0]

    def sliced(weight: torch.Tensor) -> nn.Parameter:  # on meta where the model is (its ranks fill it from rank 0)
        start, stop = vocab_bounds(weight.shape[0], world, rank)
        part = weight.detach()[start:stop]
        return nn.Parameter(part if part.is_meta else part.to(device).clone(), requires_grad=False)

    w_emb = sliced(emb.weight)
    w_head = w_emb if tied else sliced(head.weight)
    scale = getattr(emb, "embed_scale", None)
    scale = scale if scale is None or scale.is_meta else scale.to(device)
    model.set_input_embeddings(ShardedEmbedding(w_emb, vocab, rank, world, scale))
    model.set_output_embeddings(ShardedHead(w_head, head.weight.shape[0], rank, world, tied))
    return {w_emb, w_head}


def tie_slices(model: nn.Module) -> None:
    """A tied head's slice is the embedding's again (after ``model.to_empty``, which unties them)."""
    head = model.get_output_embeddings()
    if isinstance(head, ShardedHead) and head.tied:
        head.weight = model.get_input_embeddings().weight


def sharded_parameters(model: nn.Module) -> dict[str, _Sliced]:
    """{parameter name: its module} of the vocabulary-sharded weights of ``model`` (empty when not sharded)."""
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, _Sliced):
            out.setdefault(f"{name}.weight" if name else "weight", module)
    return out


def gather_slices(weight: torch.Tensor, module: _Sliced) -> torch.Tensor:
    """The whole (V, H) weight from every rank's slice, on the CPU (a collective)."""
    per = -(-module.vocab // module.world)
    padded = weight.new_zeros((per, *weight.shape[1:]))
    padded[:weight.shape[0]] = weight.detach()
    parts = [torch.empty_like(padded) for _ in range(module.world)]
    dist.all_gather(parts, padded)
    return torch.cat(parts)[:module.vocab].cpu()


def scatter_slices(full: torch.Tensor | None, module: _Sliced) -> None:
    """Fill every rank's slice from rank 0's whole weight ``full`` (None on the other ranks)."""
    per = -(-module.vocab // module.world)
    parts = None
    if dist.get_rank() == 0:
        whole = full.to(module.weight.device, module.weight.dtype)
        parts = [whole.new_zeros((per, *whole.shape[1:])) for _ in range(module.world)]
        for r, chunk in enumerate(parts):
            start, stop = vocab_bounds(module.vocab, module.world, r)
            chunk[:stop - start] = whole[start:stop]
    out = module.weight.new_empty((per, *module.weight.shape[1:]))
    dist.scatter(out, parts, src=0)
    with torch.no_grad():
        module.weight.copy_(out[:module.stop - module.start])
