"""Publish a run as the evidence of record: a run's raw folders (``results/reports/raw/<study>``) are copied over the
committed ones (``reports/raw/<study>``), the run's ``provenance.json`` becomes the committed one, then ``reports/`` is
re-rendered from the committed raw folders by the same rules that rendered the run's own ``results/reports/``
(docs/reproducing.md).

    python -m analysis.publish STUDY...       # e.g. table2 seeds serving/latency
    python -m analysis.publish --all          # every raw folder of the run

Refused with one line (exit 2), and nothing copied, when: tracked files outside ``reports/`` differ from HEAD (the
evidence is labelled by a commit: commit first); a run's folder was collected from a tree with uncommitted changes,
is damaged, or comes from a profile other than the default one or with ``--config`` overrides (``reports/`` holds the
default profile's evidence; the CI and paper profiles publish nothing); or the committed folder has uncommitted
changes of its own. A folder whose evidence equals the committed one (``analysis.raw.evidence_digests``: the same
results, apart from wall times and dates) is left as it is.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from analysis.raw import (
    ARCHIVE,
    COMMITTED,
    DEFAULT_PROFILE,
    MANIFEST,
    RUN,
    RawError,
    evidence_digests,
    read_manifest,
    verify,
)
from analysis.raw_summary import folders

RENDER = [f"{COMMITTED}/report.html"]  # every table, figure and the claims of reports/ are inputs of the page
PROVENANCE = "provenance.json"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def check_clean(repo: str | Path = ".") -> None:
    """Refuse a checkout whose tracked files outside reports/ differ from HEAD (or that is not a git checkout)."""
    from swiftkv.provenance import git_commit

    commit = git_commit(repo)
    if commit == "unknown":
        raise RawError(f"{repo} is not a git checkout: the evidence of record is labelled by a commit")
    if commit.endswith("+dirty"):
        raise RawError("tracked files outside reports/ differ from HEAD (git status); commit or stash them, rerun the "
                       "study and publish then: the evidence of record is labelled by the commit that computed it")


def check_run_folder(src: Path, name: str) -> dict:
    """A run's raw folder that may be published: intact, clean, of the default profile without overrides."""
    if not (src / MANIFEST).is_file():
        raise RawError(f"{src} has no {MANIFEST}: run the study first (snakemake --cores all {RUN}/...)")
    problems = verify(src)
    if problems:
        raise RawError(f"{src} is damaged ({'; '.join(problems[:2])}); rerun its raw_* rule")
    m = read_manifest(src)
    if str(m["collected_at"]).endswith("+dirty"):
        raise RawError(f"{src} was collected from a tree with uncommitted changes ({m['collected_at']}); commit, "
                       f"rerun the study and publish then")
    if m.get("profile") != DEFAULT_PROFILE:
        raise RawError(f"{src} was collected on the {m.get('profile') or 'an unrecorded'} profile; {COMMITTED}/raw "
                       f"holds the {DEFAULT_PROFILE} profile's evidence (config/config.yaml), so it is not published")
    if m.get("overrides"):
        raise RawError(f"{src} was collected with --config overrides ({', '.join(sorted(m['overrides']))}); run the "
                       f"{DEFAULT_PROFILE} profile as it is committed (or commit the change to config/config.yaml)")
    return m


def publish(studies: list[str], repo: str | Path = ".") -> list[str]:
    """Copy the run's raw folders of ``studies`` over the committed ones, after checking every one of them (nothing
    is copied unless all pass). Returns one line per study: published, or kept (the same evidence)."""
    repo = Path(repo)
    check_clean(repo)
    plan = []
    for name in studies:
        if Path(name).is_absolute() or ".." in Path(name).parts or Path(name).parts[:1] == (ARCHIVE,):
            raise RawError(f"{name}: a study is a folder under {RUN}/raw/ (e.g. table2, serving/latency)")
        src, dst = repo / RUN / "raw" / name, repo / COMMITTED / "raw" / name
        m = check_run_folder(src, name)
        if _git(repo, "status", "--porcelain", "--", str(dst.relative_to(repo))).strip():
            raise RawError(f"{dst.relative_to(repo)} has uncommitted changes; commit or restore it (git checkout -- "
                           f"{dst.relative_to(repo)}) first")
        same = (dst / MANIFEST).is_file() and evidence_digests(dst) == evidence_digests(src)
        plan.append((name, src, dst, m, same))
    lines, published = [], []
    for name, src, dst, m, same in plan:
        if same:
            lines.append(f"{name}: kept (the run's evidence equals the committed one, apart from wall times and dates)")
            continue
        _replace(src, dst, m)
        published.append(name)
        lines.append(f"{name}: published ({len(m['files'])} files, collected at {m['collected_at'][:12]})")
    if published:
        write_provenance(repo, published)
    return lines


def write_provenance(repo: Path, published: list[str]) -> None:
    """reports/provenance.json: the published run's record (its results/reports/provenance.json: commit, date, host,
    versions, job times; else this host's now), what was published at which commit, and every committed raw folder's
    commits (analysis.raw_summary.summary)."""
    from analysis.raw_summary import summary
    from swiftkv.bench.provenance import provenance
    from swiftkv.io import write_json
    from swiftkv.provenance import git_commit

    run = repo / RUN / PROVENANCE
    if run.is_file():
        info = json.loads(run.read_text())
    else:  # the run rendered no page: where and on what it is published
        info = provenance("config/config.yaml", read_manifest(repo / RUN / "raw" / published[0])["config_hash"],
                          repo=repo, benchmarks=repo / "benchmarks")
    info = {k: v for k, v in info.items() if not k.startswith(("raw results", "artifacts", "published"))}
    info["published (commit: raw folders)"] = {git_commit(repo): ", ".join(published)}
    info["raw results (raw/<study>: collected at commit, config hash, files)"] = summary(repo / COMMITTED)
    write_json(repo / COMMITTED / PROVENANCE, info)


def _replace(src: Path, dst: Path, manifest: dict) -> None:
    """dst becomes a copy of the raw folder src (its manifest's files only): written beside it, checked, swapped in."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f".{dst.name}.publishing-"))
    try:
        for rel in [*manifest["files"], MANIFEST]:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, tmp / rel)
        problems = verify(tmp)
        if problems:
            raise RawError(f"copying {src} failed ({problems[0]}); nothing published")
        old = dst.with_name(f".{dst.name}.replaced")
        if dst.exists():
            dst.rename(old)
        tmp.rename(dst)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def render(repo: str | Path = ".", cores: int = 1) -> int:
    """Re-render reports/ from the committed raw folders (every table, figure, the claims, the page, provenance)."""
    return subprocess.run([sys.executable, "-m", "snakemake", *RENDER, "--cores", str(cores), "--forceall",
                           "--quiet", "rules"], cwd=repo).returncode


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m analysis.publish", description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="*", help=f"raw folders of the run, relative to {RUN}/raw/ (table2, seeds, "
                        "serving/latency, ...)")
    parser.add_argument("--all", action="store_true", help=f"every raw folder under {RUN}/raw/")
    parser.add_argument("--no-render", action="store_true", help=f"copy only (and write {COMMITTED}/{PROVENANCE}); "
                        f"re-render later with snakemake {' '.join(RENDER)} --cores 1 --forceall")
    parser.add_argument("--cores", type=int, default=1, help="cores for the re-render (default: %(default)s)")
    args = parser.parse_args(argv)
    run_raw = Path(RUN) / "raw"
    studies = [f.relative_to(run_raw).as_posix() for f in folders(RUN)] if args.all else args.studies
    if not studies:
        available = ", ".join(f.relative_to(run_raw).as_posix() for f in folders(RUN)) or "none yet"
        parser.exit(2, f"error: name the studies to publish (or --all); the run has: {available}\n")
    try:
        lines = publish(studies)
    except (RawError, subprocess.CalledProcessError) as err:
        parser.exit(2, f"error: {err}\n")
    print("\n".join(lines))
    if args.no_render or all(line.split(": ", 1)[1].startswith("kept") for line in lines):
        return 0
    if render(cores=args.cores) != 0:
        print(f"error: re-rendering {COMMITTED}/ failed (see the snakemake output above); the raw folders are "
              "published, rerun: " f"snakemake {' '.join(RENDER)} --cores 1 --forceall", file=sys.stderr)
        return 1
    print(f"{COMMITTED}/ re-rendered from {COMMITTED}/raw; review and commit it: git add {COMMITTED} && git commit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
