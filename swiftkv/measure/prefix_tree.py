"""The packed scorer's layout: log-likelihood requests as one prefix tree, cut into rows of packed forwards.

Every request (context, continuation) asks for the positions ``context + continuation[:-1]``; a position's output
depends only on its own token and the tokens before it. So requests that share a beginning share those positions:
the choices of a question share its context, and the questions of a task share its instructions ("The following are
questions ... about anatomy.\\n\\nQuestion:"). ``PrefixTree`` holds each distinct prefix once (a node per position);
``plan_rows`` cuts it into rows that a forward runs with a 4D mask where a node sees exactly its ancestors.

A row holds whole subtrees ("units") and the ancestors they need, each node once. A unit is a subtree of at most
``width`` nodes, or a larger one whose ancestors are too long to copy into one row per ``width`` nodes: the extra
attention of a wider row (its cost grows with the row's width) is weighed against the copies of the ancestors. Units
go, siblings together and largest first, first-fit into the rows of the current forward, so that rows share their
ancestors (a short lookahead fills room that would be padding); a node that two rows need is run in both (at the same
position, with the same result) and scored where it first ran.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np


class PrefixTree:
    """Token sequences as a tree: node 0 is the root (no position); every other node is one position, its token at
    position ``depth - 1`` after its ancestors. Children are created after their parents (node ids grow downwards)."""

    def __init__(self):
        self.token: list[int] = [-1]
        self.parent: list[int] = [-1]
        self.depth: list[int] = [0]
        self.children: list[dict[int, int]] = [{}]

    def __len__(self) -> int:
        return len(self.token)

    def insert(self, tokens, node: int = 0) -> list[int]:
        """The node of each position of ``tokens`` after ``node`` (default: from the root), created where missing."""
        path = []
        for t in tokens:
            child = self.children[node].get(t)
            if child is None:
                child = len(self.token)
                self.token.append(int(t))
                self.parent.append(node)
                self.depth.append(self.depth[node] + 1)
                self.children.append({})
                self.children[node][t] = child
            node = child
            path.append(node)
        return path

    def sizes(self) -> list[int]:
        """Nodes in each node's subtree, itself included (the root's: every position)."""
        size = [1] * len(self.token)
        size[0] = 0
        for node in range(len(self.token) - 1, 0, -1):
            size[self.parent[node]] += size[node]
        return size

    def ancestors(self, node: int) -> list[int]:
        """The node's ancestors, root's child first (the root itself excluded)."""
        out = []
        node = self.parent[node]
        while node > 0:
            out.append(node)
            node = self.parent[node]
        return out[::-1]

    def subtree(self, node: int) -> list[int]:
        """The node and its descendants in depth-first order (every parent before its children)."""
        out, stack = [], [node]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(reversed(list(self.children[n].values())))
        return out


def units(tree: PrefixTree, size: list[int], width: int, max_positions: int, attention_cost: float) -> list[int]:
    """The subtrees that rows are made of, siblings together (largest first), in depth-first order of their parents.
    A node's subtree is a unit when it has at most ``width`` nodes, or when it fits one forward and copying its
    ancestors into each extra row of ``width`` would cost more positions than the row's extra width costs in attention
    (``attention_cost``: a position's attention per key, relative to the rest of its forward)."""

    def is_unit(node: int) -> bool:
        ancestors, n = tree.depth[node] - 1, size[node]
        row = ancestors + n
        copies = ancestors * (math.ceil(n / width) - 1)
        return n <= width or (row <= max_positions and copies > attention_cost * row * (row - width))

    out, stack = [], [0]
    while stack:
        node = stack.pop()
        children = list(tree.children[node].values())
        unit = {c: is_unit(c) for c in children}
        # siblings that are units, largest first (first-fit decreasing: fuller rows), then the others' units
        out.extend(sorted((c for c in children if unit[c]), key=lambda c: -size[c]))
        stack.extend(reversed([c for c in children if not unit[c]]))
    return out


@dataclass
class Row:
    nodes: list[int] = field(default_factory=list)
    where: dict[int, int] = field(default_factory=dict)  # node -> column
    scored: list[int] = field(default_factory=list)  # columns whose logits are kept (a scored node's first run)

    def missing(self, nodes) -> list[int]:
        return [n for n in nodes if n not in self.where]

    def add(self, nodes, first_runs: set[int], scored: set[int]) -> None:
        for n in nodes:
            self.where[n] = len(self.nodes)
            if n in scored and n not in first_runs:
                first_runs.add(n)
                self.scored.append(len(self.nodes))
            self.nodes.append(n)


LOOKAHEAD = 64  # units past the first that may fill a forward's room before it is closed


def plan_rows(tree: PrefixTree, scored: set[int], *, width: int, max_positions: int, score_budget: int,
              attention_cost: float):
    """Forwards as lists of ``Row``: at most ``max_positions`` positions (rows x the widest row) unless one unit with
    its ancestors is wider, at most ``score_budget`` kept logits (rows x the most scored columns of a row), every
    node of ``scored`` kept exactly once, in the first row that runs it. Units go in order, first-fit into the
    forward's rows (or a new row); when the next one fits nowhere, one of the following ``LOOKAHEAD`` that fits is
    placed instead (the room would be padding otherwise), and the forward closes when none does."""
    size = tree.sizes()
    first_runs: set[int] = set()
    pending = units(tree, size, width, max_positions, attention_cost)
    parts: dict[int, tuple[list[int], list[int], int]] = {}  # unit -> (ancestors, subtree, scored nodes in it)
    rows: list[Row] = []
    row_width = 0

    def part(unit: int):
        if unit not in parts:
            body = tree.subtree(unit)
            parts[unit] = (tree.ancestors(unit), body, sum(1 for n in body if n in scored))
        return parts[unit]

    def place(unit: int) -> bool:
        nonlocal row_width
        ancestors, body, new_scores = part(unit)

        def fits(row: Row) -> bool:
            add = row.missing(ancestors)
            extra = sum(1 for n in add if n in scored and n not in first_runs)
            return (len(row.nodes) + len(add) + len(body) <= row_width
                    and (len(row.scored) + extra + new_scores) * len(rows) <= score_budget)

        row = next((r for r in rows if fits(r)), None)
        if row is None:
            need = len(ancestors) + len(body)
            widest_scores = max([len(r.scored) for r in rows] + [new_scores + len(ancestors)])
            if rows and ((len(rows) + 1) * row_width > max_positions or need > row_width
                         or (len(rows) + 1) * widest_scores > score_budget):
                return False
            if not rows:
                row_width = max(need, min(width, max_positions))
            row = Row()
            rows.append(row)
        row.add(row.missing(ancestors), first_runs, scored)
        row.add(body, first_runs, scored)
        return True

    while pending:
        k = next((k for k in range(min(LOOKAHEAD + 1, len(pending))) if place(pending[k])), None)
        if k is None:  # a fresh forward takes any unit: rows is not empty here
            yield rows
            rows = []
            continue
        parts.pop(pending[k], None)
        del pending[k]
    if rows:
        yield rows


def row_arrays(tree: PrefixTree, rows: list[Row]):
    """(ids, positions, mask) of one forward: (R, W) token ids and positions, and the (R, 1, W, W) boolean mask, True
    where a column's node is the query's node or one of its ancestors. Padding columns see only themselves."""
    width = max(len(r.nodes) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int64)
    positions = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros((len(rows), 1, width, width), dtype=bool)
    for r, row in enumerate(rows):
        for col, node in enumerate(row.nodes):
            ids[r, col] = tree.token[node]
            positions[r, col] = tree.depth[node] - 1
            parent = row.where.get(tree.parent[node])
            if parent is not None:  # parents come before their children in a row
                mask[r, 0, col] = mask[r, 0, parent]
            mask[r, 0, col, col] = True
        for col in range(len(row.nodes), width):
            mask[r, 0, col, col] = True
    return ids, positions, mask


def row_key(tree: PrefixTree, row: Row) -> str:
    """A row's identity: its tokens, positions and each column's parent column, in order (what decides every
    column's output in any model)."""
    digest = hashlib.blake2b(digest_size=16)
    parents = [row.where.get(tree.parent[n], -1) for n in row.nodes]
    digest.update(np.asarray([[tree.token[n] for n in row.nodes], [tree.depth[n] for n in row.nodes], parents],
                             dtype=np.int64).tobytes())
    return digest.hexdigest()
