"""lm-eval's model for SwiftKV: an HFLM over an already-loaded (SwiftKV) model, scored the way SwiftKV serves.

``SwiftKVLM`` is lm-eval's ``HFLM`` with two changes, neither visible in the scores:

- **log-likelihoods with each shared prefix run once.** HFLM runs every (context, continuation) pair as one sequence
  and keeps the continuation's logits. We run each distinct context once and score all of its continuations against
  it, and ask the model only for the logits that are scored (a SwiftKV student then runs every other context position
  through layers < l only: the paper's prefill skip). Two scorers do this:

  * ``packed`` (the default): every request's positions go into one prefix tree (``swiftkv.measure.prefix_tree``),
    so what requests share (a question's context across its choices, a task's instructions across its questions,
    the first tokens of choices that begin alike) is one node; the tree is cut into rows of whole subtrees with
    their ancestors, packed into forwards with a 4D attention mask in which each position sees exactly its
    ancestors. Needs a dense-mask attention (sdpa, eager). A model that runs every position through every layer (a
    base model, a teacher) under sdpa runs a prefix that several rows of a forward hold once
    (``swiftkv.measure.shared_rows``: attention gathers each row from the distinct positions).
  * ``chunked``: a prefill of the contexts (left padded, ``logits_to_keep=1``), then the continuations as padded
    batches against a copy of each context's cache. Any attention kernel; the fallback for the packed one.

  Log-likelihoods equal a full forward's (tested on tiny random models of every family, teacher and student).
- **KV-cache variants**: ``kv_cache="fp8"`` runs every forward (and ``generate``) with an FP8 fake-quant cache
  (``swiftkv.models.kvquant``), for the paper's Table B.1.

Importing this module registers it with lm-eval as model ``swiftkv``, so
``python -m swiftkv.measure.harness --model swiftkv --model_args pretrained=<checkpoint> ...`` works too. Running a
suite and one model end to end is ``swiftkv.measure.evaluate``.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from contextlib import nullcontext

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from tqdm.auto import tqdm

import swiftkv  # noqa: F401  (registers the SwiftKV model types with transformers)
from swiftkv.errors import SwiftKVError
from swiftkv.measure.boundary import boundary_forward
from swiftkv.measure.head import final_hidden_states, scored_log_probs
from swiftkv.measure.prefix_tree import PrefixTree, plan_rows, row_arrays, row_key
from swiftkv.measure.shared_rows import query_blocks, shared_layout, shared_rows
from swiftkv.models.kvquant import make_cache_factory

logger = logging.getLogger(__name__)


def is_student(model) -> bool:
    return bool(getattr(model.config, "swiftkv", False)) and hasattr(model, "swiftkv")


@register_model("swiftkv")
class SwiftKVLM(HFLM):
    """lm-eval's HFLM that asks the model only for the logits it scores (prefill skip), optionally with an FP8 cache.

    ``pretrained`` may be a loaded model (pass ``tokenizer``) or anything ``HFLM`` accepts; SwiftKV checkpoints run
    as the student unless ``teacher=True``.
    """

    def __init__(self, pretrained, *, teacher: bool = False, kv_cache: str = "native", prefill_skip: bool = True,
                 logits_budget_bytes: float = 1.5e9, scorer: str = "packed", positions_per_forward: int = 1024,
                 boundary=None, boundary_recorder=None, **kwargs):
        kwargs.setdefault("backend", "causal")
        super().__init__(pretrained=pretrained, **kwargs)
        if hasattr(self.model, "swiftkv"):
            self.model.swiftkv(not _as_bool(teacher))
        self.kv_cache = kv_cache
        self._cache_factory = make_cache_factory(kv_cache)
        self.prefill_skip = _as_bool(prefill_skip)
        if is_student(self.model):
            self.model.model.prefill_skip = self.prefill_skip  # off: same logits, every position runs every layer
        self.logits_budget_bytes = logits_budget_bytes
        if scorer not in SCORERS:
            raise SwiftKVError(f"unknown scorer {scorer!r}; use one of {', '.join(SCORERS)}")
        self.scorer = scorer
        self.positions_per_forward = int(positions_per_forward)
        self.tokens_run = {"context": 0, "continuation": 0}  # positions run (for the log)
        self.forwards = 0  # model forwards run for log-likelihoods (for the log)
        self.last_path = None  # how the last requests were scored: packed, chunked or full
        self.share_rows = True  # swiftkv.measure.shared_rows where it applies (off: every row's columns are run)
        self.seconds_scoring = 0.0  # inside _loglikelihood_tokens (the rest of a suite's time is lm-eval's own)
        # swiftkv.measure.boundary: a base model records the stream entering its students' cuts (recorder); a student
        # takes it instead of running layers < l (boundary: BoundaryStates, checked here)
        self.boundary, self.boundary_recorder, self.boundary_layer = boundary, boundary_recorder, None
        self.boundary_forwards = {"given": 0, "run": 0}
        if (boundary is not None or boundary_recorder is not None) and scorer != "packed":
            raise SwiftKVError("boundary states are recorded and used by the packed scorer only; drop --scorer chunked")
        if boundary is not None:
            self.boundary_layer = boundary.check(self.model, kv_cache)

    # -- log-likelihoods ---------------------------------------------------------------------------------------

    def _new_cache(self):
        from transformers.cache_utils import DynamicCache

        factory = self._cache_factory or (lambda config: DynamicCache(config=config))
        return factory(self.model.config)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        """(log-likelihood, is-greedy) of each (context, continuation) request, the way SwiftKV serves a prompt.

        Requests that share a context (the choices of a multiple-choice question, one window of a rolling
        log-likelihood) share one run of that context, and only scored positions get logits, so a student runs every
        other context position through layers < l only (the packed or the chunked scorer, module docstring).
        HFLM's own semantics are kept: the same left truncation to ``max_length + 1`` tokens, the same scored
        positions, the cache hook for every request with a string.
        """
        if self.backend != "causal":
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        groups: dict[tuple[int, ...], list[tuple[int, list[int]]]] = defaultdict(list)
        for i, (_, context_enc, continuation_enc) in enumerate(requests):
            if not context_enc or not continuation_enc or len(continuation_enc) > self.max_length:
                raise SwiftKVError("lm-eval request with an empty context/continuation or a continuation over max_length")
            full = (context_enc + continuation_enc)[-(self.max_length + 1):]
            n_ctx = len(full) - len(continuation_enc)
            groups[tuple(full[:n_ctx])].append((i, full[n_ctx:]))
        t0 = time.perf_counter()
        try:
            return self._score_requests(requests, groups, disable_tqdm, override_bs)
        finally:
            self.seconds_scoring += time.perf_counter() - t0

    def _score_requests(self, requests, groups, disable_tqdm, override_bs):
        path = self.last_path = self._scoring_path(groups)
        if path == "full":
            logger.warning("a request runs past the model's sliding window (%s positions): every request is scored "
                           "with a full forward of its own, lm-eval's way (exact; no shared contexts, no prefill skip)",
                           self.model.config.sliding_window)
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        bar = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="loglikelihood (shared contexts)")
        if path == "packed":
            answers = self._score_tree(groups)
        else:
            batches = self._context_batches(groups, override_bs)
            answers = (answer for batch in batches for answer in self._score_batch(batch))
        for i, answer in answers:
            results[i] = answer
            request_str = requests[i][0]
            if request_str is not None:
                self.cache_hook.add_partial("loglikelihood", request_str, answer)
            bar.update(1)
        bar.close()
        return results

    # -- the packed scorer ---------------------------------------------------------------------------------------

    def _scoring_path(self, groups) -> str:
        """``packed`` or ``chunked`` (the scorer asked for; chunked where the attention takes no dense 4D mask), or
        ``full`` when a request runs past a sliding window: a shared context's cache (chunked) and a packed 4D mask
        (which replaces the model's own masks) both assume every position sees every earlier one."""
        config = self.model.config
        window = getattr(config, "sliding_window", None)
        if window is not None and any(len(ctx) + max(len(c) for _, c in conts) > window for ctx, conts in groups.items()):
            return "full"
        if self.scorer == "packed" and getattr(config, "_attn_implementation", None) in ("sdpa", "eager"):
            return "packed"
        return "chunked"

    def _score_tree(self, groups):
        """The packed scorer: every request's positions in one prefix tree (``swiftkv.measure.prefix_tree``), each
        distinct prefix run once per row, rows packed into forwards; yields (request, answer) as each completes."""
        tree = PrefixTree()
        plans = []  # (request, continuation, the node predicting each of its tokens)
        needs: dict[int, set[int]] = defaultdict(set)  # node -> the tokens it is asked to predict
        continuation_nodes: set[int] = set()
        for ctx, conts in groups.items():
            end = tree.insert(ctx)[-1]
            for i, cont in conts:
                path = tree.insert(cont[:-1], end)
                continuation_nodes.update(path)
                nodes = [end] + path
                plans.append((i, cont, nodes))
                for node, token in zip(nodes, cont):
                    needs[node].add(token)
        waiting: dict[int, list[int]] = defaultdict(list)  # node -> plans that still need it
        left = []
        for p, (_, _, nodes) in enumerate(plans):
            distinct = set(nodes)
            left.append(len(distinct))
            for node in distinct:
                waiting[node].append(p)
        picked: dict[tuple[int, int], torch.Tensor] = {}  # (node, token) -> log-probability (0-dim fp32)
        best: dict[int, int] = {}
        config = self.model.config
        attention_cost = 1.0 / (6 * config.hidden_size)  # per key, relative to a position's other work (about 12 h^2)
        forwards = plan_rows(tree, set(needs), width=max(1, min(PACK_WIDTH, self.positions_per_forward)),
                             max_positions=self.positions_per_forward, score_budget=self._position_budget(),
                             attention_cost=attention_cost)
        for rows in forwards:
            logp, argmax = self._run_rows(tree, rows, needs, continuation_nodes)
            picked.update(logp)
            best.update(argmax)
            for node in argmax:
                for p in waiting.pop(node, ()):
                    left[p] -= 1
                    if left[p] == 0:
                        i, cont, nodes = plans[p]
                        values = torch.stack([picked[(n, t)] for n, t in zip(nodes, cont)])
                        yield i, (float(values.sum()), all(best[n] == t for n, t in zip(nodes, cont)))

    @torch.no_grad()
    def _run_rows(self, tree, rows, needs, continuation_nodes):
        """One forward over packed rows: ({(node, token): log-probability}, {node: argmax}) of every scored node."""
        device = self.device
        ids, positions, mask = (torch.from_numpy(a) for a in row_arrays(tree, rows))
        attention = self.model.config._attn_implementation
        skip = is_student(self.model) and self.prefill_skip
        # every position runs every layer (no prefill skip): under sdpa, each distinct one once (shared_rows)
        share = not skip and self.share_rows and attention == "sdpa"
        if skip:
            # (R, N) positions: the student's prefill skip runs only these past layer l (short rows repeat their last)
            keep_lists = [row.scored or [0] for row in rows]
            n_keep = max(len(k) for k in keep_lists)
            keep = torch.tensor([k + [k[-1]] * (n_keep - len(k)) for k in keep_lists], dtype=torch.long)
            flat = [r * n_keep + j for r, row in enumerate(rows) for j in range(len(row.scored))]
        else:
            # a (R, W) boolean mask: logits of exactly the scored columns, flattened (no row's padding projected)
            keep = torch.zeros(ids.shape, dtype=torch.bool)
            for r, row in enumerate(rows):
                keep[r, row.scored] = True
            flat = list(range(int(keep.sum())))
        run = [n for row in rows for n in row.nodes]  # the positions the layers run
        gather = source = None
        if share:  # (1, U): each distinct position once, in the order their scored columns are flattened
            run = set(run)
            gather, source = (torch.from_numpy(a) for a in shared_layout(rows, ids.shape[1]))
            blocks = query_blocks(mask.numpy())
            ids, positions, keep = (x.reshape(1, -1)[:, source] for x in (ids, positions, keep))
        continuations = sum(1 for n in run if n in continuation_nodes)
        self.tokens_run["continuation"] += continuations
        self.tokens_run["context"] += len(run) - continuations
        if attention == "eager":
            mask = torch.zeros(mask.shape, dtype=self.model.dtype).masked_fill(~mask, torch.finfo(self.model.dtype).min)
        asked = []  # (flat index, node, token) for every token a scored node is asked to predict
        scored_nodes = [row.nodes[col] for row in rows for col in row.scored]
        for p, node in zip(flat, scored_nodes):
            asked.extend((p, node, token) for token in needs[node])
        index = torch.tensor([p for p, _, _ in asked], device=device)
        targets = torch.tensor([t for _, _, t in asked], device=device)
        keys = [(r, 0, len(row.nodes), row_key(tree, row)) for r, row in enumerate(rows)]
        with self._autocast():
            sharing = shared_rows(self.model, gather.to(device), source.to(device), blocks) if share else nullcontext()
            with boundary_forward(self, keys, mask.shape[::2], gather), \
                    final_hidden_states(self.model) as head, sharing:
                out = self.model(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 position_ids=positions.to(device), cache=self._new_cache(), use_cache=True,
                                 logits_to_keep=keep.to(device))
            # hidden states (or logits) of the scored columns, (R*N or S), d; projected a vocabulary chunk at a time
            values, argmax = scored_log_probs(out.logits.reshape(-1, out.logits.shape[-1]), index, targets, head)
        self.forwards += 1
        argmax = argmax.tolist()
        best = {node: argmax[p] for p, node in zip(flat, scored_nodes)}
        return {(node, token): v for (_, node, token), v in zip(asked, values.cpu())}, best

    def _position_budget(self) -> int:
        """Positions per forward such that the logits (and their log-softmax) stay within ``logits_budget_bytes``.
        A model whose head ``swiftkv.measure.head`` takes over never holds them whole; the bound still lays out its
        forwards, so every model of one shape gets the same rows (boundary states are keyed by them)."""
        return max(256, int(self.logits_budget_bytes // (8 * self.model.config.vocab_size)))

    def _context_batches(self, groups, override_bs=None):
        """Contexts longest first, at most ``batch_size`` per batch; a new batch when the left padding of a context
        would exceed both a quarter of its batch's width and ``PAD_SLACK`` positions, or the budget is full."""
        max_contexts = int(override_bs or (self.batch_size if str(self.batch_size).isdigit() else 16))
        budget = self._position_budget()
        batch, width = [], 0
        for ctx, conts in sorted(groups.items(), key=lambda kv: -len(kv[0])):
            if batch and (len(batch) >= max_contexts or _wasteful(len(ctx), width) or (len(batch) + 1) * width > budget):
                yield batch
                batch = []
            if not batch:
                width = len(ctx)
            batch.append((ctx, conts))
        if batch:
            yield batch

    def _tail_chunks(self, rows):
        """Continuation rows (longest first) in chunks: a new chunk when a row's right padding would exceed both
        a quarter of the chunk's width and ``PAD_SLACK`` positions, or the budget is full. (Every forward has a fixed cost,
        so short rows share one.)"""
        budget = self._position_budget()
        chunk, width = [], 0
        for row in sorted((r for r in rows if len(r[2]) > 1), key=lambda r: -len(r[2])):
            tail = len(row[2]) - 1
            if chunk and (_wasteful(tail, width) or (len(chunk) + 1) * width > budget):
                yield chunk
                chunk = []
            if not chunk:
                width = tail
            chunk.append(row)
        if chunk:
            yield chunk

    @torch.no_grad()
    def _score_batch(self, batch):
        device = self.device
        contexts = [list(ctx) for ctx, _ in batch]
        width = max(len(c) for c in contexts)
        ids = torch.zeros(len(batch), width, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for g, ctx in enumerate(contexts):  # left padding: every context ends at the same column
            ids[g, width - len(ctx):] = torch.tensor(ctx, device=device)
            mask[g, width - len(ctx):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = self._new_cache()
        with self._autocast():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                             logits_to_keep=1)  # SwiftKV: the prefill skip (only the last position runs every layer)
        self.forwards += 1
        first = torch.log_softmax(out.logits[:, -1].float(), dim=-1)  # G,V: predicts each continuation's 1st token
        self.tokens_run["context"] += int(mask.sum())
        # The prefill's K/V per layer (AcrossKV: empty slots stay empty), copied row by row into each chunk's cache.
        prefix = [(layer.keys, layer.values) if layer.get_seq_length() > 0 else None for layer in cache.layers]
        rows = [(g, i, cont) for g, (_, conts) in enumerate(batch) for i, cont in conts]
        for g, i, cont in rows:
            if len(cont) == 1:
                yield i, self._answer(first[g : g + 1], cont)
        for chunk in self._tail_chunks(rows):
            index = torch.tensor([g for g, _, _ in chunk], device=device)
            chunk_cache = self._new_cache()
            for layer, kv in zip(chunk_cache.layers, prefix):
                if kv is not None:
                    layer.update(kv[0][index], kv[1][index])  # the layer's own update: no second quantisation
            tail = len(chunk[0][2]) - 1
            tail_ids = torch.zeros(len(chunk), tail, dtype=torch.long, device=device)
            tail_mask = torch.zeros_like(tail_ids)
            for r, (_, _, cont) in enumerate(chunk):
                tail_ids[r, : len(cont) - 1] = torch.tensor(cont[:-1], device=device)
                tail_mask[r, : len(cont) - 1] = 1
            tail_pos = positions[index, -1:] + 1 + torch.arange(tail, device=device)
            with self._autocast():
                logits = self.model(input_ids=tail_ids, attention_mask=torch.cat([mask[index], tail_mask], dim=1),
                                    position_ids=tail_pos, cache=chunk_cache, use_cache=True).logits  # R,T,V
            self.forwards += 1
            logp = torch.log_softmax(logits.float(), dim=-1)
            self.tokens_run["continuation"] += int(tail_mask.sum())
            for r, (g, i, cont) in enumerate(chunk):
                yield i, self._answer(torch.cat([first[g : g + 1], logp[r, : len(cont) - 1]]), cont)

    @staticmethod
    def _answer(logp: torch.Tensor, cont: list[int]) -> tuple[float, bool]:
        """(summed log-probability of ``cont``, whether every token is the argmax) from its (len, V) log-probs."""
        target = torch.tensor(cont, device=logp.device)
        picked = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        return float(picked.sum()), bool((logp.argmax(-1) == target).all())

    def _autocast(self):
        return torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                              enabled=self.mixed_precision_dtype is not None)

    def _model_call(self, inps, attn_mask=None, labels=None):
        """lm-eval's full forward (the ``full`` path), with the FP8 cache where one is asked for."""
        if self._cache_factory is None or attn_mask is not None or labels is not None:
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        with torch.no_grad(), self._autocast():
            return self.model(input_ids=inps, cache=self._new_cache(), use_cache=True).logits

    # -- generation --------------------------------------------------------------------------------------------

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        if self._cache_factory is not None:
            generation_kwargs["past_key_values"] = self._cache_factory(self.model.config)
        return super()._model_generate(context, max_length, stop, **generation_kwargs)


PAD_SLACK = 4  # positions of padding per row that are cheaper than another forward
SCORERS = ("packed", "chunked")
PACK_WIDTH = 256  # positions per packed row unless a unit and its ancestors are longer (attention costs width**2 a row)


def _wasteful(length: int, width: int) -> bool:
    return width - length > PAD_SLACK and length < 0.75 * width


def _as_bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)
