"""The teacher cache: what the frozen teacher computes for a distillation, computed once and shared by every student.

Every SwiftKV student of a model distils against the same teacher (the model itself with SwiftKV off) on the same
token stream (``swiftkv.data.packing.conversation_stream``: the data source, shuffled by the seed, packed the same way for
every budget). One no-grad pass over that stream stores, per token:

- ``h{l}``: the residual stream entering layer ``l``, for every ``l`` the students use — their input (the shared
  prefix, layers < l, is then never run again);
- ``h{L-1}``: the stream entering the last layer (the teacher side of the hidden-state MSE in ``kl+hidden``);
- ``final``: the teacher's final normed hidden state; the frozen LM head re-applied to it gives the teacher's logits
  exactly (full-vocabulary logits would take ~85x the space);

and the same for the fixed held-out sample, plus the token stream itself (ids, conversation boundaries, assistant
masks), so a distillation job reads no conversations and renders no chat template. A step then runs only the
student's layers >= l and the LM heads.

The arrays are raw little-endian files read through ``numpy.memmap`` (row = token), beside ``cache.json``, which
holds the key — model weights fingerprint, data source, seed, row length, token count, held-out tokens, the set of
layers, storage dtype — and each array's shape. A run whose settings the key does not cover, or a file of the wrong
size, is refused with one line. Built in the teacher's own code path (``prepare_prefix`` / ``run_layers`` of the
SwiftKV model in teacher mode, one pack per forward as the trainer runs it), an fp32 cache reproduces the trainer's
shared-prefix step bit for bit (``tests/test_teacher_cache.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from swiftkv.data.packing import Pack, PackReport, Segment, cut_stream, pack_stream
from swiftkv.errors import SwiftKVError

logger = logging.getLogger(__name__)

CACHE_VERSION = 1
META_FILE = "cache.json"
STORAGE_DTYPES = {"float32": (np.float32, torch.float32), "bfloat16": (np.uint16, torch.bfloat16)}


def weights_fingerprint(model: torch.nn.Module) -> str:
    """sha256 over the model's config (architecture numbers) and every parameter and buffer, in name order."""
    digest = hashlib.sha256()
    config = {k: v for k, v in model.config.to_dict().items()
              if k in ("model_type", "num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads",
                       "num_key_value_heads", "rope_parameters", "rms_norm_eps", "tie_word_embeddings")}
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        if "_swiftkv" in name:  # the student's own parts: not the teacher's
            continue
        hash_tensor(digest, name, tensor)
    return digest.hexdigest()[:32]


def hash_tensor(digest, name: str, tensor: torch.Tensor) -> None:
    """Add a named tensor (its name, dtype and bytes) to a hashlib digest: the fingerprints' one way to hash weights."""
    digest.update(name.encode())
    digest.update(str(tensor.dtype).encode())
    digest.update(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())


@dataclass(frozen=True)
class CacheKey:
    """What decides the cached numbers; a run must match it (``covers``)."""

    model: str  # weights_fingerprint of the teacher
    data: str  # data source ("sharegpt" / "hub")
    seed: int  # the stream's order
    max_length: int  # tokens per packed row
    tokens: int  # training tokens in the stream: every budget up to this is served
    heldout_tokens: int
    layers: tuple[int, ...]  # the l values stored (and L-1)
    dtype: str  # storage dtype
    version: int = CACHE_VERSION

    def problems(self, *, model: str, data: str, seed: int, max_length: int, tokens: int, heldout_tokens: int,
                 layer: int) -> list[str]:
        """What keeps this cache from serving a run with these settings (empty: it serves it)."""
        out = []
        if self.version != CACHE_VERSION:
            out.append(f"cache format {self.version}, this swiftkv reads {CACHE_VERSION}")
        if model != self.model:
            out.append("it was built from other teacher weights")
        for name, want, have in (("data", data, self.data), ("seed", seed, self.seed),
                                 ("max_length", max_length, self.max_length),
                                 ("heldout_tokens", heldout_tokens, self.heldout_tokens)):
            if want != have:
                out.append(f"{name} {want} != {have}")
        if tokens == 0 or tokens > self.tokens:
            out.append(f"the run needs {tokens or 'all'} training tokens, the cache holds {self.tokens}")
        if layer not in self.layers:
            out.append(f"l={layer} is not among its layers {list(self.layers)}")
        return out


@dataclass
class _Stream:
    """Token stream + per-token arrays of one split (train or held-out)."""

    segments: list[Segment]
    offsets: list[int]  # stream offset of each segment's first token
    arrays: dict[str, np.memmap] = field(default_factory=dict)  # "h15", "final", ... -> (N, H)


class TeacherCache:
    """A built cache, opened read-only (memory-mapped)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        meta_path = self.path / META_FILE
        if not meta_path.is_file():
            raise SwiftKVError(f"{self.path} is not a teacher cache (no {META_FILE}); build one with: "
                               "swiftkv teacher-cache MODEL -o DIR")
        try:
            meta = json.loads(meta_path.read_text())
            key = meta["key"]
            self.key = CacheKey(**{**key, "layers": tuple(key["layers"])})
            self.hidden_size = int(meta["hidden_size"])
            self.report = meta["report"]
            self.build = meta.get("build", {})
            np_dtype, self.torch_dtype = STORAGE_DTYPES[self.key.dtype]
            self.splits = {name: self._open_split(name, meta["splits"][name], np_dtype) for name in ("train", "heldout")}
        except SwiftKVError:
            raise  # an array that is missing, of the wrong size or not finite: its own line
        except (KeyError, TypeError, ValueError) as err:
            raise SwiftKVError(f"{meta_path} is damaged ({err!r}); build the cache again") from None

    def _open_split(self, name: str, meta: dict, np_dtype) -> _Stream:
        segments = [Segment(cid, ids, trunc, None if asst is None else [bool(x) for x in asst])
                    for cid, ids, trunc, asst in meta["segments"]]
        offsets = list(np.cumsum([0] + [len(s.input_ids) for s in segments[:-1]])) if segments else []
        n = sum(len(s.input_ids) for s in segments)
        stream = _Stream(segments, [int(o) for o in offsets])
        for array in meta["arrays"]:
            path = self.path / f"{name}.{array}.bin"
            expected = n * self.hidden_size * np.dtype(np_dtype).itemsize
            size = path.stat().st_size if path.is_file() else -1
            if size != expected:
                raise SwiftKVError(f"{path} is {'missing' if size < 0 else f'{size} bytes, not {expected}'}: the "
                                   "cache is incomplete or damaged; build it again")
            stream.arrays[array] = np.memmap(path, dtype=np_dtype, mode="r", shape=(n, self.hidden_size))
            row = first_non_finite(stream.arrays[array])
            if row is not None:
                raise SwiftKVError(f"{path} holds non-finite values (token row {row}): the cache is damaged and "
                                   "would train a NaN student; build it again (swiftkv teacher-cache)")
        return stream

    def check(self, *, model: str, data: str, seed: int, max_length: int, tokens: int, heldout_tokens: int,
              layer: int, need_pre_last: bool, num_hidden_layers: int) -> None:
        """Raise one line unless this cache serves the run."""
        problems = self.key.problems(model=model, data=data, seed=seed, max_length=max_length, tokens=tokens,
                                     heldout_tokens=heldout_tokens, layer=layer)
        if need_pre_last and num_hidden_layers - 1 not in self.key.layers:
            problems.append(f"kl+hidden needs the stream entering layer {num_hidden_layers - 1}")
        if problems:
            raise SwiftKVError(f"teacher cache {self.path} does not fit this run: {'; '.join(problems)}; build one "
                               "for these settings (swiftkv teacher-cache) or drop --teacher-cache")

    # -- what a run reads ---------------------------------------------------------------------------------

    def packs(self, split: str, token_budget: int | None, max_length: int) -> tuple[list[Pack], PackReport, list]:
        """The packs a run with ``token_budget`` trains on (or the held-out packs), their report, and for each pack
        the stream rows of its tokens (``rows`` for ``gather``)."""
        stream = self.splits[split]
        report = PackReport()
        segments = cut_stream(stream.segments, token_budget, report)
        packs = pack_stream(segments, max_length, report)
        rows, k = [], 0
        for pack in packs:
            index = []
            for _ in pack.conversation_ids:
                seg, start = segments[k], stream.offsets[k]
                index.append(np.arange(start, start + len(seg.input_ids)))
                k += 1
            rows.append(np.concatenate(index))
        return packs, report, rows

    def gather(self, split: str, array: str, rows: list[np.ndarray], width: int, dtype: torch.dtype) -> torch.Tensor:
        """(B, width, H) tensor of ``array`` at the given stream rows per batch row (zeros in the padding)."""
        data = self.splits[split].arrays[array]
        out = torch.zeros((len(rows), width, self.hidden_size), dtype=dtype)
        for b, index in enumerate(rows):
            values = torch.from_numpy(np.ascontiguousarray(data[index]))
            if self.torch_dtype == torch.bfloat16:
                values = values.view(torch.bfloat16)
            out[b, : len(index)] = values.to(dtype)
        return out


def first_non_finite(array: np.ndarray, rows: int = 1 << 14) -> int | None:
    """The first row of a stored array (float32, or bfloat16 kept as uint16) holding a NaN or an infinity, or None;
    read in blocks of ``rows`` (a cache is read once when it is opened: a few hundred MB per second of opening)."""
    for start in range(0, array.shape[0], rows):
        block = np.asarray(array[start: start + rows])
        if block.dtype == np.uint16:  # bfloat16: all exponent bits set = infinity or NaN
            bad = (block & 0x7F80) == 0x7F80
        else:
            bad = ~np.isfinite(block)
        hits = np.flatnonzero(bad.any(axis=1))
        if hits.size:
            return start + int(hits[0])
    return None


@torch.no_grad()
def teacher_states(inner, input_ids: torch.Tensor, position_ids: torch.Tensor, layers: list[int]) -> dict:
    """The teacher's values a cache stores for one batch: ``h{l}`` (B,S,H: the stream entering layer l) for each l
    of ``layers`` (ascending) and ``final`` (the final normed hidden state), by the trainer's own code path."""
    state = inner.prepare_prefix(input_ids=input_ids, position_ids=position_ids, use_cache=False)
    h, done, values = state.hidden_states, 0, {}
    for l in layers:
        state.hidden_states = h
        h = inner.run_layers(state, done, l)
        values[f"h{l}"], done = h, l
    state.hidden_states = h
    values["final"] = inner.norm(inner.run_layers(state, done, inner.config.num_hidden_layers))
    return values


@dataclass(frozen=True)
class TeacherCacheSettings:
    """What a teacher cache holds: the students' l values (``layers``; L-1, for kl+hidden, is always added), the
    data source and its order seed, the row length, the training and held-out token budgets, the storage dtype and
    whether the stream keeps its assistant-token masks (for ``loss_positions="assistant"``)."""

    layers: list[int]
    data: str
    seed: int
    max_length: int
    tokens: int
    heldout_tokens: int
    storage_dtype: str = "float32"
    assistant_masks: bool = True


def _write_split(inner, packs: list[Pack], tmp: Path, split: str, names: list[str], stored: list[int], pad_id: int,
                 storage_dtype: str, progress: bool, model_dtype) -> int:
    """The teacher's states of one split's packs (one pack per forward, as the trainer's steps run) into one memory-
    mapped file per array (``<split>.<array>.bin``, rows of hidden size); the number of token rows written."""
    from tqdm.auto import tqdm

    from swiftkv.data.packing import collate_packs

    np_dtype, torch_dtype = STORAGE_DTYPES[storage_dtype]
    n = sum(len(p) for p in packs)
    if not n:
        for a in names:
            (tmp / f"{split}.{a}.bin").write_bytes(b"")
        return 0
    hidden = inner.config.hidden_size
    files = {a: np.memmap(tmp / f"{split}.{a}.bin", dtype=np_dtype, mode="w+", shape=(n, hidden)) for a in names}
    row = 0
    with torch.no_grad():
        for pack in tqdm(packs, desc=f"teacher cache ({split})", unit="pack", disable=not progress):
            batch = collate_packs([pack], pad_id)
            values = teacher_states(inner, batch["input_ids"], batch["position_ids"], stored)
            if not all(bool(torch.isfinite(v).all()) for v in values.values()):
                raise SwiftKVError(f"the teacher produced non-finite hidden states ({split} pack at token row "
                                   f"{row}): its weights are damaged or {model_dtype} overflows; check the base model "
                                   "(or build the cache in float32)")
            for a, v in values.items():
                v = v[0, : len(pack)].to(torch_dtype).contiguous()
                files[a][row: row + len(pack)] = (v.view(torch.uint16) if torch_dtype == torch.bfloat16 else v).numpy()
            row += len(pack)
    for f in files.values():
        f.flush()
    return n


def build_teacher_cache(
    base_model,
    tokenizer,
    output: str | os.PathLike,
    settings: TeacherCacheSettings,
    *,
    train_conversations,
    heldout_conversations,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """One no-grad teacher pass over the training stream (``settings.tokens``) and the held-out sample; write the
    cache."""
    layers, data, seed, max_length = settings.layers, settings.data, settings.seed, settings.max_length
    tokens, heldout_tokens, storage_dtype = settings.tokens, settings.heldout_tokens, settings.storage_dtype
    assistant_masks = settings.assistant_masks
    from swiftkv.data.packing import HELDOUT_SEED, conversation_stream
    from swiftkv.io import atomic_dir, check_output_dir
    from swiftkv.models.convert import convert_to_swiftkv

    output = check_output_dir(output, overwrite)
    if storage_dtype not in STORAGE_DTYPES:
        raise SwiftKVError(f"unknown cache dtype {storage_dtype!r}; use one of {', '.join(STORAGE_DTYPES)}")
    if tokens <= 0:
        raise SwiftKVError("the teacher cache needs a token budget (--tokens > 0)")
    L = base_model.config.num_hidden_layers
    stored = sorted({*layers, L - 1})
    if not all(1 <= l < L for l in layers):
        raise SwiftKVError(f"layers {layers} must lie in [1, {L - 1}] for a {L}-layer model")
    started = time.perf_counter()
    # the teacher in the trainer's own code path: the SwiftKV model with SwiftKV off (l = L: no SwiftKV layers)
    teacher = convert_to_swiftkv(base_model, L).swiftkv(False).eval()
    inner = teacher.model
    fingerprint = weights_fingerprint(teacher)
    hidden = teacher.config.hidden_size
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    reports, split_meta, tokens_done, seconds = {}, {}, 0, 0.0
    with atomic_dir(output, overwrite=overwrite, what=f"teacher cache ({data}, seed {seed})") as tmp:
        for split, convs, budget, order_seed in (("train", train_conversations, tokens, seed),
                                                 ("heldout", heldout_conversations, heldout_tokens, HELDOUT_SEED)):
            report = PackReport()
            stream = conversation_stream(convs, tokenizer, max_length, budget, order_seed, report,
                                         assistant_masks) if budget else []
            names = [f"h{l}" for l in stored] + ["final"]
            t0 = time.perf_counter()
            n = _write_split(inner, pack_stream(stream, max_length, report), tmp, split, names, stored, pad_id,
                             storage_dtype, progress, base_model.dtype)
            if split == "train":
                tokens_done, seconds = n, time.perf_counter() - t0
            reports[split] = asdict(report)
            split_meta[split] = {
                "arrays": names,
                "tokens": n,
                "segments": [[s.conversation_id, s.input_ids, s.truncated_tokens, s.assistant] for s in stream],
            }
        key = CacheKey(fingerprint, data, seed, max_length, tokens, heldout_tokens, tuple(stored), storage_dtype)
        meta = {
            "key": asdict(key),
            "hidden_size": hidden,
            "num_hidden_layers": L,
            "report": reports,
            "splits": split_meta,
            "build": {"train_tokens": tokens_done, "train_seconds": seconds,
                      "tokens_per_s": tokens_done / seconds if seconds else None,
                      "wall_seconds": time.perf_counter() - started, "threads": torch.get_num_threads()},
        }
        (tmp / META_FILE).write_text(json.dumps(meta) + "\n")
    logger.info("teacher cache %s: %d training tokens in %.1f s (%.0f tok/s)", output, tokens_done, seconds,
                tokens_done / seconds if seconds else 0)
    return meta


def cached_batch(cache: TeacherCache, split: str, packs: list[Pack], rows: list, layer: int, pad_id: int,
                 dtype: torch.dtype, pre_last: int | None = None) -> dict:
    """``collate_packs`` plus the cached teacher tensors: ``boundary`` (h_l), ``teacher`` (final normed hidden) and,
    for kl+hidden, ``teacher_pre_last`` (the stream entering the last layer)."""
    from swiftkv.data.packing import collate_packs

    batch = collate_packs(packs, pad_id)
    width = batch["input_ids"].shape[1]
    batch["boundary"] = cache.gather(split, f"h{layer}", rows, width, dtype)
    batch["teacher"] = cache.gather(split, "final", rows, width, dtype)
    if pre_last is not None:
        batch["teacher_pre_last"] = cache.gather(split, f"h{pre_last}", rows, width, dtype)
    return batch


__all__ = ["CacheKey", "TeacherCache", "build_teacher_cache", "cached_batch", "weights_fingerprint"]
