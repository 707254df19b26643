"""ShareGPT loading: truncated-JSON recovery, skipped records counted, the split by original conversation."""

from __future__ import annotations

import json

from swiftkv.data import load_sharegpt, split_of


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
