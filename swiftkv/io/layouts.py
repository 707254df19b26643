"""Whether an existing file looks like a swiftkv output of its kind (``swiftkv.io``'s second promise): before the
new output exists, by its suffix's format (``could_be_ours``); once it exists, by sharing its layout
(``same_layout``: JSON objects sharing at least half of the existing top-level keys, the same first line of a
table, the same image type)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SAME_FIRST_LINE = {".csv", ".tsv", ".md", ".yaml", ".yml"}
IMAGE_MAGIC = {".png": b"\x89PNG", ".pdf": b"%PDF", ".svg": b"<"}


def could_be_ours(path: Path) -> bool:
    """Before the new output exists: could ``path`` have been written by us (right format for its suffix)?"""
    if path.stat().st_size == 0:
        return True
    suffix = path.suffix.lower()
    try:
        head = path.open("rb").read(1 << 16)
        if suffix in IMAGE_MAGIC:
            return head.startswith(IMAGE_MAGIC[suffix])
        text = head.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if suffix == ".json":
        try:
            return isinstance(json.loads(path.read_text()), (dict, list))
        except (ValueError, OSError):
            return False
    return suffix in SAME_FIRST_LINE | {".jsonl", ".txt", ".html"} and "\x00" not in text


def same_layout(existing: Path, new: Path) -> bool:
    """After the new output exists: does the existing file look like an earlier version of it?"""
    if existing.stat().st_size == 0:
        return True
    suffix = existing.suffix.lower()
    try:
        if suffix in IMAGE_MAGIC:
            return existing.open("rb").read(8)[:4] == new.open("rb").read(8)[:4]
        if suffix in (".json", ".jsonl"):
            def first(p: Path) -> Any:
                text = p.read_text()
                return json.loads(text.splitlines()[0] if suffix == ".jsonl" and text else text)

            old, cur = first(existing), first(new)
            if isinstance(old, dict) and isinstance(cur, dict):
                shared = len(set(old) & set(cur))
                return shared >= 1 and 2 * shared >= len(old)
            return isinstance(old, list) and isinstance(cur, list)
        if suffix in SAME_FIRST_LINE:
            def line(p: Path) -> str:
                with p.open() as f:
                    return f.readline()

            return line(existing) == line(new)
        return existing.read_bytes() == new.read_bytes()
    except (OSError, ValueError, UnicodeDecodeError, IndexError):
        return False
