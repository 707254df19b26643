"""The teacher's side of the fidelity measure (``swiftkv.measure.fidelity``), computed once per base model.

Every student of a base model is measured against the same teacher on the same sequences: ``teacher_outputs`` runs the
teacher once (the final hidden state of every teacher-forced batch, its greedy continuations, and on request the
stream entering each cut l) and ``TeacherOutputs`` saves, loads and checks it; ``measure_fidelity(..., cached=...)``
then runs only the teacher's head, and a SwiftKV student at a kept cut only its own part.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from swiftkv.errors import SwiftKVError
from swiftkv.measure.fidelity import (
    FidelitySettings,
    _pad,
    _pad_and_eos,
    generation_prompts,
    greedy_continuations,
    teacher_forced_sequences,
)

TEACHER_FORMAT = 1
TEACHER_META = "teacher.json"
TEACHER_TENSORS = "hidden.safetensors"
TEACHER_KIND = "fidelity teacher"


def _batch_key(ids: torch.Tensor, mask: torch.Tensor) -> str:
    import hashlib

    digest = hashlib.sha256()
    for t in (ids, mask):
        digest.update(str(tuple(t.shape)).encode())
        digest.update(t.to(torch.int64).contiguous().numpy().tobytes())
    return digest.hexdigest()[:32]


def _ids_key(ids: list[list[int]]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:32]


@dataclass
class TeacherOutputs:
    """The teacher's side of ``measure_fidelity`` for one model, held-out sample and settings: the final hidden state
    of every teacher-forced batch (as the decoder returned it, in the model's dtype) and the greedy continuations.
    ``key`` says what it was computed for (``check``)."""

    hidden: list[torch.Tensor]
    greedy: list[list[int]]
    key: dict
    verified: tuple = ()  # (teacher object id, settings, sequences key, prompts key) already checked
    boundary: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # cut l -> the stream entering l, per batch

    def boundary_for(self, student, cache_factory=None) -> tuple[int | None, str]:
        """(l, "") when the teacher-forced stream entering the SwiftKV ``student``'s layer l is held and serves it
        (its embeddings and layers < l are the teacher's, same dtype, native KV cache), else (None, why not; "" where
        that is expected: no SwiftKV student, none recorded, or an FP8 cache, which changes the stream entering l)."""
        from swiftkv.measure.boundary import frozen_fingerprint

        if (not self.boundary or cache_factory is not None or not getattr(student.config, "swiftkv", False)
                or not hasattr(student, "swiftkv")):
            return None, ""
        cut = int(student.config.num_key_value_layers)
        if cut not in self.boundary:
            return None, f"{self.key.get('path', 'the fidelity teacher')} holds no states at its cut l = {cut}"
        if frozen_fingerprint(student, cut) != self.key.get("boundary_fingerprints", {}).get(str(cut)):
            return None, f"its embeddings and layers < {cut} (or their dtype) are not the fidelity teacher's"
        return cut, ""

    def problems(self, teacher, settings: FidelitySettings, seqs, prompts) -> list[str]:
        from swiftkv.distill.teacher_cache import weights_fingerprint

        out = []
        if self.key.get("format") != TEACHER_FORMAT:
            out.append(f"format {self.key.get('format')}, this swiftkv reads {TEACHER_FORMAT}")
        if self.key.get("settings") != asdict(settings):
            diff = {k: (v, self.key.get("settings", {}).get(k)) for k, v in asdict(settings).items()
                    if self.key.get("settings", {}).get(k) != v}
            out.append("other settings (" + ", ".join(f"{k} {a} != {b}" for k, (a, b) in diff.items()) + ")")
        batches = [_batch_key(*_pad(seqs[i : i + settings.batch_size], 0, "right"))
                   for i in range(0, len(seqs), settings.batch_size)]
        if batches != self.key.get("batches"):
            out.append("other teacher-forced sequences (another held-out sample or tokenizer)")
        if _ids_key(prompts) != self.key.get("prompts"):
            out.append("other generation prompts (another held-out sample or tokenizer)")
        if weights_fingerprint(teacher) != self.key.get("teacher"):
            out.append("other teacher weights")
        return out

    def check(self, teacher, settings: FidelitySettings, seqs, prompts) -> None:
        """Raise a one-line ``SwiftKVError`` unless this serves ``teacher`` on ``seqs`` / ``prompts`` with
        ``settings``."""
        if (id(teacher), settings, _ids_key(seqs), _ids_key(prompts)) in self.verified:
            return
        bad = self.problems(teacher, settings, seqs, prompts)
        if bad:
            raise SwiftKVError(f"the fidelity teacher {self.key.get('path', '')} does not serve this run: "
                               + "; ".join(bad) + "; rebuild it with: swiftkv fidelity-teacher BASE -o DIR")
        self.verified += ((id(teacher), settings, _ids_key(seqs), _ids_key(prompts)),)

    def check_for(self, teacher, tokenizer, conversations, settings: FidelitySettings) -> None:
        """``check`` on the sequences and prompts ``measure_fidelity`` will take from ``conversations`` (call it
        before other long work)."""
        self.check(teacher, settings,
                   teacher_forced_sequences(tokenizer, conversations, settings.num_sequences, settings.max_tokens),
                   generation_prompts(tokenizer, conversations, settings.num_prompts, settings.max_prompt_tokens))

    def save(self, path, overwrite: bool = False) -> None:
        from safetensors.torch import save_file

        from swiftkv.io import atomic_dir

        with atomic_dir(path, overwrite, what=TEACHER_KIND) as tmp:
            tensors = {f"hidden.{k}": h.contiguous() for k, h in enumerate(self.hidden)}
            tensors.update({f"boundary.{cut}.{k}": h.contiguous() for cut, hs in self.boundary.items()
                            for k, h in enumerate(hs)})
            save_file(tensors, str(tmp / TEACHER_TENSORS))
            meta = {**self.key, "greedy": self.greedy, "batches_shapes": [list(h.shape) for h in self.hidden]}
            (tmp / TEACHER_META).write_text(json.dumps(meta, indent=1) + "\n")

    @classmethod
    def load(cls, path) -> TeacherOutputs:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / TEACHER_META).is_file() or not (path / TEACHER_TENSORS).is_file():
            raise SwiftKVError(f"{path} is not a fidelity teacher (no {TEACHER_META} and {TEACHER_TENSORS}); build "
                               "one with: swiftkv fidelity-teacher BASE -o DIR")
        try:
            meta = json.loads((path / TEACHER_META).read_text())
            tensors = load_file(str(path / TEACHER_TENSORS))
            hidden = [tensors[f"hidden.{k}"] for k in range(len(meta["batches"]))]
            boundary = {int(cut): [tensors[f"boundary.{cut}.{k}"] for k in range(len(meta["batches"]))]
                        for cut in meta.get("boundary_layers", [])}
        except (ValueError, KeyError, OSError, SafetensorError) as e:
            raise SwiftKVError(f"{path}: unreadable fidelity teacher ({e}); rebuild it with: swiftkv "
                               "fidelity-teacher BASE -o DIR") from None
        greedy = meta.pop("greedy")
        meta.pop("batches_shapes", None)
        return cls(hidden=hidden, greedy=greedy, key={**meta, "path": str(path)}, boundary=boundary)


@torch.inference_mode()
def teacher_outputs(teacher, tokenizer, conversations, settings: FidelitySettings,
                    progress: bool = True, boundary_layers=()) -> TeacherOutputs:
    """The teacher's side of ``measure_fidelity`` on ``conversations``, computed as it computes it. ``boundary_layers``:
    also keep the stream entering each of these layers on every teacher-forced batch, which a SwiftKV student with
    that cut takes instead of running its layers < l (they are the teacher's: ``TeacherOutputs.boundary_for``)."""
    from swiftkv.distill.teacher_cache import weights_fingerprint
    from swiftkv.measure.boundary import check_cuts, frozen_fingerprints, layer_input_hooks

    layers = check_cuts(teacher, boundary_layers)
    if layers and getattr(teacher.config, "swiftkv", False):
        raise SwiftKVError("boundary states are kept by the base model (a SwiftKV student runs its own layers >= l); "
                           "give the base model to swiftkv fidelity-teacher")
    seqs = teacher_forced_sequences(tokenizer, conversations, settings.num_sequences, settings.max_tokens)
    prompts = generation_prompts(tokenizer, conversations, settings.num_prompts, settings.max_prompt_tokens)
    hidden, batches = [], []
    boundary: dict[int, list[torch.Tensor]] = {x: [] for x in layers}
    hooks = layer_input_hooks(teacher, layers, lambda x, h: boundary[x].append(h.clone()))
    try:
        for start in tqdm(range(0, len(seqs), settings.batch_size), desc="fidelity teacher: teacher-forced",
                          disable=not progress):
            ids, mask = _pad(seqs[start : start + settings.batch_size], 0, "right")
            hidden.append(teacher.get_decoder()(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state)
            batches.append(_batch_key(ids, mask))
    finally:
        for hook in hooks:
            hook.remove()
    pad_id, eos_id = _pad_and_eos(tokenizer)
    greedy = greedy_continuations(teacher, prompts, settings.new_tokens, pad_id, eos_id, settings.batch_size,
                                  None, progress, "teacher greedy")
    key = {"format": TEACHER_FORMAT, "teacher": weights_fingerprint(teacher), "settings": asdict(settings),
           "batches": batches, "prompts": _ids_key(prompts), "sequences": len(seqs),
           "dtype": str(hidden[0].dtype).replace("torch.", "") if hidden else None}
    if layers:
        key.update(boundary_layers=layers,
                   boundary_fingerprints={str(x): f for x, f in frozen_fingerprints(teacher, layers).items()})
    return TeacherOutputs(hidden=hidden, greedy=greedy, key=key, boundary=boundary)
