"""Boundary states: the residual stream entering layer l, recorded once by a base model's evaluation and reused by
every SwiftKV student of that base.

A student's layers < l (and its embeddings) are the base model's, frozen by distillation, so the stream entering
layer l of every position it scores is the base model's too. The packed scorer (``swiftkv.measure.lm``) lays the same
requests out in the same rows for every model of one shape (``swiftkv.measure.prefix_tree``), so the base model's
evaluation can record, per packed row, the stream entering each layer l that the profile's students cut at
(``BoundaryRecorder``), and a student's evaluation can take it instead of running layers < l (``BoundaryStates``; the
model reads it from ``given_boundary``, ``swiftkv.models.common``). A row is keyed by what decides each column's
output: its tokens, positions and which column each one sees (``prefix_tree.row_key``). What is left for the student
is its own part: K/V from ``norm_swiftkv(h_l)`` for every position and layers >= l for the scored ones.

The states are checked before use: the student's embeddings and layers < l must have the fingerprint the base
model's had when it recorded them (``frozen_fingerprint``), in the same dtype, with the same KV cache (an FP8 cache
rounds the K/V of layers < l, so an FP8 student reads states recorded by its base model's FP8 evaluation). A forward
with a row the record lacks (another tokenizer, another task) is run in full, and the evaluation counts how many
forwards took recorded states.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

import torch

from swiftkv.errors import SwiftKVError

BOUNDARY_KIND = "boundary states"
BOUNDARY_META = "boundary.json"
BOUNDARY_FORMAT = 2  # 2: keyed per packed row of the prefix tree (1: per segment, a context and its continuations)
SHARD_BYTES = 256 * 2**20  # a shard file is written when the states held reach this size


def _layer_of(name: str) -> int | None:
    parts = name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        if i + 1 < len(parts) and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def frozen_fingerprints(model: torch.nn.Module, layers) -> dict[int, str]:
    """Per cut l of ``layers``: sha256 over what decides the stream entering layer l, the architecture numbers and the
    decoder's embeddings and layers < l (names, dtypes, bytes; a student's own ``*_swiftkv`` parts excluded). One pass
    over the weights, embeddings first, then layer by layer; each cut's digest is taken where its layers end."""
    from swiftkv.distill.teacher_cache import hash_tensor

    digest = hashlib.sha256()
    config = {k: v for k, v in model.config.to_dict().items()
              if k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rope_parameters",
                       "rms_norm_eps", "sliding_window", "layer_types")}
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    cuts = sorted({int(x) for x in layers})
    if not cuts:
        return {}
    frozen = []  # (layer index, -1 for the embeddings; name; tensor)
    for name, tensor in model.get_decoder().state_dict().items():
        index = _layer_of(name)
        if "swiftkv" not in name and (index is not None or "embed" in name) and (index is None or index < cuts[-1]):
            frozen.append((-1 if index is None else index, name, tensor))
    out = {}
    for index, name, tensor in sorted(frozen, key=lambda t: t[:2]):
        while cuts and index >= cuts[0]:
            out[cuts.pop(0)] = digest.hexdigest()[:32]
        hash_tensor(digest, name, tensor)
    out.update({cut: digest.hexdigest()[:32] for cut in cuts})
    return out


def frozen_fingerprint(model: torch.nn.Module, layer: int) -> str:
    """``frozen_fingerprints`` at one cut."""
    return frozen_fingerprints(model, [layer])[layer]


def check_cuts(model: torch.nn.Module, layers) -> list[int]:
    """``layers`` sorted and distinct, or a one-line ``SwiftKVError`` when one is no cut l of ``model`` (1 .. L-1)."""
    n = model.config.num_hidden_layers
    out = sorted({int(x) for x in layers})
    bad = [x for x in out if not 0 < x < n]
    if bad:
        raise SwiftKVError(f"boundary layers {bad} are not cuts of a {n}-layer model (1 .. {n - 1})")
    return out


def layer_input_hooks(model: torch.nn.Module, layers, keep) -> list:
    """Forward pre-hooks that call ``keep(l, h)`` with the stream ``h`` entering each decoder layer l of ``layers`` on
    every forward (remove them when done)."""
    decoder_layers = model.get_decoder().layers

    def hook_for(index):
        def hook(module, args, kwargs):
            keep(index, args[0] if args else kwargs["hidden_states"])
        return hook

    return [decoder_layers[x].register_forward_pre_hook(hook_for(x), with_kwargs=True) for x in layers]


@contextlib.contextmanager
def given_boundary(model: torch.nn.Module, states: torch.Tensor | None):
    """Within the block, a SwiftKV student ``model`` takes ``states`` (the stream entering its layer l, shaped as its
    inputs) instead of running its layers < l (``swiftkv.models.common``); nothing when ``states`` is None."""
    if states is None:
        yield
        return
    decoder = model.get_decoder()
    decoder.given_boundary = states
    try:
        yield
    finally:
        decoder.given_boundary = None


class BoundaryRecorder:
    """Records, for the base model's packed forwards, the stream entering each of ``layers``, per row, into shard
    files under ``folder`` (``save`` writes the metadata). Use ``arm`` around one forward, then ``take``."""

    def __init__(self, model: torch.nn.Module, layers, folder: str | Path, kv_cache: str = "native"):
        if getattr(model.config, "swiftkv", False):
            raise SwiftKVError("boundary states are recorded by the base model (a SwiftKV student runs its own layers "
                               ">= l); evaluate the base model with --save-boundary")
        self.layers = check_cuts(model, layers)
        self.model, self.folder, self.kv_cache = model, Path(folder), kv_cache
        self.fingerprints = frozen_fingerprints(model, self.layers)
        self.dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        self._held: dict[int, dict[str, torch.Tensor]] = {x: {} for x in self.layers}
        self._bytes = 0
        self._shards: dict[int, list[str]] = {x: [] for x in self.layers}
        self._captured: dict[int, torch.Tensor] = {}
        self._recorded: set[str] = set()  # every row recorded so far (a row met again is not stored twice)

    def arm(self):
        """Hooks that keep the input of each recorded layer for the next forward; remove them after it."""
        return layer_input_hooks(self.model, self.layers, self._captured.__setitem__)

    @property
    def rows(self) -> int:
        return len(self._recorded)

    def take(self, layout, gather=None) -> None:
        """After the forward: ``layout`` is [(row, first column, end column, row key)]; ``gather``: the (rows, width)
        index of each column's position when the forward ran distinct positions (``swiftkv.measure.shared_rows``)."""
        new = [(row, start, end, key) for row, start, end, key in dict((k[3], k) for k in layout).values()
               if key not in self._recorded]
        for x in self.layers:
            states = self._captured.pop(x)
            if gather is not None:  # (1, U, hidden) -> (rows, width, hidden)
                states = states[0][gather.to(states.device)]
            for row, start, end, key in new:
                self._held[x][key] = states[row, start:end].detach().to("cpu").clone()
                self._bytes += self._held[x][key].numel() * self._held[x][key].element_size()
        self._recorded.update(key for *_, key in new)
        if self._bytes >= SHARD_BYTES:
            self._flush()

    def _flush(self) -> None:
        from safetensors.torch import save_file

        self.folder.mkdir(parents=True, exist_ok=True)
        for x in self.layers:
            if self._held[x]:
                name = f"layer-{x}-{len(self._shards[x]):04d}.safetensors"
                save_file(self._held[x], str(self.folder / name))
                self._shards[x].append(name)
                self._held[x] = {}
        self._bytes = 0

    def save(self) -> None:
        self._flush()
        meta = {"format": BOUNDARY_FORMAT, "kind": BOUNDARY_KIND, "layers": self.layers,
                "fingerprints": {str(x): f for x, f in self.fingerprints.items()}, "dtype": self.dtype,
                "kv_cache": self.kv_cache, "shards": {str(x): s for x, s in self._shards.items()}}
        (self.folder / BOUNDARY_META).write_text(json.dumps(meta, indent=1) + "\n")


class BoundaryStates:
    """A folder of recorded boundary states (``BoundaryRecorder``), read lazily; ``check`` before use."""

    def __init__(self, path: str | Path, meta: dict):
        self.path, self.meta = Path(path), meta
        self._index: dict[int, dict[str, str]] = {}
        self._open: dict[str, object] = {}

    @classmethod
    def load(cls, path) -> BoundaryStates:
        path = Path(path)
        meta_file = path / BOUNDARY_META
        if not meta_file.is_file():
            raise SwiftKVError(f"{path} holds no boundary states (no {BOUNDARY_META}); record them with: swiftkv eval "
                               "BASE --save-boundary DIR --boundary-layers L ...")
        try:
            meta = json.loads(meta_file.read_text())
            layers = [int(x) for x in meta["layers"]]
            missing = [s for x in layers for s in meta["shards"][str(x)] if not (path / s).is_file()]
        except (ValueError, KeyError, TypeError, OSError) as e:
            raise SwiftKVError(f"{path}: unreadable boundary states ({e}); record them again") from None
        if meta.get("format") != BOUNDARY_FORMAT:
            raise SwiftKVError(f"{path}: boundary states of format {meta.get('format')}, this swiftkv reads "
                               f"{BOUNDARY_FORMAT}; record them again")
        if missing:
            raise SwiftKVError(f"{path}: boundary states lack {', '.join(missing)}; record them again")
        return cls(path, meta)

    def check(self, model: torch.nn.Module, kv_cache: str) -> int:
        """The cut ``l`` these states serve ``model`` at, or a one-line ``SwiftKVError`` saying why not."""
        where = f"the boundary states {self.path}"
        if not getattr(model.config, "swiftkv", False):
            raise SwiftKVError(f"{where} serve a SwiftKV student; this model runs as a plain (or teacher) model")
        cut = int(model.config.num_key_value_layers)
        if cut not in self.meta["layers"]:
            raise SwiftKVError(f"{where} hold layers {self.meta['layers']}, not this student's cut l = {cut}; record "
                               f"them with --boundary-layers {cut}")
        if kv_cache != self.meta.get("kv_cache"):
            raise SwiftKVError(f"{where} were recorded with the {self.meta.get('kv_cache')} KV cache, this run uses "
                               f"{kv_cache}")
        dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        if dtype != self.meta.get("dtype"):
            raise SwiftKVError(f"{where} are in {self.meta.get('dtype')}, this model runs in {dtype}")
        if frozen_fingerprint(model, cut) != self.meta["fingerprints"][str(cut)]:
            raise SwiftKVError(f"{where} were recorded by another base model: this student's embeddings and layers "
                               f"< {cut} differ from the recording model's")
        return cut

    def _shard(self, name: str):
        from safetensors import safe_open

        if name not in self._open:
            self._open[name] = safe_open(str(self.path / name), framework="pt")
        return self._open[name]

    def get(self, layer: int, key: str) -> torch.Tensor | None:
        if layer not in self._index:
            self._index[layer] = {k: name for name in self.meta["shards"][str(layer)] for k in self._shard(name).keys()}
        name = self._index[layer].get(key)
        return None if name is None else self._shard(name).get_tensor(key)


@contextlib.contextmanager
def boundary_forward(lm, layout, shape, gather=None):
    """Around one packed forward of ``lm`` (a ``swiftkv.measure.lm.SwiftKVLM``): record the base model's boundary
    states (``lm.boundary_recorder``), or give a student the recorded ones (``lm.boundary``) when the folder holds every
    row of this forward, else let it run in full. ``layout``: [(row, first column, end column, row key)];
    ``shape``: the forward's (rows, width); ``gather``: for a forward over distinct positions
    (``swiftkv.measure.shared_rows``), the (rows, width) index of each column's position."""
    if lm.boundary_recorder is None and lm.boundary is None:
        yield
        return
    if lm.boundary_recorder is not None:
        hooks = lm.boundary_recorder.arm()
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()
        lm.boundary_recorder.take(layout, gather)
        return
    states = [lm.boundary.get(lm.boundary_layer, key) for *_, key in layout]
    if any(x is None for x in states):
        lm.boundary_forwards["run"] += 1
        yield
        return
    given = torch.zeros(*shape, lm.model.config.hidden_size, dtype=states[0].dtype)
    for (r, start, end, _), x in zip(layout, states):
        given[r, start:end] = x
    lm.boundary_forwards["given"] += 1
    with given_boundary(lm.model, given.to(lm.device)):
        yield
