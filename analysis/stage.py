"""Staged results: a long run's finished outputs kept in the repository between sessions, so that a run longer than
one machine's life (the power run: days on 2 cores, on machines that are wiped between sessions) goes on where it
stopped instead of starting again.

A staging area ``staging/<run>/`` holds one folder per session, each a raw folder (``analysis.raw``: the small files
with a manifest: source paths and sha256, the commit that computed them) plus a ``staged`` block in the manifest: the
machine's CPU, the UTC time, the profile's config files and their sha256, and which earlier copies a file supersedes.
A run directory (a student's checkpoint) is staged as its summary and training log only (``analysis.raw``'s
``RUN_FILES``), never its weights.

``restore`` writes the newest copy of every staged file back under ``results/``, never replacing a file that differs,
and marks each run directory it re-creates without weights (``swiftkv.loading.RESTORED_WITHOUT_WEIGHTS``): loading
it is refused in one line. Snakemake does not rerun a job whose outputs are back while no job that needs to run
consumes them, nor rebuild its missing inputs (a teacher cache, the weights). It does compare modification times
(Snakemake 9 always does, whatever ``--rerun-triggers`` says): an input rebuilt after the restore (the model, the
tasks, the teacher cache of a seed whose units are not all done) is newer than the restored files. So a run that spans
sessions restores, runs its unfinished units one invocation each (each one's DAG holds only that unit's jobs), and once
every unit is done runs ``snakemake --touch`` on the whole run's targets before collecting its raw folders: Snakemake's
own way to say that existing outputs are up to date (it creates nothing that is missing).

The staged files reach the evidence of record only as the run's own raw folders, collected and published at the end
(``python -m analysis.publish``); the staging area is removed then.

From the shell::

    python -m analysis.stage save staging/power --session S --root CHECKOUT --configfile F... -- PATH...
    python -m analysis.stage restore staging/power --root CHECKOUT
    python -m analysis.stage list staging/power
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

from analysis.raw import (MANIFEST, RUN_FILES, RawError, check_intact, collect, read_manifest,
                          stored_source_bytes, uncommitted, write_back)

STAGED = "staged"  # the manifest's block of what analysis.raw does not record


def folders(area: str | Path) -> list[Path]:
    """The session folders of a staging area, oldest first (their names sort by the session's start)."""
    area = Path(area)
    return sorted(p for p in area.iterdir() if (p / MANIFEST).is_file()) if area.is_dir() else []


def staged(area: str | Path, skip: str | None = None) -> dict[str, tuple[Path, str, dict]]:
    """Every staged source path -> (session folder, stored name, manifest entry) of its newest copy; ``skip``: a
    session folder left out (the one being rewritten)."""
    newest = {}
    for folder in folders(area):
        if folder.name == skip:
            continue
        for rel, meta in read_manifest(folder)["files"].items():
            newest[meta["source"]] = (folder, rel, meta)
    return newest


def expand(paths: list[str], root: Path) -> list[str]:
    """Files to stage: a file as it is, a finished run directory as its ``RUN_FILES`` (paths relative to ``root``,
    under ``results/``)."""
    out = []
    for path in paths:
        rel = Path(path)
        if rel.is_absolute() or rel.parts[:1] != ("results",):
            raise RawError(f"{path}: give paths under results/, relative to the run's checkout")
        full = root / rel
        if full.is_dir():
            if not (full / RUN_FILES[0]).is_file():
                raise RawError(f"{full} is a directory without {RUN_FILES[0]}: not a finished run directory")
            out += [f"{path.rstrip('/')}/{name}" for name in RUN_FILES if (full / name).is_file()]
        elif full.is_file():
            out.append(str(rel))
        else:
            raise RawError(f"{full} does not exist (stage only finished outputs)")
    return sorted(set(out))


def save(area: str | Path, session: str, root: str | Path, paths: list[str], configfiles: list[str]) -> dict | None:
    """Stage ``paths`` of the checkout ``root`` into ``area/session``: the files that no other session holds with the
    same bytes (with those the session already holds: the folder is rewritten whole). Returns the folder's manifest,
    or None when nothing is new."""
    from swiftkv.provenance import cpu_name, git_commit

    area, root = Path(area), Path(root).resolve()
    if not session or "/" in session or session.startswith("."):
        raise RawError(f"session {session!r}: a plain folder name (e.g. the session's UTC start, 20261205T2307Z)")
    files = expand(paths, root)
    earlier = staged(area, skip=session)
    mine = {}
    current = area / session
    if (current / MANIFEST).is_file():
        mine = {m["source"]: m for m in read_manifest(current)["files"].values()}
        files = sorted(set(files) | {s for s in mine if (root / s).is_file()})

    digest = {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in files}
    new = [f for f in files if f not in earlier or earlier[f][2]["source_sha256"] != digest[f]]
    if not new or all(f in mine and mine[f]["source_sha256"] == digest[f] for f in new):
        return None  # nothing that this session's folder does not already hold
    configs = {}
    for name in configfiles:
        path = root / name
        if not path.is_file():
            raise RawError(f"config file {path} does not exist")
        configs[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    commit = git_commit(root)
    tmp = area / f".{session}.staging"
    shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.chdir(root):
        manifest = collect(new, tmp.resolve(), "see staged.configfiles", commit, repo=root,
                           dirty=uncommitted(root) if commit.endswith("+dirty") else None, study=session)
    manifest[STAGED] = {
        "run": area.name, "session": session, "cpu": cpu_name(), "cores": _cores(),
        "saved_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "configfiles": configs,
        "supersedes": {f: f"{earlier[f][0].name}/{earlier[f][1]}" for f in new if f in earlier},
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    if current.exists():
        shutil.rmtree(current)
    tmp.rename(current)
    return manifest


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def restore(area: str | Path, root: str | Path = ".") -> list[Path]:
    """Write the newest staged copy of every file back under ``root`` (checked against its sha256), and mark each
    run directory re-created without its weights. A file already there with the same bytes is left as it is; a
    different one is never replaced (``RawError``, nothing written). Returns the paths written."""
    from swiftkv.loading import RESTORED_WITHOUT_WEIGHTS

    area, root = Path(area), Path(root)
    for folder in folders(area):
        check_intact(folder)
    newest = staged(area)
    written = write_back([newest[source] for source in sorted(newest)], root)
    marks = {}
    for target in written:
        if target.name in RUN_FILES and not (target.parent / "config.json").exists():
            marks[target.parent] = newest[target.relative_to(root).as_posix()][0]
    for run_dir, folder in marks.items():
        (run_dir / RESTORED_WITHOUT_WEIGHTS).write_text(json.dumps(
            {"restored_from": str(folder), "files": list(RUN_FILES),
             "why": "a staged run keeps a run directory's summary and log only; rerun the job that made it to "
                    "have its weights"}, indent=2) + "\n")
    # One time for everything restored: a run directory (dated by its newest file) is then never newer than the
    # evaluations made from it, which Snakemake would take for an updated input.
    now = time.time()
    for path in [*written, *(d / RESTORED_WITHOUT_WEIGHTS for d in marks), *marks]:
        os.utime(path, (now, now))
    return written


def _relative(text: str) -> str:
    """A built task manifest names its folders by absolute path (the checkout it was built in): as relative paths."""
    return re.sub(r'"/[^"]*?/(results/tasks/)', r'"\1', text)


def dry_jobs(text: str) -> list[tuple[str, list[str]]]:
    """The jobs of a Snakemake dry run's output: (rule, its outputs) each."""
    jobs = []
    for line in text.splitlines():
        if line.startswith(("rule ", "localrule ")) and line.rstrip().endswith(":"):
            jobs.append((line.split()[1].rstrip(":"), []))
        elif line.startswith("    output: ") and jobs:
            jobs[-1][1].extend(o.strip() for o in line.removeprefix("    output: ").split(","))
    return jobs


def _last_line(done) -> str:
    return (done.stderr or done.stdout or "no output").strip().splitlines()[-1]


def dry_run(snakemake, targets: list[str], *options: str) -> list[tuple[str, list[str]]]:
    """The jobs (rule, outputs) that ``snakemake(targets, "-n", *options)`` lists; ``RawError`` if the dry run fails.
    ``snakemake(targets, *options)`` runs Snakemake in a checkout and returns the completed process, output captured."""
    dry = snakemake(targets, "-n", *options)
    if dry.returncode:
        raise RawError(f"the dry run of {targets[0]} failed: {_last_line(dry)}")
    return dry_jobs(dry.stdout)


def _build(snakemake, targets: list[str]) -> None:
    done = snakemake(targets)
    if done.returncode:
        raise RawError(f"building {', '.join(targets)} failed: {_last_line(done)}")


def put_back_published(folder: str | Path, root: str | Path, snakemake) -> list[Path]:
    """A study's published input (a committed raw folder, e.g. the extended suite's task choice) put back under
    ``root``'s ``results/`` and marked up to date, so that a run reads it as published and never computes it again.
    The tasks it was chosen on (its files under ``results/tasks/``) are built here first and must be the same (their
    manifests compared with the folders named relative to the checkout); then its other files are written back (a
    file already there must have the same bytes); the other inputs they were made from that the checkout lacks are
    built (never the jobs that made the published files), and then the published files are dated now, as if made
    after them (only when something was written or built: else the outputs made from them here since would look
    out of date). ``snakemake``: as for ``dry_run``, in ``root``. Returns the paths written; ``RawError`` if the
    tasks differ or the published files would still be computed again."""
    folder, root = Path(folder), Path(root)
    check_intact(folder)
    entries = [(folder, rel, meta) for rel, meta in read_manifest(folder)["files"].items()]
    tasks = [e for e in entries if e[2]["source"].startswith("results/tasks/")]
    built = sorted({meta["source"].rsplit("/", 1)[0] for _, _, meta in tasks})
    if built:
        _build(snakemake, built)
    for top, rel, meta in tasks:
        here = root / meta["source"]
        if _relative(here.read_text()) != _relative(stored_source_bytes(top, rel, meta).decode()):
            raise RawError(f"{here} differs from the published {folder / rel}: other tasks than those the choice "
                           "was made on; the study cannot go on with this choice")
    others = [e for e in entries if e not in tasks]
    written = write_back(others, root)
    outputs = [meta["source"] for _, _, meta in others]
    # the other inputs the choice was made from that this checkout lacks (e.g. the suite it extends): built here,
    # never the jobs that made the published files themselves
    upstream = [o for _, outs in dry_run(snakemake, outputs, "--forceall") if not set(outs) & set(outputs)
                for o in outs if not (root / o).exists()]
    if upstream:
        _build(snakemake, upstream)
    if written or upstream:  # newer than what they were made from (else left alone: see the docstring)
        now = time.time()
        for out in outputs:
            os.utime(root / out, (now, now))
    left = sorted({rule for rule, _ in dry_run(snakemake, outputs)})
    if left:
        raise RawError(f"the published {folder.name} would be computed again ({', '.join(left)}); see "
                       f"snakemake -n -r {' '.join(outputs)} in {root}")
    return written


# a table row's evaluation output (model, variant), a seed's (model, variant, seed) and an extended-suite evaluation's
# (model, variant, seed; workflow/rules/extended.smk): what units() groups
TABLE_OUTPUT = re.compile(r"results/eval/([^/]+)/([^/]+)/[^/]+/[^/]+")
SEED_OUTPUT = re.compile(r"results/seeds/([^/]+)/([^/]+)/seed-(\d+)/[^/]+/[^/]+")
EXTENDED_OUTPUT = re.compile(r"results/extended/([^/]+)/([^/]+)/seed-(\d+)/[^/]+/lm_eval\.json")


def is_unit_output(path: str) -> bool:
    return any(p.fullmatch(path) for p in (TABLE_OUTPUT, SEED_OUTPUT, EXTENDED_OUTPUT))


def units(outputs: list[str], own_seed: int = 0) -> list[dict]:
    """A run's evaluation outputs grouped by the model they evaluate (a table's row ``results/eval/M/V/<kv>/...``,
    a seed's ``results/seeds/M/V/seed-S/<kv>/...``, an extended-suite evaluation
    ``results/extended/M/V/seed-S/<kv>/lm_eval.json``): each unit is run and staged whole, so that a student is
    evaluated in every KV-cache format in the session that trained it. In order: by seed, the base model first, then
    the variants by name; each unit names its outputs and the run directory its student is trained into (it exists
    only for a trained row). ``own_seed`` is the profile's seed (``distill.seed``), whose students are the tables'
    (``results/checkpoints``)."""
    found = {}
    for out in outputs:
        if m := TABLE_OUTPUT.fullmatch(out):
            model, variant, seed = m[1], m[2], own_seed
        elif m := (SEED_OUTPUT.fullmatch(out) or EXTENDED_OUTPUT.fullmatch(out)):
            model, variant, seed = m[1], m[2], int(m[3])
        else:
            raise RawError(f"{out}: not an evaluation output of a table row, a seed or the extended suite "
                           "(results/eval/M/V/KV/FILE, results/seeds/M/V/seed-S/KV/FILE, "
                           "results/extended/M/V/seed-S/KV/lm_eval.json)")
        if m.re is SEED_OUTPUT or (m.re is EXTENDED_OUTPUT and seed != own_seed):
            run_dir = f"results/seeds/{model}/{variant}/seed-{seed}/checkpoint"
        else:
            run_dir = f"results/checkpoints/{model}/{variant}"
        unit = found.setdefault((seed, variant != "base", variant, model),
                                {"key": f"{model}/{variant}/seed-{seed}", "outputs": [], "run_dir": run_dir})
        unit["outputs"].append(out)
    return [dict(u, outputs=sorted(u["outputs"])) for _, u in sorted(found.items())]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m analysis.stage",
        description="Keep a long run's finished outputs in the repository between sessions (staging/<run>/, one "
                    "folder per session) and put them back under results/ on a new machine, so that Snakemake "
                    "goes on where the run stopped (snakemake --touch once every unit is done: see the module's "
                    "docstring).")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("save", help="stage finished outputs of a checkout (files, or run directories: their "
                                    "summary and log only)")
    p.add_argument("area", help="the staging area, e.g. staging/power")
    p.add_argument("paths", nargs="+", help="outputs under results/, relative to --root")
    p.add_argument("--session", required=True, help="this session's folder name (its UTC start, e.g. "
                                                    "20261205T2307Z); saving again rewrites it whole")
    p.add_argument("--root", default=".", help="the checkout the run ran in (default: here)")
    p.add_argument("--configfile", nargs="*", default=[], help="the run's config files (recorded with their sha256)")
    p = sub.add_parser("restore", help="write every staged file's newest copy back under results/ (never replaces "
                                       "a different file)")
    p.add_argument("area", help="the staging area, e.g. staging/power")
    p.add_argument("--root", default=".", help="the checkout to restore into (default: here)")
    p = sub.add_parser("list", help="the sessions of a staging area: files, CPU, commit")
    p.add_argument("area", help="the staging area, e.g. staging/power")
    args = parser.parse_args(argv)
    try:
        if args.command == "save":
            manifest = save(args.area, args.session, args.root, args.paths, args.configfile)
            print(f"{args.area}/{args.session}: " + ("nothing new to stage" if manifest is None else
                  f"{len(manifest['files'])} files staged, computed at {manifest['collected_at']} "
                  f"({manifest[STAGED]['cpu']})"))
        elif args.command == "restore":
            written = restore(args.area, args.root)
            print(f"{len(written)} files restored from {args.area} under {args.root}")
        else:
            found = folders(args.area)
            if not found:
                parser.exit(2, f"error: {args.area} holds no staged session (python -m analysis.stage save)\n")
            for folder in found:
                m = read_manifest(folder)
                s = m.get(STAGED, {})
                print(f"{folder.name}: {len(m['files'])} files, computed at {m['collected_at']}, "
                      f"{s.get('cpu', '?')}, saved {s.get('saved_at', '?')}")
    except RawError as err:
        parser.exit(2, f"error: {err}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
