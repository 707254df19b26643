"""What the raw folders of a reports root say about where its evidence came from: the folders
(``folders``), the commits that computed them (``computed_at``), the mark of a collection from a dirty tree
(``dirty_mark``), a summary per folder for the page and ``provenance.json`` (``summary``, ``summary_line``), and
what breaks the documented layout of ``raw/`` (``layout_problems``; the layout: ``analysis.raw``)."""

from __future__ import annotations

from pathlib import Path

from analysis.raw import ARCHIVE, ARCHIVE_KINDS, MANIFEST, STUDIES, read_manifest, verify


def folders(reports: str | Path) -> list[Path]:
    """The raw folders of a reports root (``<reports>/raw/<study>``, ``raw/serving/<study>``), archive left out. A
    file named like a manifest inside a raw folder (the suite's ``tasks/bigbench/manifest.json``) is one of its
    files, not another folder."""
    raw = Path(reports) / "raw"
    return [f for f in _roots(raw) if f.relative_to(raw).parts[:1] != (ARCHIVE,)]


def _roots(raw: Path) -> list[Path]:
    """Every folder under ``raw`` with a manifest that is not inside another such folder (archive included)."""
    found = sorted(m.parent for m in raw.rglob(MANIFEST))
    return [f for f in found if not any(other in f.parents for other in found)]


def computed_at(root: str | Path) -> list[str]:
    """The commits that computed a raw folder's files, distinct, in file order: each file's ``computed_at`` where
    the manifest records it, else the folder's ``collected_at``."""
    m = read_manifest(root)
    commits = [meta.get("computed_at") or m["collected_at"] for _, meta in sorted(m["files"].items())]
    return list(dict.fromkeys(commits)) or [m["collected_at"]]


def dirty_mark(manifest: dict) -> str:
    """How a folder collected from a tree with uncommitted changes is marked (the report page, provenance.json);
    empty for a clean one."""
    if not str(manifest["collected_at"]).endswith("+dirty"):
        return ""
    diff = manifest.get("uncommitted")
    if diff:
        return (f"collected from a tree with uncommitted changes (diff sha256 {diff['diff_sha256'][:12]}, "
                f"{len(diff['files'])} files)")
    return "collected from a tree with uncommitted changes (the diff was not recorded)"


def summary(reports: str | Path) -> dict[str, dict]:
    """Per raw folder of a reports root: the commit its files were collected at (and, where they differ, the commits
    that computed them), the profile's config hash, the file count, and the mark of a dirty collection."""
    out, raw = {}, Path(reports) / "raw"
    for root in folders(reports):
        m = read_manifest(root)
        entry = {"collected at": m["collected_at"], "config hash": m["config_hash"], "files": len(m["files"])}
        commits = computed_at(root)
        if commits != [m["collected_at"]]:
            entry["computed at"] = ", ".join(commits)
        if dirty_mark(m):
            entry["uncommitted changes"] = dirty_mark(m)
        out[root.relative_to(raw).as_posix()] = entry
    return out


def layout_problems(reports: str | Path) -> list[str]:
    """What is wrong with a reports root's raw/ against the documented layout: a folder that is not one of the
    workflow's studies (in-progress work is not committed) or not under archive/{superseded,pilots}/<name>, a file
    outside any raw folder, a doubled folder name, a folder that no longer verifies. Empty: nothing."""
    raw = Path(reports) / "raw"
    if not raw.is_dir():
        return []
    roots = _roots(raw)
    problems = [f"{f.relative_to(raw)}: not in a raw folder" for f in sorted(raw.rglob("*"))
                if f.is_file() and not f.name.startswith(".") and not any(d in roots for d in f.parents)]
    kinds = ", ".join(f"{ARCHIVE}/{k}/<name>" for k in ARCHIVE_KINDS)
    for root in roots:
        rel = root.relative_to(raw)
        if rel.parts[0] == ARCHIVE:
            if len(rel.parts) != 3 or rel.parts[1] not in ARCHIVE_KINDS:
                problems.append(f"{rel.as_posix()}: the archive holds {kinds} only")
        elif rel.as_posix() not in STUDIES:
            problems.append(f"{rel.as_posix()}: not a raw folder of the evidence (one of the workflow's studies); "
                            f"superseded and pilot folders go under {kinds}, work in progress is not committed")
        problems += [f"{rel.as_posix()}/{key}: doubled folder name" for key in read_manifest(root)["files"]
                     if key.split("/")[0] == root.name]
        problems += [f"{rel.as_posix()}: {p}" for p in verify(root)]
    return problems


def summary_line(entry: dict) -> str:
    """One ``summary`` entry as a line of the report page's provenance, the mark of a dirty collection last."""
    parts = [f"collected at {entry['collected at']}", f"config hash {entry['config hash']}", f"{entry['files']} files"]
    if "computed at" in entry:
        parts.append(f"computed at {entry['computed at']}")
    mark = f" | MARKED: {entry['uncommitted changes']}" if "uncommitted changes" in entry else ""
    return ", ".join(parts) + mark
