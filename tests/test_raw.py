"""Raw folders (analysis.raw): collected from results/ with a manifest that says what computed them and what they
say without their wall times; carried back into results/ (restore) without replacing anything; and the committed
reports/raw/ laid out as docs/reproducing.md says (nothing in progress, one archive nothing reads, no doubled names)."""

import gzip
import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from analysis.raw import (
    COMPRESS_ABOVE,
    MANIFEST,
    RawError,
    collect,
    evidence_sha256,
    main,
    raw_path,
    restore,
    uncommitted,
    verify,
)
from analysis.raw_summary import computed_at, dirty_mark, folders, layout_problems, summary

REPO = Path(__file__).resolve().parents[1]


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
    root = Path("results/reports/raw/serving/throughput")
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
    root, texts = raw
    big = raw_path(root, list(texts)[1]).with_name("lm_eval.json.gz")
    big.write_bytes(gzip.compress(b'{"samples": []}', mtime=0))
    manifest = json.loads((root / MANIFEST).read_text())
    entry = manifest["files"]["eval/m/v/native/lm_eval.json.gz"]
    entry["sha256"] = hashlib.sha256(big.read_bytes()).hexdigest()
    (root / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(RawError, match="does not hold the bytes"):
        restore(root)


def test_a_leading_folder_named_like_the_study_is_not_doubled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for src in ("results/seeds/m/v/seed-1/native/fidelity.json", "results/eval/m/base/native/lm_eval.json"):
        Path(src).parent.mkdir(parents=True)
        Path(src).write_text("{}")
    manifest = collect(["results/seeds/m/v/seed-1/native/fidelity.json", "results/eval/m/base/native/lm_eval.json"],
                       "results/reports/raw/seeds", "h", "c")
    assert sorted(manifest["files"]) == ["eval/m/base/native/lm_eval.json", "m/v/seed-1/native/fidelity.json"]
    assert raw_path("results/reports/raw/seeds", "results/seeds/m/x.json") == Path("results/reports/raw/seeds/m/x.json")
    # written under a temporary name and renamed into place (rule raw_seeds: swiftkv.io.atomic_dir): the same layout
    tmp = collect(["results/seeds/m/v/seed-1/native/fidelity.json"], "results/reports/raw/.seeds.tmp-1", "h", "c",
                  study="seeds")
    assert list(tmp["files"]) == ["m/v/seed-1/native/fidelity.json"]
    assert raw_path("reports/raw/table2", "results/eval/m/x.json") == Path("reports/raw/table2/eval/m/x.json")
    # two sources that would land on one stored path are refused, not overwritten
    Path("results/seeds/eval/m/base/native").mkdir(parents=True)
    Path("results/seeds/eval/m/base/native/lm_eval.json").write_text('{"other": 1}')
    with pytest.raises(RawError, match="would both be stored as"):
        collect(["results/eval/m/base/native/lm_eval.json", "results/seeds/eval/m/base/native/lm_eval.json"],
                tmp_path / "x" / "seeds", "h", "c")


def test_evidence_leaves_out_wall_times_and_dates_but_not_results():
    lm_eval = {"results": {"t": {"acc,none": 0.5}}, "date": 1.0, "git_hash": "abc", "pretty_env_info": "cpu A",
               "swiftkv": {"seconds_lm_eval": 10.0, "threads": 2, "kv_cache": "native"}}
    rerun = {**lm_eval, "date": 2.0, "git_hash": "def", "pretty_env_info": "cpu B",
             "swiftkv": {"seconds_lm_eval": 99.0, "threads": 16, "kv_cache": "native"}}
    assert evidence_sha256(json.dumps(lm_eval).encode(), "lm_eval.json") == \
        evidence_sha256(json.dumps(rerun, indent=1).encode(), "lm_eval.json.gz")
    changed = {**lm_eval, "results": {"t": {"acc,none": 0.51}}}
    assert evidence_sha256(json.dumps(changed).encode(), "lm_eval.json") != \
        evidence_sha256(json.dumps(lm_eval).encode(), "lm_eval.json")
    other_kv = {**lm_eval, "swiftkv": {**lm_eval["swiftkv"], "kv_cache": "fp8"}}  # a sibling of a volatile field
    assert evidence_sha256(json.dumps(other_kv).encode(), "x.json") != evidence_sha256(json.dumps(lm_eval).encode(),
                                                                                        "x.json")
    log = b'{"event": "step", "loss": 1.5, "step_s": 0.3}\n{"event": "eval", "heldout_kl": 0.9}\n'
    assert evidence_sha256(log, "train_log.jsonl") == evidence_sha256(log.replace(b"0.3", b"7.1"), "train_log.jsonl")
    assert evidence_sha256(log, "train_log.jsonl") != evidence_sha256(log.replace(b"0.9", b"0.8"), "train_log.jsonl")
    # a timing study's timings are its measurements: nested timings are evidence
    serve = {"results": [{"variant": "base", "elapsed_s": 1.0, "seconds": 2.0}]}
    slower = {"results": [{"variant": "base", "elapsed_s": 1.5, "seconds": 2.0}]}
    assert evidence_sha256(json.dumps(serve).encode(), "t.json") != evidence_sha256(json.dumps(slower).encode(),
                                                                                     "t.json")


def _git(repo, *args):
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()


def test_a_manifest_records_profile_own_commit_and_the_uncommitted_diff(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _git(tmp_path, "init", "-q")
    Path("code.py").write_text("x = 1\n")
    _git(tmp_path, "add", "code.py")
    _git(tmp_path, "commit", "-qm", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert uncommitted(tmp_path) is None
    Path("code.py").write_text("x = 2\n")  # a change of tracked code: the diff is recorded
    dirty = uncommitted(tmp_path)
    assert dirty["files"] == ["code.py"] and len(dirty["diff_sha256"]) == 64
    src = Path("results/eval/m/v/native/lm_eval.json")
    src.parent.mkdir(parents=True)
    src.write_text(json.dumps({"results": {}, "git_hash": head[:7]}))  # lm-eval names the commit it ran at
    m = collect([str(src)], "results/reports/raw/table2", "h", f"{head}+dirty", repo=tmp_path, profile="default",
                overrides={"seed": 3}, dirty=dirty)
    assert (m["profile"], m["overrides"], m["uncommitted"]) == ("default", {"seed": 3}, dirty)
    assert m["files"]["eval/m/v/native/lm_eval.json"]["computed_at"] == head  # the short id made full
    assert computed_at("results/reports/raw/table2") == [head]
    assert "diff sha256" in dirty_mark(m) and dirty_mark({"collected_at": head}) == ""
    old_style = {"collected_at": f"{head}+dirty"}  # a folder collected before the diff was recorded is marked too
    assert "not recorded" in dirty_mark(old_style)
    entry = summary("results/reports")["table2"]
    assert entry["uncommitted changes"] == dirty_mark(m) and entry["files"] == 1


def test_summary_lists_nested_raw_folders_and_leaves_the_archive_out(raw):
    root, _ = raw
    collect([], Path("results/reports/raw/table2"), "hash", "abc")
    collect([], Path("results/reports/raw/archive/superseded/old"), "hash", "old")
    assert summary("results/reports") == {"serving/throughput": {"collected at": "c0ffee", "config hash": "hash",
                                                                 "files": 2},
                                          "table2": {"collected at": "abc", "config hash": "hash", "files": 0}}


def test_a_file_named_manifest_inside_a_raw_folder_is_one_of_its_files(tmp_path, monkeypatch):
    """The suite's raw folder holds the tasks' own manifest (tasks/bigbench/manifest.json): it is a file of the
    folder, not a raw folder of its own, for the summary, publish's folder list and the layout check."""
    monkeypatch.chdir(tmp_path)
    src = Path("results/tasks/bigbench/manifest.json")
    src.parent.mkdir(parents=True)
    src.write_text('{"tasks": {}}')
    collect([str(src)], Path("reports/raw/suite"), "h", "c")
    assert folders("reports") == [Path("reports/raw/suite")]
    assert summary("reports") == {"suite": {"collected at": "c", "config hash": "h", "files": 1}}
    assert layout_problems(tmp_path / "reports") == []


def test_the_command_line_collects_only_into_a_run_and_restores_and_verifies(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    src = Path("results/bench/serve/hf-cpu/m/latency.json")
    src.parent.mkdir(parents=True)
    src.write_text('{"rows": []}')
    dest = "results/reports/raw/x"
    assert main(["collect", dest, str(src), "--config-hash", "h"]) == 0
    assert verify(dest) == []
    for argv, why in (([dest], "exists"), (["reports/raw/y"], "written by python -m analysis.publish only")):
        with pytest.raises(SystemExit) as exit_:  # a raw folder is written once; never into the committed evidence
            main(["collect", *argv, str(src), "--config-hash", "h"])
        assert exit_.value.code == 2 and why in capsys.readouterr().err
    assert not Path("reports").exists()
    with pytest.raises(SystemExit) as exit_:
        main(["collect", "results/reports/raw/y", "elsewhere.json", "--config-hash", "h"])
    assert exit_.value.code == 2 and "not a file under results/" in capsys.readouterr().err
    src.unlink()
    assert main(["restore", dest]) == 0 and src.read_text() == '{"rows": []}'
    assert "1 files restored" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["restore", "results"])
    assert exit_.value.code == 2 and "not a raw folder" in capsys.readouterr().err
    Path(dest, "stray.json").write_text("{}")
    assert main(["verify", dest]) == 1 and "stray.json: not in the manifest" in capsys.readouterr().out


# -- the committed reports/raw/ --------------------------------------------------------------------------------


def test_the_committed_raw_folders_are_laid_out_as_documented():
    assert layout_problems(REPO / "reports") == []


def test_the_layout_check_finds_each_kind_of_violation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = Path("results/long_context/m/base.json")
    src.parent.mkdir(parents=True)
    src.write_text("{}")
    reports = tmp_path / "reports"
    collect([str(src)], reports / "raw" / "long_context", "h", "c")
    collect([str(src)], reports / "raw" / "archive" / "superseded" / "long-context-old", "h", "c")
    assert layout_problems(reports) == []
    collect([str(src)], reports / "raw" / "in-progress" / "serving-hf-cpu", "h", "c")  # in progress: not committed
    collect([str(src)], reports / "raw" / "archive" / "drafts" / "x", "h", "c")  # archive kinds: superseded, pilots
    (reports / "raw" / "stray.json").write_text("{}")  # a file outside any raw folder
    doubled = reports / "raw" / "flops"  # results/flops/m.json stored as raw/flops/flops/m.json
    (doubled / "flops").mkdir(parents=True)
    (doubled / "flops" / "m.json").write_text("{}")
    (doubled / MANIFEST).write_text(json.dumps({"collected_at": "c", "config_hash": "h", "files": {"flops/m.json": {
        "source": "results/flops/m.json", "sha256": hashlib.sha256(b"{}").hexdigest()}}}))
    (reports / "raw" / "long_context" / "m" / "base.json").write_text('{"changed": 1}')  # no longer as collected
    problems = "\n".join(layout_problems(reports))
    for expected in ("in-progress/serving-hf-cpu: not a raw folder of the evidence",
                     "archive/drafts/x: the archive holds",
                     "stray.json: not in a raw folder", "flops/flops/m.json: doubled folder name",
                     "long_context: m/base.json: changed since it was collected"):
        assert expected in problems, problems


def test_nothing_reads_the_archive():
    """The archive is kept for the record: no code or rule names it (only analysis.raw, which lays it out)."""
    hits = [p for d in ("analysis", "workflow", "swiftkv", "bin", "notebooks") for p in (REPO / d).rglob("*")
            if p.is_file() and p.suffix in (".py", ".smk", ".ipynb", "") and p.name != "raw.py"
            and ("raw/archive" in p.read_text(errors="ignore") or "superseded/long-context" in p.read_text(
                errors="ignore"))]
    assert hits == []
