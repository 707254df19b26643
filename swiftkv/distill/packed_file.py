"""The packed training rows on disk, memory-mapped: tokenised and packed once (rank 0), read by every rank.

A folder of ``.npy`` arrays: ``offsets`` (int64, rows + 1), and per token ``input_ids``, ``position_ids``, ``labels``
(int32) and, when the stream knows them, ``assistant`` (bool). ``PackedRows`` opens them with ``mmap_mode="r"`` and
gives ``(Pack, None)`` items by index or slice, building only the packs asked for, so a rank's memory holds the rows
it trains, not the corpus.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from swiftkv.data.packing import Pack

ARRAYS = ("offsets", "input_ids", "position_ids", "labels")


def write_packed(path: Path, packs: list[Pack]) -> None:
    """The packs as memory-mappable arrays in ``path`` (written to a temporary folder, then renamed)."""
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    remove_packed(tmp)  # our own scratch folder of an interrupted write
    tmp.mkdir(parents=True)
    lengths = np.array([len(p) for p in packs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    np.save(tmp / "offsets.npy", offsets)
    for name in ARRAYS[1:]:
        np.save(tmp / f"{name}.npy", np.fromiter((t for p in packs for t in getattr(p, name)), dtype=np.int32,
                                                 count=int(offsets[-1])))
    if packs and all(p.assistant is not None for p in packs):
        np.save(tmp / "assistant.npy", np.fromiter((a for p in packs for a in p.assistant), dtype=np.bool_,
                                                   count=int(offsets[-1])))
    remove_packed(path)  # an earlier run's (same settings: a resumed run)
    os.replace(tmp, path)


def remove_packed(path: Path) -> None:
    """Delete a ``write_packed`` folder: its own files, then the folder if that left it empty (never recursive)."""
    from swiftkv.io import remove_own_files

    remove_own_files(path, [f"{name}.npy" for name in (*ARRAYS, "assistant")])


class PackedRows(Sequence):
    """``(Pack, None)`` items of a ``write_packed`` folder, memory-mapped (the trainer's item type without a cache)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.arrays = {name: np.load(self.path / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
        assistant = self.path / "assistant.npy"
        self.assistant = np.load(assistant, mmap_mode="r") if assistant.exists() else None

    def __len__(self) -> int:
        return len(self.arrays["offsets"]) - 1

    def pack(self, i: int) -> Pack:
        a, b = int(self.arrays["offsets"][i]), int(self.arrays["offsets"][i + 1])
        return Pack(input_ids=self.arrays["input_ids"][a:b].tolist(),
                    position_ids=self.arrays["position_ids"][a:b].tolist(),
                    labels=self.arrays["labels"][a:b].tolist(),
                    assistant=None if self.assistant is None else self.assistant[a:b].tolist())

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [(self.pack(i), None) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.pack(index), None
