"""Raw results in the repository (issue 16, item 6): the small files behind a report, copied from ``results/`` into
``reports/raw/<study>/`` (same relative paths, no checkpoints) with a manifest, so that the report's table can be
regenerated — and its verdicts re-derived — from a clone, without the run.

``manifest.json``: ``collected_at`` (HEAD when the files were collected; ``+dirty`` when tracked files outside
``reports/`` differed from it), ``trees`` (the git tree ids of the code that
computes results: ``swiftkv``, ``analysis``, ``workflow``, ``config`` — equal trees at two commits mean the same
code), ``config_hash`` (the resolved profile) and per file its source path and the source's sha256, and the stored size
and sha256 (files over 64 KiB are stored gzip-compressed as ``<name>.gz``; ``analysis.io.read_json`` reads them).

``restore`` writes a raw folder's files back to ``results/`` (checked against the manifest), so that a clone carries
on a run whose finished jobs were committed (Snakemake then skips them) — e.g. one engine's serving studies measured
in one session and the other's in the next, kept meanwhile under ``reports/raw/in-progress/``. From the shell::

    python -m analysis.raw collect DEST SOURCE... --config-hash H   # results/... -> a raw folder and its manifest
    python -m analysis.raw restore RAW...                            # a raw folder -> results/... (never replaces)
    python -m analysis.raw verify RAW...                             # report missing, changed or unlisted files
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

MANIFEST = "manifest.json"
COMPRESS_ABOVE = 64 * 1024  # bytes: larger files (lm-eval results with per-example samples) are stored as <name>.gz,
# which analysis.io.read_json reads in place of <name>
CODE_TREES = ("swiftkv", "analysis", "workflow", "config")


def _tree(path: str, repo: str | Path = ".") -> str:
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", f"HEAD:{path}"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def eval_path(model: str, *parts: str) -> str:
    """Where an evaluation result lives under ``results/`` (``<variant>/<kv cache>/lm_eval.json``, ``heldout.json``
    or ``fidelity.json``, or a model's ``tasks.json``): one spelling for the rules that write the tables' inputs and
    for the analysis that reads them back from a raw folder (here, so that the workflow imports nothing heavy)."""
    return "/".join(("results", "eval", model, *parts))


def serving_raw(study: str, reports: str | Path = "reports") -> str:
    """The raw folder of a serving study: rule raw_serving writes it; the serving figures, tables and claims read
    it."""
    return f"{reports}/raw/serving/{study}"


def raw_path(root: str | Path, source: str | Path) -> Path:
    """Where ``results/<rel>`` lives in the raw folder ``root``."""
    return Path(root) / Path(source).relative_to("results")


def collect(sources: list[str | Path], dest: str | Path, config_hash: str, commit: str, repo: str | Path = ".") -> dict:
    """Copy every file of ``sources`` (paths under ``results/``) into ``dest`` and write its manifest."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    files = {}
    for src in sorted({str(s) for s in sources}):
        target = raw_path(dest, src)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = Path(src).read_bytes()
        meta = {"source": src, "source_sha256": hashlib.sha256(data).hexdigest()}
        if len(data) > COMPRESS_ABOVE:  # gzip without a timestamp: the same input gives the same bytes
            target = target.with_name(target.name + ".gz")
            target.write_bytes(gzip.compress(data, mtime=0))
        else:
            shutil.copyfile(src, target)
        stored = target.read_bytes()
        files[str(target.relative_to(dest))] = {**meta, "bytes": len(stored),
                                                "sha256": hashlib.sha256(stored).hexdigest()}
    manifest = {"collected_at": commit, "trees": {t: _tree(t, repo) for t in CODE_TREES}, "config_hash": config_hash,
                "files": files}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def verify(root: str | Path) -> list[str]:
    """Problems with a raw folder: files missing, changed or not in the manifest (an empty list: it is intact)."""
    root = Path(root)
    manifest = json.loads((root / MANIFEST).read_text())
    problems = []
    for rel, meta in manifest["files"].items():
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != meta["sha256"]:
            problems.append(f"{rel}: changed since it was collected")
    listed = set(manifest["files"]) | {MANIFEST}
    problems += [f"{p.relative_to(root)}: not in the manifest" for p in root.rglob("*")
                 if p.is_file() and not p.name.startswith(".") and str(p.relative_to(root)) not in listed]
    return problems


def summary(reports: str | Path) -> dict[str, dict]:
    """Per raw folder of a reports directory (``reports/raw/<study>``): the commit its files were collected at, the
    profile's config hash and the file count, for ``provenance.json``."""
    out, raw = {}, Path(reports) / "raw"
    for manifest in sorted(raw.rglob(MANIFEST)):  # nested ones too (raw/serving/<study>)
        m = json.loads(manifest.read_text())
        out[manifest.parent.relative_to(raw).as_posix()] = {"collected at": m["collected_at"],
                                                            "config hash": m["config_hash"], "files": len(m["files"])}
    return out


class RawError(ValueError):
    """A raw folder cannot be restored (damaged, or a different file is already where it would go)."""


def restore(root: str | Path, dest: str | Path = ".") -> list[Path]:
    """Write every file of the raw folder ``root`` back to its source path (``results/...``) under ``dest``, after
    checking the folder (``verify``) and each file's bytes against the source's sha256. A file already there with
    the same bytes is left as it is; a different one is never replaced (``RawError``, nothing written). Returns the
    paths written."""
    root, dest = Path(root), Path(dest)
    if not (root / MANIFEST).is_file():
        raise RawError(f"{root} has no {MANIFEST}: not a raw folder (analysis/raw.py)")
    problems = verify(root)
    if problems:
        raise RawError(f"{root} is damaged ({'; '.join(problems[:3])}); check it out again from git")
    planned = []
    for rel, meta in json.loads((root / MANIFEST).read_text())["files"].items():
        data = (root / rel).read_bytes()
        if rel.endswith(".gz") and not meta["source"].endswith(".gz"):
            data = gzip.decompress(data)
        if hashlib.sha256(data).hexdigest() != meta["source_sha256"]:
            raise RawError(f"{root / rel} does not hold the bytes of {meta['source']} it was collected from")
        target = dest / meta["source"]
        if target.exists():
            if not target.is_file() or hashlib.sha256(target.read_bytes()).hexdigest() != meta["source_sha256"]:
                raise RawError(f"{target} exists and differs from the committed {root / rel}; move it away to "
                               "restore, or keep it and skip the restore")
            continue
        planned.append((target, data))
    for target, data in planned:  # only once every file has passed its checks
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.restoring")
        tmp.write_bytes(data)
        tmp.replace(target)
    return [target for target, _ in planned]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m analysis.raw",
                                     description="Raw results in the repository: collect files of results/ into a "
                                     "raw folder with its manifest, restore a raw folder's files into results/ (so "
                                     "Snakemake skips the jobs that made them), or verify a raw folder.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("collect", help="copy files of results/ into a new raw folder and write its manifest")
    p.add_argument("dest", help="the raw folder to create (e.g. reports/raw/in-progress/serving-hf-cpu)")
    p.add_argument("sources", nargs="+", help="files under results/")
    p.add_argument("--config-hash", required=True, help="the hash of the profile that computed them (the workflow's "
                   "config_hash(): sha256 of the resolved config, 12 hex digits)")
    p = sub.add_parser("restore", help="write raw folders' files back to results/ (never replaces a different file)")
    p.add_argument("raw", nargs="+", help="raw folders (with a manifest.json)")
    p = sub.add_parser("verify", help="list missing, changed or unlisted files of raw folders")
    p.add_argument("raw", nargs="+", help="raw folders (with a manifest.json)")
    args = parser.parse_args(argv)
    if args.command == "collect":
        bad = [s for s in args.sources if not Path(s).is_file() or Path(s).parts[:1] != ("results",)]
        if bad:
            parser.exit(2, f"error: {bad[0]}: not a file under results/ (give paths relative to the repository)\n")
        if Path(args.dest).exists():
            parser.exit(2, f"error: {args.dest} exists; a raw folder is written once (choose another path, or remove "
                        "it with git rm if it is committed)\n")
        from swiftkv.bench.provenance import git_commit

        Path(args.dest).mkdir(parents=True)
        manifest = collect(args.sources, args.dest, args.config_hash, git_commit())
        print(f"{args.dest}: {len(manifest['files'])} files collected at {manifest['collected_at']}")
        return 0
    missing = [r for r in args.raw if not (Path(r) / MANIFEST).is_file()]
    if missing:
        parser.exit(2, f"error: {missing[0]} has no {MANIFEST}: not a raw folder\n")
    if args.command == "verify":
        problems = [f"{r}: {p}" for r in args.raw for p in verify(r)]
        print("\n".join(problems) if problems else f"{len(args.raw)} raw folder(s) intact")
        return 1 if problems else 0
    try:
        written = [path for r in args.raw for path in restore(r)]
    except RawError as err:
        parser.exit(2, f"error: {err}\n")
    print(f"{len(written)} files restored into results/" + "".join(f"\n  {p}" for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
