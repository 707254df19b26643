"""swiftkv.io, the one writer for files and directories: atomic, never replaces what it did not write, never touches
the protected places or anything through a link."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from swiftkv.io import (
    MARKER,
    OutputRefused,
    atomic_dir,
    atomic_path,
    check_output_dir,
    check_output_file,
    open_output_dir,
    read_marker,
    remove_own_files,
    write_json,
    write_text,
)


def tree(top: Path) -> dict:
    return {str(p.relative_to(top)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(top.rglob("*"))}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def write_dir(path, overwrite=False, content="new"):
    with atomic_dir(path, overwrite=overwrite, what="test output") as tmp:
        (tmp / "out.txt").write_text(content)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "x.bin").write_bytes(b"\x00")


# -- directories ---------------------------------------------------------------------------------------------------


def test_new_directory_is_marked_with_plain_modes(tmp_path):
    write_dir(tmp_path / "a" / "out")
    out = tmp_path / "a" / "out"
    assert (out / "out.txt").read_text() == "new"
    assert json.loads((out / MARKER).read_text())["what"] == "test output"
    assert mode(out) == 0o755 and mode(out / "sub") == 0o755
    assert mode(out / "out.txt") == 0o644 and mode(out / "sub" / "x.bin") == 0o644
    assert [p.name for p in tmp_path.joinpath("a").iterdir()] == ["out"]  # no temporary left beside it


def test_own_directory_is_replaced_whole(tmp_path):
    with atomic_dir(tmp_path / "out", what="test output") as tmp:
        (tmp / "stale.txt").write_text("from the old run")
    write_dir(tmp_path / "out", content="new")
    assert (tmp_path / "out" / "out.txt").read_text() == "new"
    assert not (tmp_path / "out" / "stale.txt").exists()  # listed in the old marker: ours to remove
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert json.loads((tmp_path / "out" / MARKER).read_text())["files"] == ["out.txt", "sub/x.bin"]


@pytest.mark.parametrize("legacy", ["distill.json", "swiftkv-source.json"])
def test_an_earlier_versions_output_counts_as_ours(tmp_path, legacy):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / legacy).write_text("{}")
    write_dir(tmp_path / "out")
    assert (tmp_path / "out" / "out.txt").exists()


def test_empty_directory_is_fine(tmp_path):
    (tmp_path / "out").mkdir()
    write_dir(tmp_path / "out")
    assert (tmp_path / "out" / "out.txt").exists()


def test_foreign_directory_is_refused_untouched_unless_overwrite(tmp_path):
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "chapter1.tex").write_text("years of work")
    before = tree(tmp_path)
    with pytest.raises(OutputRefused, match="was not written by swiftkv.*--overwrite"):
        write_dir(tmp_path / "thesis")
    assert tree(tmp_path) == before
    write_dir(tmp_path / "thesis", overwrite=True)
    assert not (tmp_path / "thesis" / "chapter1.tex").exists()


def test_a_file_where_a_directory_goes_is_refused(tmp_path):
    (tmp_path / "out").write_text("a file")
    with pytest.raises(OutputRefused, match="is a file, not a directory"):
        write_dir(tmp_path / "out")
    assert (tmp_path / "out").read_text() == "a file"


def test_error_inside_leaves_the_old_output_and_no_temporary(tmp_path):
    write_dir(tmp_path / "out", content="old")
    with pytest.raises(RuntimeError):
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "out.txt").write_text("half")
            raise RuntimeError("killed")
    assert (tmp_path / "out" / "out.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("where", ["cwd", "ancestor", "home", "repo", "root"])
def test_protected_places_are_never_replaced(tmp_path, monkeypatch, where):
    work = tmp_path / "project" / "work"
    work.mkdir(parents=True)
    (work / "keep.txt").write_text("mine")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".bashrc").write_text("mine")
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    target = {"cwd": Path("."), "ancestor": Path(".."), "home": tmp_path / "home", "repo": tmp_path / "repo",
              "root": Path("/")}[where]
    reason = {"cwd": "working directory", "ancestor": "contains the working directory", "home": "home directory",
              "repo": "git repository", "root": "file-system root"}[where]
    before = tree(tmp_path)
    with pytest.raises(OutputRefused, match=reason):
        write_dir(target, overwrite=True)
    with pytest.raises(OutputRefused, match=reason):
        write_text(target, "x", overwrite=True)
    assert tree(tmp_path) == before


def test_links_are_refused_and_their_targets_untouched(tmp_path):
    write_dir(tmp_path / "real", content="ours")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "file.json").write_text('{"a": 1}\n')
    (tmp_path / "filelink.json").symlink_to(tmp_path / "file.json")
    before = tree(tmp_path)
    for overwrite in (False, True):
        with pytest.raises(OutputRefused, match="symbolic link"):
            write_dir(tmp_path / "link", overwrite=overwrite)
        with pytest.raises(OutputRefused, match="symbolic link"):
            write_json(tmp_path / "filelink.json", {"a": 2}, overwrite=overwrite)
    assert tree(tmp_path) == before


def test_unwritable_place_is_one_line():
    with pytest.raises(OutputRefused, match="is not writable"):
        check_output_dir("/sys/swiftkv-test-output")
    assert not Path("/sys/swiftkv-test-output").exists()


def test_files_are_added_to_an_own_directory(tmp_path):
    out = open_output_dir(tmp_path / "results", what="results")
    write_json(out / "a.json", {"x": 1})
    assert (out / MARKER).exists() and json.loads((out / "a.json").read_text()) == {"x": 1}
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.md").write_text("mine")
    with pytest.raises(OutputRefused, match="was not written by swiftkv"):
        open_output_dir(tmp_path / "theirs")
    assert sorted(p.name for p in (tmp_path / "theirs").iterdir()) == ["notes.md"]


# -- one output never replaces another ------------------------------------------------------------------------------


def write_kind(path, what, overwrite=False, inputs=()):
    with atomic_dir(path, overwrite=overwrite, what=what, inputs=inputs) as tmp:
        (tmp / "weights.bin").write_bytes(what.encode())


def test_an_output_of_another_kind_is_refused_unless_overwrite(tmp_path):
    write_kind(tmp_path / "out", "teacher cache (sharegpt, seed 0)")
    before = tree(tmp_path)
    with pytest.raises(OutputRefused, match=r"holds a teacher cache( \(written by `.*`\))?; this command writes a "
                       "converted"):
        write_kind(tmp_path / "out", "converted SwiftKV checkpoint")
    assert tree(tmp_path) == before
    write_kind(tmp_path / "out", "teacher cache (sharegpt, seed 1)")  # the same kind: replaced
    write_kind(tmp_path / "out", "converted SwiftKV checkpoint", overwrite=True)
    assert read_marker(tmp_path / "out")["kind"] == "converted (untrained) SwiftKV student"


def test_files_the_marker_does_not_list_are_never_removed_silently(tmp_path):
    write_kind(tmp_path / "out", "converted SwiftKV checkpoint")
    (tmp_path / "out" / "sub").mkdir()
    (tmp_path / "out" / "sub" / "mine.txt").write_text("my notes")
    before = tree(tmp_path)
    with pytest.raises(OutputRefused, match="holds sub/mine.txt, which swiftkv did not write there"):
        write_kind(tmp_path / "out", "converted SwiftKV checkpoint")
    assert tree(tmp_path) == before
    out = open_output_dir(tmp_path / "out", what="converted SwiftKV checkpoint")  # adding files removes nothing
    assert (out / "sub" / "mine.txt").exists()
    with pytest.raises(OutputRefused, match="holds a converted"):
        open_output_dir(tmp_path / "out", what="lm-eval results")


@pytest.mark.parametrize("target,message", [("model", "it is the command's input"),
                                            ("model/inner", "it lies inside the command's input"),
                                            (".", "it is the working directory"),
                                            ("box", "it contains the command's input")])
def test_an_output_over_the_commands_input_is_refused_even_with_overwrite(tmp_path, monkeypatch, target, message):
    monkeypatch.chdir(tmp_path)
    write_kind(tmp_path / "model", "embedded model m")
    write_kind(tmp_path / "box" / "m", "embedded model m")
    source = "box/m" if target == "box" else "model"
    before = tree(tmp_path)
    for overwrite in (False, True):
        with pytest.raises(OutputRefused, match=message):
            write_kind(target, "converted SwiftKV checkpoint", overwrite=overwrite, inputs=[source])
    (tmp_path / "requests.json").write_text("{}")
    with pytest.raises(OutputRefused, match="it is the command's input requests.json"):
        check_output_file("requests.json", overwrite=True, inputs=["requests.json"])
    with pytest.raises(OutputRefused, match="it lies inside the command's input model"):
        check_output_file("model/weights.bin", overwrite=True, inputs=["model"])  # would replace part of it
    assert tree(tmp_path) == {**before, "requests.json": b"{}"}
    assert check_output_file("model/results.json", inputs=["model"])  # a new file beside it replaces nothing
    assert open_output_dir("model/eval", what="lm-eval results", inputs=["model"])  # nor does a folder added to


def test_a_finished_output_that_may_no_longer_replace_its_target_is_kept_beside_it(tmp_path):
    write_kind(tmp_path / "out", "converted SwiftKV checkpoint")
    with pytest.raises(OutputRefused, match=r"finished output was kept at .*out\.swiftkv-new"):
        with atomic_dir(tmp_path / "out", what="converted SwiftKV checkpoint") as tmp:
            (tmp / "weights.bin").write_bytes(b"new")
            (tmp_path / "out" / "mine.txt").write_text("added while it ran")
    assert (tmp_path / "out" / "mine.txt").exists() and (tmp_path / "out" / "weights.bin").exists()
    assert (tmp_path / "out.swiftkv-new" / "weights.bin").read_bytes() == b"new"


@pytest.mark.parametrize("files,kind", [(["distill.json", "model.safetensors"], "distilled SwiftKV student"),
                                        (["distill.json"], "distillation log (--log-only)"),
                                        (["swiftkv-source.json"], "prepared base model")])
def test_an_earlier_versions_output_has_its_kind_read_from_its_layout(tmp_path, files, kind):
    (tmp_path / "out").mkdir()
    for name in files:
        (tmp_path / "out" / name).write_text("{}")
    assert read_marker(tmp_path / "out")["kind"] == kind
    with pytest.raises(OutputRefused, match=f"holds a {re.escape(kind)}"):
        write_kind(tmp_path / "out", "teacher cache (sharegpt, seed 0)")


# -- files -----------------------------------------------------------------------------------------------------


def test_file_is_written_atomically_with_a_plain_mode(tmp_path):
    write_json(tmp_path / "r.json", {"results": [1]})
    assert mode(tmp_path / "r.json") == 0o644
    write_json(tmp_path / "r.json", {"results": [2], "hardware": {}})  # an earlier result of the same kind
    assert json.loads((tmp_path / "r.json").read_text())["results"] == [2]
    with pytest.raises(ZeroDivisionError):
        with atomic_path(tmp_path / "r.json") as tmp:
            tmp.write_text("{half")
            1 / 0
    assert json.loads((tmp_path / "r.json").read_text())["results"] == [2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_foreign_json_is_kept_and_the_result_saved_beside_it(tmp_path):
    package = tmp_path / "package.json"
    package.write_text('{"name": "web", "version": "1.0", "dependencies": {}}\n')
    with pytest.raises(OutputRefused, match=r"left it untouched and wrote the new output to .*package\.swiftkv-new\.json"):
        write_json(package, {"results": [], "hardware": {}})
    assert json.loads(package.read_text())["name"] == "web"
    assert json.loads((tmp_path / "package.swiftkv-new.json").read_text()) == {"results": [], "hardware": {}}
    write_json(package, {"results": []}, overwrite=True)
    assert json.loads(package.read_text()) == {"results": []}


def test_text_in_a_json_path_is_refused_before_any_work(tmp_path):
    (tmp_path / "r.json").write_text("my notes\n")
    with pytest.raises(OutputRefused, match="is not a swiftkv .json file"):
        with atomic_path(tmp_path / "r.json"):
            raise AssertionError("the block must not run")
    assert (tmp_path / "r.json").read_text() == "my notes\n"


def test_csv_replaced_only_under_the_same_header(tmp_path):
    write_text(tmp_path / "t.csv", "a,b\n1,2\n")
    write_text(tmp_path / "t.csv", "a,b\n3,4\n")
    assert (tmp_path / "t.csv").read_text() == "a,b\n3,4\n"
    (tmp_path / "other.csv").write_text("name,email\nme,me@x\n")
    with pytest.raises(OutputRefused, match="left it untouched"):
        write_text(tmp_path / "other.csv", "a,b\n1,2\n")
    assert (tmp_path / "other.csv").read_text() == "name,email\nme,me@x\n"


def test_a_directory_where_a_file_goes_is_refused(tmp_path):
    (tmp_path / "r.json").mkdir()
    with pytest.raises(OutputRefused, match="is a directory"):
        write_json(tmp_path / "r.json", {}, overwrite=True)


def test_remove_own_files_removes_only_what_it_names(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "checkpoint.pt").write_bytes(b"x")
    (d / "user.txt").write_text("mine")
    remove_own_files(d, ["checkpoint.pt", "train_log.jsonl"])
    assert sorted(p.name for p in d.iterdir()) == ["user.txt"]
    (d / "user.txt").unlink()
    (d / "checkpoint.pt").write_bytes(b"x")
    remove_own_files(d, ["checkpoint.pt"])
    assert not d.exists()


# -- the commands use it ---------------------------------------------------------------------------------------


def test_convert_writes_a_marked_checkpoint_with_plain_modes_and_replaces_only_its_own(tmp_path):
    from swiftkv.cli import main
    from tests.conftest import tiny_base, tiny_tokenizer

    tiny_base().save_pretrained(tmp_path / "base")
    tiny_tokenizer().save_pretrained(tmp_path / "base")
    out = tmp_path / "student"
    assert main(["convert", str(tmp_path / "base"), "-l", "2", "-o", str(out)]) == 0
    assert (out / MARKER).exists()
    assert {mode(p) for p in out.iterdir()} == {0o644}
    assert main(["convert", str(tmp_path / "base"), "-l", "3", "-o", str(out)]) == 0  # ours: replaced
    assert json.loads((out / "config.json").read_text())["num_key_value_layers"] == 3
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "data.csv").write_text("x\n")
    assert main(["convert", str(tmp_path / "base"), "-l", "2", "-o", str(tmp_path / "mine")]) == 2
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["data.csv"]
