"""Safe, atomic output: the one writer for files and directories that every command and rule uses.

Two promises:

1. **Nothing half-written.** A file or directory is built under a temporary name beside its target and renamed into
   place only when it is complete; an interrupted or failed write leaves the target as it was.
2. **Nothing lost.** A target this package did not write is refused with one line (``OutputRefused``, exit 2 from
   the CLI), untouched, unless the caller passes ``overwrite=True`` (the CLI's ``--overwrite``):

   - a directory is ours when it is empty or carries the marker ``.swiftkv-output.json`` that this module writes
     into every directory it produces (or the layout of an earlier version's output: a prepared model's
     ``swiftkv-source.json``, a distilled checkpoint's ``distill.json``);
   - a file is ours when it is empty or has the layout of the new output: JSON objects sharing at least half of the
     existing file's top-level keys, the same first line for CSV / TSV / Markdown, the same image type for figures.
     That is only known once the new output exists, so when a finished output meets a foreign file, the output
     is kept beside it (``NAME.swiftkv-new.SUFFIX``) and the error says so: hours of work are not thrown away.

   Some paths are never removed, ``overwrite`` or not: ``/``, the home directory, the working directory and its
   ancestors, a git repository (a directory holding ``.git``), and anything through a symbolic link (a link as the
   target is refused: give the real path).

3. **One output never replaces another.** The marker records what wrote the directory: its kind (``kind_of``: a
   student, a distilled student, a teacher cache, an evaluation, ...), the command line, and the files it wrote.
   Replacing a directory of another kind, or one holding files its marker does not list (put there by a user), needs
   ``overwrite``. A command's output may never be, contain or lie inside one of its inputs (``inputs``), not even
   with ``overwrite``: ``convert plain -o plain`` would replace the model it reads.

Files get mode ``0o666 & ~umask``, directories ``0o777 & ~umask`` (``tempfile`` would leave them owner-only).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from swiftkv.errors import SwiftKVError
from swiftkv.io.layouts import could_be_ours, same_layout

MARKER = ".swiftkv-output.json"
LEGACY_MARKERS = ("swiftkv-source.json", "distill.json")  # outputs written before the marker existed
# The kind of a directory output, from the first words of its description (``what``), for this version's markers and
# earlier ones alike. Outputs of different kinds never replace each other without ``overwrite``.
KINDS = (
    ("embedded model", "prepared base model"),
    ("converted SwiftKV checkpoint", "converted (untrained) SwiftKV student"),
    ("distilled checkpoint", "distilled SwiftKV student"),
    ("distillation log", "distillation log (--log-only)"),
    ("distillation checkpoints", "distillation checkpoint folder"),
    ("teacher cache", "teacher cache"),
    ("fidelity teacher", "fidelity teacher"),
    ("boundary states", "boundary states"),
    ("arctic-inference checkpoint", "arctic-inference export"),
    ("lm-eval results", "evaluation"),
    ("vLLM raw outputs", "benchmark work folder"),
    ("served-fidelity", "benchmark work folder"),
    ("BIG-bench task.json", "BIG-bench task files"),
    ("generated task.json", "generated task files"),
    ("MMLU task.json", "MMLU task files"),
    ("OLMES task.json", "OLMES task files"),
    ("installed task.json", "installed-wheel task files"),
    ("lm-eval tasks", "lm-eval task folder"),
    ("lm-eval perplexity task", "lm-eval task folder"),
    ("raw results", "raw results folder"),
)
# Set by the command line (``swiftkv.cli.main``): the command recorded in the markers it writes.
COMMAND: str | None = None


class OutputRefused(SwiftKVError):
    """A target exists and may not be replaced (not ours, protected, a link, or the wrong kind)."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fix_modes(path: Path) -> None:
    """Give ``path`` (and, for a directory, everything below it) the modes a plain ``open``/``mkdir`` would."""
    mask = _umask()
    if path.is_dir():
        for root, dirs, files in os.walk(path):
            os.chmod(root, 0o777 & ~mask)
            for name in files:
                os.chmod(os.path.join(root, name), 0o666 & ~mask)
    else:
        os.chmod(path, 0o666 & ~mask)


def _protected_reason(path: Path) -> str | None:
    """Why ``path`` may never be removed or replaced, or None."""
    real = path.resolve()
    if real == Path(real.anchor):
        return "it is the file-system root"
    with contextlib.suppress(RuntimeError, KeyError):
        if real == Path.home().resolve():
            return "it is your home directory"
    cwd = Path.cwd().resolve()
    if real == cwd:
        return "it is the working directory"
    if real in cwd.parents:
        return "it contains the working directory"
    if (real / ".git").exists():
        return "it is a git repository"
    return None


def _check_common(path: Path, kind: str) -> None:
    if path.is_symlink():
        raise OutputRefused(f"{path} is a symbolic link; swiftkv never writes or removes through a link: "
                            "give the real path or remove the link")
    if path.exists() or path.is_symlink():
        reason = _protected_reason(path)
        if reason:
            raise OutputRefused(f"refusing to replace {path}: {reason}; give a new {kind} path")
    _check_writable_parent(path)


def _check_writable_parent(path: Path) -> None:
    """The nearest existing ancestor must be a writable directory (where the temporary output goes)."""
    parent = path.absolute().parent
    while not parent.exists():
        if parent.is_symlink():  # a dangling link on the way
            raise OutputRefused(f"cannot create {path}: {parent} is a broken symbolic link")
        parent = parent.parent
    if not parent.is_dir():
        raise OutputRefused(f"cannot create {path}: {parent} is a file, not a directory")
    try:  # a real probe: os.access says yes to root even on read-only or special file systems
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".swiftkv-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutputRefused(f"cannot write {path}: {parent} is not writable ({err.strerror}); choose a writable "
                            "location") from None


def is_own_dir(path: Path) -> bool:
    """True for an empty directory or one this package wrote (marker or an earlier version's layout)."""
    if not path.is_dir():
        return False
    names = set(os.listdir(path))
    return not names or MARKER in names or any(m in names for m in LEGACY_MARKERS)


def kind_of(what: str | None) -> str | None:
    """The kind of output a description (``what``) names, or None when it names none we know."""
    for prefix, kind in KINDS:
        if what and what.startswith(prefix):
            return kind
    return None


def read_marker(path: str | os.PathLike) -> dict | None:
    """What the marker of directory ``path`` says (kind, command, files), None for a directory without one; an
    earlier version's output without a marker gets its kind from its layout."""
    path = Path(path)
    try:
        marker = json.loads((path / MARKER).read_text())
    except FileNotFoundError:
        if (path / "swiftkv-source.json").is_file():
            return {"kind": kind_of("embedded model")}
        if (path / "distill.json").is_file():
            weights = any(path.glob("*.safetensors"))
            return {"kind": kind_of("distilled checkpoint" if weights else "distillation log")}
        return None
    except (OSError, ValueError):
        return {}  # ours, but the marker is unreadable: nothing is known of it
    if not isinstance(marker, dict):
        return {}
    marker.setdefault("kind", kind_of(marker.get("what")))
    return marker


def files_under(path: Path) -> set[str]:
    """Every file below directory ``path`` (relative, '/'-separated), the marker left out."""
    found = set()
    for root, _dirs, files in os.walk(path):
        for name in files:
            rel = Path(root, name).relative_to(path).as_posix()
            if rel != MARKER:
                found.add(rel)
    return found


def _overlap(path: Path, inputs, new_inside_ok: bool) -> str | None:
    """How the output ``path`` overlaps one of ``inputs`` (it is one, contains one or lies inside one), or None."""
    out = path.resolve()
    for item in inputs or ():
        if item is None or not Path(item).exists():
            continue
        source = Path(item).resolve()
        if out == source:
            return f"it is the command's input {item}"
        if out in source.parents:
            return f"it contains the command's input {item}"
        if source in out.parents and not (new_inside_ok and not path.exists()):
            return f"it lies inside the command's input {item}"
    return None


def check_not_input(path: str | os.PathLike, inputs, new_inside_ok: bool = False) -> None:
    """Refuse (one line, ``overwrite`` or not) an output that is, contains or lies inside one of ``inputs``.
    ``new_inside_ok``: a new file or folder inside an input (one that adds files and replaces nothing) is fine."""
    why = _overlap(Path(path), inputs, new_inside_ok)
    if why:
        raise OutputRefused(f"refusing to write {path}: {why}, which the command reads; give another output path "
                            "(--overwrite cannot allow this)")


def check_output_dir(path: str | os.PathLike, overwrite: bool = False, what: str | None = None,
                     inputs=(), replace: bool = True) -> Path:
    """Raise ``OutputRefused`` (one line) unless ``path`` may be written as a directory; return it as a Path.

    ``what`` describes the new output: an existing output of another kind (``kind_of``) is refused unless
    ``overwrite``; so is, when the directory is to be replaced whole (``replace``), one holding files its marker does
    not list. ``inputs``: the paths the command reads, which the output may not be or contain, nor lie inside (a
    directory that is only added to, not ``replace``-d, may be a new one inside an input).
    Call it before long work, so that a bad output path fails in a second instead of after the run."""
    path = Path(path)
    _check_common(path, "directory")
    check_not_input(path, inputs, new_inside_ok=not replace)
    if path.exists() and not overwrite:
        if not path.is_dir():
            raise OutputRefused(f"{path} exists and is a file, not a directory; choose another output path "
                                "(or pass --overwrite to replace the file)")
        if not is_own_dir(path):
            raise OutputRefused(f"{path} exists and was not written by swiftkv (no {MARKER}); choose a new output "
                                "directory, or pass --overwrite to replace it")
        _check_own_dir(path, what, replace)
    return path


def _check_own_dir(path: Path, what: str | None, replace: bool) -> None:
    """An existing output of ours: refuse another kind, and (to be replaced whole) files its marker does not list."""
    marker = read_marker(path)
    if marker is None:  # empty
        return
    new, old = kind_of(what), marker.get("kind")
    if new and old and new != old:
        by = f" (written by `{marker['command']}`)" if marker.get("command") else ""
        raise OutputRefused(f"{path} holds a {old}{by}; this command writes a {new}: choose another output "
                            "directory, or pass --overwrite to replace it")
    listed = marker.get("files")
    if replace and isinstance(listed, list):
        extra = sorted(files_under(path) - set(listed))
        if extra:
            more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
            raise OutputRefused(f"{path} holds {', '.join(extra[:3])}{more}, which swiftkv did not write there; move "
                                "it out, choose another output directory, or pass --overwrite to replace it all")


def check_output_file(path: str | os.PathLike, overwrite: bool = False, inputs=()) -> Path:
    """Raise ``OutputRefused`` unless ``path`` may be written as a file (it is not a directory, a link, one of the
    command's ``inputs`` or an existing file inside one, or a file that cannot hold this kind of output); return it as
    a Path. Call it before long work."""
    path = Path(path)
    _check_common(path, "file")
    check_not_input(path, inputs, new_inside_ok=True)
    if path.is_dir():
        raise OutputRefused(f"{path} is a directory; give a file path for this output")
    if path.exists() and not overwrite and not could_be_ours(path):
        raise OutputRefused(f"{path} exists and is not a swiftkv {path.suffix or 'output'} file; choose another "
                            "output path, or pass --overwrite to replace it")
    return path


def _free_sibling(path: Path, tag: str) -> Path:
    stem, suffix = path.name[: len(path.name) - len(path.suffix)], path.suffix
    for i in range(1000):
        candidate = path.with_name(f"{stem}.{tag}{'' if i == 0 else f'-{i}'}{suffix}")
        if not candidate.exists() and not candidate.is_symlink():
            return candidate
    raise OutputRefused(f"no free name beside {path} to keep the new output; clean up {path.parent}")


def _swap_into_place(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target``; an existing ``target`` (already checked) is moved aside first, then removed."""
    if not (target.exists() or target.is_symlink()):
        os.replace(tmp, target)
        return
    if not target.is_dir():
        os.replace(tmp, target)  # a file: one atomic rename
        return
    aside = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-"))
    os.rmdir(aside)
    os.rename(target, aside)
    try:
        os.rename(tmp, target)
    except OSError:
        os.rename(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "", overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary file path beside ``path``; on success it replaces ``path``, on error it is removed.

    ``path`` is checked first (``check_output_file``); if it turns out to be a foreign file once the output is
    complete, the output is kept beside it and ``OutputRefused`` says where."""
    path = check_output_file(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix or path.suffix)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        _fix_modes(tmp)
        check_output_file(path, overwrite)  # again: the file system may have changed while we worked
        if path.exists() and not overwrite and not same_layout(path, tmp):
            kept = _free_sibling(path, "swiftkv-new")
            os.replace(tmp, kept)
            raise OutputRefused(f"{path} exists and is not an earlier swiftkv output of this kind; left it untouched "
                                f"and wrote the new output to {kept} (rename it, or rerun with --overwrite)")
        _swap_into_place(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = False, what: str = "output", inputs=()) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; when the block ends without error it gets the marker (listing
    the files written) and replaces ``path`` (checked with ``check_output_dir`` before and after); on error it is
    removed. If ``path`` became something it may not replace while the block ran, the finished output is kept
    beside it (``NAME.swiftkv-new``) and ``OutputRefused`` says so."""
    path = check_output_dir(path, overwrite, what, inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-"))
    try:
        yield tmp
        mark_dir(tmp, what, files=sorted(files_under(tmp)))
        _fix_modes(tmp)
        try:
            check_output_dir(path, overwrite, what, inputs)  # again: the file system may have changed while we worked
        except OutputRefused as err:
            kept = _free_sibling(path, "swiftkv-new")
            os.rename(tmp, kept)
            raise OutputRefused(f"{err}; the finished output was kept at {kept}") from None
        _swap_into_place(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def open_output_dir(path: str | os.PathLike, overwrite: bool = False, what: str = "output", inputs=()) -> Path:
    """A directory that outputs are added to file by file (each written atomically, nothing removed): checked like
    ``check_output_dir`` (its kind; files of others may stay), created if missing, and marked as ours; returns it."""
    path = check_output_dir(path, overwrite, what, inputs, replace=False)
    path.mkdir(parents=True, exist_ok=True)
    if not (path / MARKER).exists():
        mark_dir(path, what)
    return path


def mark_dir(directory: str | os.PathLike, what: str, files: list[str] | None = None) -> None:
    """Write the marker that tells later runs this directory is ours: ``what`` (a few words on its content, which
    give its kind), the command that wrote it and, for a directory written whole, the ``files`` it holds."""
    from swiftkv import __version__

    marker = {"written_by": "swiftkv", "version": __version__, "what": what, "kind": kind_of(what),
              "command": COMMAND}
    if files is not None:
        marker["files"] = files
    Path(directory, MARKER).write_text(json.dumps(marker) + "\n")


def remove_own_files(directory: str | os.PathLike, names: list[str]) -> None:
    """Delete the named files this package put into ``directory``, then the directory if that left it empty.

    For scratch directories a user may name (``--checkpoint-dir``): never a recursive delete."""
    directory = Path(directory)
    if directory.is_symlink() or not directory.is_dir():
        return
    for name in names:
        (directory / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        directory.rmdir()  # only if empty


def write_json(path: str | os.PathLike, obj: Any, overwrite: bool = False) -> None:
    with atomic_path(path, overwrite=overwrite) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_text(path: str | os.PathLike, text: str, overwrite: bool = False) -> None:
    with atomic_path(path, overwrite=overwrite) as tmp:
        tmp.write_text(text)
