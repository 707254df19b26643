"""swiftkv.measure.shared_rows: a packed forward that runs each distinct position once (attention gathered per row)
gives every column the output the rows' own forward gives it, and the scorer's log-likelihoods do not change."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from swiftkv.measure.lm import SwiftKVLM
from swiftkv.measure.prefix_tree import PrefixTree, plan_rows, row_arrays
from swiftkv.measure.shared_rows import (ATTENTION_NAME, query_blocks, shared_layout, shared_rows,
                                         shared_rows_attention)
from tests.conftest import TINY, tiny_base
from tests.test_evaluate import tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def header_tree(header: int = 10, question: int = 5):
    """Eight questions behind one header, three choices each (two share a first token); the scored nodes."""
    tree, scored = PrefixTree(), set()
    for q in range(8):
        end = tree.insert(list(range(2, 2 + header)) + [12 + (question * q + k) % 70 for k in range(question)])[-1]
        for choice in ([90], [91, 92], [91, 93]):
            scored.update([end] + tree.insert(choice[:-1], end))
    return tree, scored


def forwards_with_copies(header: int = 10, question: int = 5):
    """Rows of two questions, two rows a forward: the header is in both rows of a forward."""
    tree, scored = header_tree(header, question)
    width = 2 * (question + 1) + header
    forwards = list(plan_rows(tree, scored, width=width, max_positions=2 * width, score_budget=1000,
                              attention_cost=1 / 3456))
    assert all(len(rows) == 2 for rows in forwards[:-1])
    return tree, scored, forwards


SHAPES = [(10, 5), (2, 12)]  # (header, question) lengths


@pytest.mark.parametrize("header,question", SHAPES)
def test_the_layout_holds_each_distinct_node_once_at_its_scored_column(header, question):
    tree, scored, forwards = forwards_with_copies(header, question)
    for rows in forwards:
        ids, positions, _ = row_arrays(tree, rows)
        width = ids.shape[1]
        gather, source = shared_layout(rows, width)
        source = source.tolist()
        distinct = {n for row in rows for n in row.nodes}
        assert len(source) == len(distinct) and source == sorted(source)
        assert len(source) < sum(len(row.nodes) for row in rows) or len(rows) == 1  # the header once, not per row
        node_at = [rows[p // width].nodes[p % width] for p in source]  # the node of each of the U positions
        assert set(node_at) == distinct
        for r, row in enumerate(rows):
            assert [node_at[u] for u in gather[r, :len(row.nodes)]] == row.nodes
            for col in row.scored:  # a scored node runs where it is scored, so kept logits keep their order
                assert source[gather[r, col]] == r * width + col
        kept = [r * width + col for r, row in enumerate(rows) for col in row.scored]
        assert [p for p in source if p in set(kept)] == kept


@pytest.mark.parametrize("header,question", SHAPES)
def test_query_blocks_leave_out_only_keys_that_no_query_of_the_block_sees(header, question):
    tree, _, forwards = forwards_with_copies(header, question)
    for rows in forwards:
        mask = row_arrays(tree, rows)[2]
        width = mask.shape[-1]
        for block in (1, 4, 7, width):
            blocks = query_blocks(mask, block)
            assert [b[0] for b in blocks] == list(range(0, width, block)) and blocks[-1][1] == width
            for start, stop, keys in blocks:
                assert stop - start <= block and np.all(np.diff(keys) > 0) and keys[-1] < stop  # ancestors first
                part = mask[:, 0, start:stop]
                left_out = np.setdiff1d(np.arange(width), keys)
                assert not part[..., left_out].any()  # no query of the block sees a key left out
                assert part[..., keys].any(axis=(0, 1)).all()  # and every key kept is seen by one
        work = sum(len(keys) * (stop - start) for start, stop, keys in query_blocks(mask, 4))
        assert work < 0.75 * width ** 2


@pytest.mark.parametrize("header,question", SHAPES)
@pytest.mark.parametrize("family", ["llama", "qwen3", "deepseek_v2"])
@pytest.mark.parametrize("block,folded", [(None, True), (4, True), (4, False)])
@torch.no_grad()
def test_a_shared_forward_gives_every_column_the_rows_output(family, header, question, block, folded, monkeypatch):
    """Hidden states of the last layer (all layers, norms, MLP/MoE) of one (1, U) forward under ``shared_rows`` equal
    the (R, W) forward's at every non-padding column, with the queries in one block or in blocks of 4 (grouped
    key/value heads: llama and qwen3 share each key/value head between two query heads; deepseek_v2's values are
    narrower than its keys; a scaling that is not head_dim ** -0.5, as Gemma 3's); the model's attention setting is
    back afterwards. Blocks run the folded matmuls (a CPU's) or sdpa (other devices')."""
    if not folded:
        monkeypatch.setattr("swiftkv.measure.shared_rows.FOLDED_DEVICES", ())
    model = tiny_base(family)
    for layer in model.model.layers:
        layer.self_attn.scaling = 0.3
    tree, _, forwards = forwards_with_copies(header, question)
    for rows in forwards:
        ids, positions, mask = (torch.from_numpy(a) for a in row_arrays(tree, rows))
        want = model.model(input_ids=ids, position_ids=positions, attention_mask=mask).last_hidden_state
        gather, source = (torch.from_numpy(a) for a in shared_layout(rows, ids.shape[1]))
        blocks = None if block is None else query_blocks(mask.numpy(), block)
        # several blocks, some of them with keys that are not one run of columns (a gap: another question)
        assert blocks is None or len(blocks) > 1 and any(keys[-1] + 1 - keys[0] > len(keys) for _, _, keys in blocks)
        with shared_rows(model, gather, source, blocks):
            assert model.config._attn_implementation == ATTENTION_NAME
            got = model.model(input_ids=ids.reshape(1, -1)[:, source], attention_mask=mask,
                              position_ids=positions.reshape(1, -1)[:, source]).last_hidden_state
        assert model.config._attn_implementation == "sdpa"
        for r, row in enumerate(rows):
            n = len(row.nodes)
            assert_close(got[0, gather[r, :n]], want[r, :n], rtol=1e-5, atol=1e-5)


def test_the_attention_runs_only_inside_the_block_and_the_setting_comes_back_on_errors():
    model = tiny_base()
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="only inside"):
        shared_rows_attention(model.model.layers[0].self_attn, q, q, q, None)
    with pytest.raises(ValueError), shared_rows(model, torch.zeros(1, 3, dtype=torch.long), torch.arange(3)):
        raise ValueError
    assert model.config._attn_implementation == "sdpa"


@torch.no_grad()
def test_the_scorer_with_shared_rows_runs_fewer_positions_for_the_same_log_likelihoods(monkeypatch):
    """Questions behind a shared instruction, packed several rows a forward: the scorer with shared rows runs each
    header position once a forward instead of once a row (its attention a block of queries at a time), and every
    (log-likelihood, greedy) is the rows' own."""
    monkeypatch.setattr("swiftkv.measure.lm.PACK_WIDTH", 24)
    monkeypatch.setattr("swiftkv.measure.shared_rows.QUERY_BLOCK", 5)  # several query blocks a row
    model = tiny_base("qwen2")
    gen = torch.Generator().manual_seed(4)
    header = torch.randint(2, TINY["vocab_size"], (10,), generator=gen).tolist()
    reqs = []
    for _ in range(10):
        ctx = header + torch.randint(2, TINY["vocab_size"], (5,), generator=gen).tolist()
        reqs += [(None, ctx, torch.randint(2, TINY["vocab_size"], (n,), generator=gen).tolist()) for n in (1, 2, 3)]
    runs = {}
    for share in (False, True):
        lm = SwiftKVLM(model, tokenizer=tiny_tokenizer(), max_length=40, device="cpu", positions_per_forward=72)
        lm.share_rows = share
        runs[share] = lm, lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    (rows_lm, want), (shared_lm, got) = runs[False], runs[True]
    assert shared_lm.forwards == rows_lm.forwards
    assert sum(shared_lm.tokens_run.values()) < sum(rows_lm.tokens_run.values())
    assert shared_lm.tokens_run["continuation"] == rows_lm.tokens_run["continuation"]
    assert_close(torch.tensor([g[0] for g in got]), torch.tensor([w[0] for w in want]), rtol=1e-5, atol=1e-5)
    assert [g[1] for g in got] == [w[1] for w in want]
