"""Raw folders carried back into results/ (analysis.raw.restore and its command line): a clone continues a run whose
finished jobs were committed, and nothing already there is ever replaced."""

import gzip
import json
from pathlib import Path

import pytest

from analysis.raw import COMPRESS_ABOVE, MANIFEST, RawError, collect, main, raw_path, restore, summary, verify


@pytest.fixture()
def raw(tmp_path, monkeypatch):
    """A raw folder of two results (one large enough to be stored compressed), collected and then removed from
    results/ as in a fresh clone."""
    monkeypatch.chdir(tmp_path)
    small, big = Path("results/bench/serve/hf-cpu/m/throughput.json"), Path("results/eval/m/v/native/lm_eval.json")
    for path, text in ((small, '{"rows": [1]}'), (big, json.dumps({"samples": ["x" * 100] * (COMPRESS_ABOVE // 50)}))):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    texts = {small: small.read_bytes(), big: big.read_bytes()}
    root = Path("reports/raw/in-progress/serving")
    collect([str(small), str(big)], root, "hash", "c0ffee")
    assert (raw_path(root, big).with_name("lm_eval.json.gz")).is_file()  # stored compressed
    small.unlink()
    big.unlink()
    return root, texts


def test_restore_writes_the_collected_bytes_back(raw):
    root, texts = raw
    written = restore(root)
    assert sorted(map(str, written)) == sorted(map(str, texts))
    assert all(path.read_bytes() == data for path, data in texts.items())
    assert restore(root) == []  # the same files are there: nothing to do, nothing rewritten


def test_restore_never_replaces_a_different_file_and_writes_nothing_then(raw):
    root, texts = raw
    small, big = list(texts)
    big.parent.mkdir(parents=True, exist_ok=True)
    big.write_text('{"mine": true}')
    with pytest.raises(RawError, match="exists and differs"):
        restore(root)
    assert big.read_text() == '{"mine": true}' and not small.exists()  # checked first, then written: all or none


def test_restore_refuses_a_damaged_folder(raw):
    root, texts = raw
    stored = raw_path(root, list(texts)[0])
    stored.write_text('{"rows": [2]}')
    with pytest.raises(RawError, match="damaged.*changed since it was collected"):
        restore(root)
    assert not any(path.exists() for path in texts)


def test_restore_checks_a_stored_file_against_its_source(raw):
    """A manifest edited to match changed bytes still fails: the source's sha256 decides."""
    import hashlib

    root, texts = raw
    big = raw_path(root, list(texts)[1]).with_name("lm_eval.json.gz")
    big.write_bytes(gzip.compress(b'{"samples": []}', mtime=0))
    manifest = json.loads((root / MANIFEST).read_text())
    entry = manifest["files"]["eval/m/v/native/lm_eval.json.gz"]
    entry["sha256"] = hashlib.sha256(big.read_bytes()).hexdigest()
    (root / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(RawError, match="does not hold the bytes"):
        restore(root)


def test_summary_lists_nested_raw_folders(raw):
    root, _ = raw
    collect([], Path("reports/raw/table2"), "hash", "abc")
    assert summary("reports") == {"in-progress/serving": {"collected at": "c0ffee", "config hash": "hash", "files": 2},
                                  "table2": {"collected at": "abc", "config hash": "hash", "files": 0}}


def test_command_line_collect_restore_verify(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    src = Path("results/bench/serve/hf-cpu/m/latency.json")
    src.parent.mkdir(parents=True)
    src.write_text('{"rows": []}')
    assert main(["collect", "reports/raw/x", str(src), "--config-hash", "h"]) == 0
    assert verify("reports/raw/x") == []
    with pytest.raises(SystemExit) as exit_:  # a raw folder is written once
        main(["collect", "reports/raw/x", str(src), "--config-hash", "h"])
    assert exit_.value.code == 2 and "exists" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["collect", "reports/raw/y", "elsewhere.json", "--config-hash", "h"])
    assert exit_.value.code == 2 and "not a file under results/" in capsys.readouterr().err
    src.unlink()
    assert main(["restore", "reports/raw/x"]) == 0 and src.read_text() == '{"rows": []}'
    assert "1 files restored" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["restore", "reports"])
    assert exit_.value.code == 2 and "not a raw folder" in capsys.readouterr().err
    Path("reports/raw/x/stray.json").write_text("{}")
    assert main(["verify", "reports/raw/x"]) == 1 and "stray.json: not in the manifest" in capsys.readouterr().out
