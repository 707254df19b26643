"""ShareGPT loading: truncated-JSON recovery, skipped records counted, the split by original conversation."""

from __future__ import annotations

import json

from swiftkv.data.conversations import load_sharegpt, split_of


def test_truncated_json_recovery(tmp_path):
    records = [
        {"id": "a_0", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"id": "a_1", "conversations": [{"from": "human", "value": "more"}, {"from": "gpt", "value": "sure"}]},
        {"id": "b", "conversations": []},  # empty
        {"id": "c", "conversations": [{"from": "alien", "value": "?"}]},  # unknown role
        {"id": "d", "conversations": [{"from": "gpt", "value": "orphan"}, {"from": "human", "value": "q"},
                                      {"from": "gpt", "value": ""}, {"from": "gpt", "value": "a"}]},
        {"conversations": [{"from": "human", "value": "no id"}]},  # malformed
    ]
    text = json.dumps(records, indent=1)
    partial = json.dumps({"id": "z", "conversations": [{"from": "human", "value": "cut here"}]})
    path = tmp_path / "sharegpt.json"
    path.write_text(text[:-2] + ",\n " + partial[:25])  # drop the closing bracket, append half a record
    convs, report = load_sharegpt(path)
    assert report.records_recovered == 6
    assert report.bytes_dropped == 25
    assert [c.id for c in convs] == ["a_0", "a_1", "d"]
    assert report.kept == 3
    assert report.skipped == {"empty (no user and assistant turn)": 1, "unknown role": 1, "malformed record": 1}
    d = convs[2].messages
    assert [m["role"] for m in d] == ["user", "assistant"] and d[1]["content"] == "a"


def test_split_keeps_conversation_parts_together_and_is_stable():
    assert split_of("XyZ_0") == split_of("XyZ_1") == split_of("XyZ_17")
    sides = [split_of(f"conv{i}") for i in range(4000)]
    share = sides.count("heldout") / len(sides)
    assert 0.03 < share < 0.07  # 5% held out by default
    assert sides == [split_of(f"conv{i}") for i in range(4000)]
    assert split_of("conv1", heldout_percent=100) == "heldout" and split_of("conv1", heldout_percent=0) == "train"


# -- tokenisation and packing ------------------------------------------------------------------------------------

import pytest  # noqa: E402

from swiftkv.data.conversations import Conversation, load_hub_conversations, split_conversations  # noqa: E402
from swiftkv.data.packing import IGNORE_INDEX, PackReport, collate_packs, pack_conversations  # noqa: E402
from tests.conftest import tiny_conversations, tiny_tokenizer  # noqa: E402


def test_packing_is_deterministic_for_a_seed_and_respects_max_length_and_budget():
    tok, convs = tiny_tokenizer(), tiny_conversations(60)
    report = PackReport()
    packs = pack_conversations(convs, tok, 100, token_budget=1000, seed=7, report=report)
    again = pack_conversations(convs, tok, 100, token_budget=1000, seed=7)
    other = pack_conversations(convs, tok, 100, token_budget=1000, seed=8)
    assert [p.input_ids for p in packs] == [p.input_ids for p in again]
    assert [p.conversation_ids for p in packs] != [p.conversation_ids for p in other]
    assert all(len(p) <= 100 for p in packs)
    assert sum(len(p) for p in packs) == report.tokens and 999 <= report.tokens <= 1000
    assert report.packs == len(packs) and report.conversations == sum(len(p.conversation_ids) for p in packs)


def test_a_pack_holds_whole_rendered_conversations_with_restarting_positions():
    tok, convs = tiny_tokenizer(), tiny_conversations(10)
    packs = pack_conversations(convs, tok, 250, seed=0)
    by_id = {c.id: c for c in convs}
    p = next(p for p in packs if len(p.conversation_ids) >= 2)
    start = 0
    for cid in p.conversation_ids:
        ids = tok.apply_chat_template(by_id[cid].messages, tokenize=True, return_dict=True)["input_ids"]
        n = len(ids)
        assert p.input_ids[start:start + n] == ids
        assert p.position_ids[start:start + n] == list(range(n))
        assert p.labels[start:start + n] == ids[1:] + [IGNORE_INDEX]  # no target across conversations
        start += n
    assert start == len(p)


def test_truncated_and_skipped_conversations_are_counted():
    tok = tiny_tokenizer()
    long = Conversation("long", [{"role": "user", "content": " ".join(["w1"] * 80)},
                                 {"role": "assistant", "content": "w2"}])
    short = Conversation("short", [{"role": "user", "content": "w3"}, {"role": "assistant", "content": "w4"}])

    class Picky:  # a template that rejects one conversation
        chat_template = "x"
        pad_token_id = 0

        def apply_chat_template(self, messages, **kw):
            if messages[0]["content"] == "bad":
                raise ValueError("roles must alternate")
            return tok.apply_chat_template(messages, **kw)

    bad = Conversation("bad", [{"role": "user", "content": "bad"}, {"role": "assistant", "content": "w5"}])
    report = PackReport()
    packs = pack_conversations([long, short, bad], Picky(), 32, seed=0, report=report)
    assert report.truncated == 1 and report.truncated_tokens == (80 + 5) - 32  # "<user> w1 x80 </s> <assistant> w2 </s>"
    assert report.skipped == {"chat template error": 1}
    assert report.conversations == 2 and sorted(len(p) for p in packs) == [6, 32]


def test_collate_pads_with_a_separate_masked_segment():
    tok = tiny_tokenizer()
    packs = pack_conversations(tiny_conversations(20), tok, 120, seed=0)[:2]
    b = collate_packs(packs, pad_token_id=0)
    n0, n1 = len(packs[0]), len(packs[1])
    width = max(n0, n1)
    short = 0 if n0 < n1 else 1
    n = min(n0, n1)
    assert b["input_ids"].shape == (2, width)
    assert b["loss_mask"][short].sum() == n and b["loss_mask"][1 - short].all()
    assert b["position_ids"][short, n:].tolist() == list(range(width - n))  # padding: its own segment
    assert (b["labels"][short, n:] == IGNORE_INDEX).all()


def test_split_conversations_by_original_id():
    convs = [Conversation(f"x{i}_{part}", []) for i in range(300) for part in range(2)]
    train, heldout = split_conversations(convs)
    assert len(train) + len(heldout) == 600 and heldout
    assert {c.group_id for c in train}.isdisjoint({c.group_id for c in heldout})


def test_hub_datasets_are_read_through_datasets_without_network(monkeypatch):
    """The paper profile's three datasets, mocked: each record format becomes a Conversation."""
    import datasets

    rows = {
        "HuggingFaceH4/ultrachat_200k": [
            {"prompt_id": "u1", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
            {"prompt_id": "u2", "messages": [{"role": "user", "content": "only a question"}]},
        ],
        "teknium/OpenHermes-2.5": [
            {"id": None, "conversations": [{"from": "system", "value": "be nice"}, {"from": "human", "value": "q"},
                                           {"from": "gpt", "value": "a"}]},
        ],
        "Open-Orca/SlimOrca": [
            {"conversations": [{"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"}]},
        ],
    }
    calls = []

    def fake_load_dataset(name, split):
        calls.append((name, split))
        return rows[name]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    convs, report = load_hub_conversations()
    assert calls == [("HuggingFaceH4/ultrachat_200k", "train_sft"), ("teknium/OpenHermes-2.5", "train"),
                     ("Open-Orca/SlimOrca", "train")]
    assert [c.id for c in convs] == ["HuggingFaceH4/ultrachat_200k:u1", "teknium/OpenHermes-2.5:0", "Open-Orca/SlimOrca:0"]
    assert convs[1].messages[0] == {"role": "system", "content": "be nice"}
    assert report.records_recovered == 4 and report.kept == 3
    assert report.skipped == {"empty (no user and assistant turn)": 1}


def test_hub_unreachable_is_one_line(monkeypatch):
    import datasets

    from swiftkv import SwiftKVError

    def offline(name, split):
        raise ConnectionError("Couldn't reach the Hub\nlong trace")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(SwiftKVError, match="could not load HuggingFaceH4/ultrachat_200k") as err:
        load_hub_conversations()
    assert "\n" not in str(err.value)
