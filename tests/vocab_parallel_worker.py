"""One rank of tests/test_vocab_parallel.py (run under torchrun): the vocabulary-sharded embedding and losses of
``swiftkv.distill.vocab`` against the whole-vocabulary ones, on rows of unequal count per rank (one rank may have
none) and a vocabulary that does not split evenly. Writes ``rank-<r>.json``: the largest difference of each
quantity."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def main(out: Path, rows: list[int]) -> None:
    from swiftkv.distill.losses import distill_kl, eval_metrics, lm_cross_entropy
    from swiftkv.distill.vocab import ShardedEmbedding, ShardedHead, gather_slices, scatter_slices, vocab_bounds

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same whole tensors on every rank; each rank takes its rows
    vocab, width, total = 37, 8, sum(rows)
    weight = torch.randn(vocab, width)
    student, teacher = torch.randn(total, width), torch.randn(total, width)
    labels = torch.randint(0, vocab, (total,))
    labels[::4] = -100  # positions without a next token (metrics skip them)
    ids = torch.randint(0, vocab, (total,))
    first = sum(rows[:rank])
    mine = slice(first, first + rows[rank])
    whole = nn.Linear(width, vocab, bias=False).requires_grad_(False)
    whole.weight.copy_(weight)
    start, stop = vocab_bounds(vocab, world, rank)
    part = nn.Parameter(weight[start:stop].clone(), requires_grad=False)
    head, emb = ShardedHead(part, vocab, rank, world), ShardedEmbedding(part, vocab, rank, world)
    diff = {}

    def compare(name, got, want):
        diff[name] = float((torch.as_tensor(got, dtype=torch.float64) - torch.as_tensor(want, dtype=torch.float64))
                           .abs().max()) if torch.as_tensor(want).numel() else 0.0

    for temperature in (1.0, 2.0):
        h_ref = student[mine].clone().requires_grad_(True)
        ref = distill_kl(h_ref, teacher[mine], whole, temperature, chunk_size=3)
        ref.backward()
        h = student[mine].clone().requires_grad_(True)
        got = distill_kl(h, teacher[mine], head, temperature, chunk_size=3)
        got.backward()
        compare(f"kl_T{temperature:g}", got.detach(), ref.detach())
        compare(f"kl_grad_T{temperature:g}", h.grad, h_ref.grad)
    keep = labels[mine] >= 0
    h_ref = student[mine][keep].clone().requires_grad_(True)
    ref = lm_cross_entropy(h_ref, labels[mine][keep], whole, chunk_size=3)
    ref.backward()
    h = student[mine][keep].clone().requires_grad_(True)
    got = lm_cross_entropy(h, labels[mine][keep], head, chunk_size=3)
    got.backward()
    compare("cross_entropy", got.detach(), ref.detach())
    compare("cross_entropy_grad", h.grad, h_ref.grad)
    teacher_close = student + 1e-3 * teacher  # top-1 mostly agrees, so the argmax across slices is tested both ways
    for name, t in (("metrics", teacher), ("metrics_close", teacher_close)):
        ref = eval_metrics(student[mine], t[mine], labels[mine], whole, chunk_size=3)
        got = eval_metrics(student[mine], t[mine], labels[mine], head, chunk_size=3)
        for key in ref:
            compare(f"{name}_{key}", got[key], ref[key])
    from swiftkv.distill import vocab as module

    with torch.no_grad():
        compare("embedding", emb(ids[mine].reshape(1, -1)), nn.functional.embedding(ids[mine], weight)[None])
        module.EMBED_CHUNK = 2  # one row per rank and chunk: as many lookups as the longest rank has rows
        compare("embedding_chunked", emb(ids[mine].reshape(1, -1)), nn.functional.embedding(ids[mine], weight)[None])
    compare("gathered", gather_slices(part, head), weight)
    empty = ShardedHead(nn.Parameter(torch.zeros_like(part), requires_grad=False), vocab, rank, world)
    scatter_slices(weight if rank == 0 else None, empty)
    compare("scattered", empty.weight, part)
    (out / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "world": world, "diff": diff}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]))
