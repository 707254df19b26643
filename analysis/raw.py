"""Raw results: the small files behind a report, copied from ``results/`` into a raw folder with a manifest, so that
the report's tables — and the verdicts — are re-derived from them without the run (no checkpoints are kept).

Where raw folders live (docs/reproducing.md):

- ``results/reports/raw/<study>``: a run's own, written by the ``raw_*`` rules; the run's tables, figures and page
  (``results/reports/``) are rendered from them.
- ``reports/raw/<study>``: the evidence of record, committed. No rule writes it: ``python -m analysis.publish``
  copies a run's folders there (from a clean checkout, default profile only) and re-renders ``reports/``.
- ``reports/raw/archive/{superseded,pilots}/<name>``: folders kept for the record with their manifests; nothing
  reads them.

A file ``results/<rel>`` is stored at ``<rel>`` in the folder, less a leading folder named like the study
(``results/seeds/x`` is stored in ``raw/seeds`` as ``x``), and ``<name>.gz`` when over 64 KiB (gzip without a
timestamp; ``analysis.io.read_json`` reads it in place of ``<name>``).

``manifest.json``: ``collected_at`` (HEAD when the files were collected; ``+dirty`` when tracked files outside
``reports/`` differed from it, and then ``uncommitted``: the sha256 of that diff and the files it touches),
``trees`` (git tree ids of the code that computes results: equal trees at two commits mean the same code),
``config_hash`` (the resolved profile), ``profile`` (its name) and ``overrides`` (``--config`` on the command line),
and per file: its source path and the source's sha256, the stored size and sha256, ``evidence_sha256`` (the sha256
of what the file says once its volatile fields are left out: wall times, dates, thread counts, environment dumps;
``VOLATILE``) and ``computed_at`` where the file names the commit that computed it (lm-eval's ``git_hash``), or
where the folder was put together from more than one run (then also that run's ``config_hash``). ``relocated`` and
``amended`` notes say what changed in a folder after it was collected.

From the shell::

    python -m analysis.raw collect DEST SOURCE... --config-hash H   # results/... -> results/reports/raw/<study>
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
RUN_FILES = ("distill.json", "train_log.jsonl")  # of a run directory: what the tables read; never the weights
COMPRESS_ABOVE = 64 * 1024  # bytes: larger files (lm-eval results with per-example samples) are stored as <name>.gz,
# which analysis.io.read_json reads in place of <name>
CODE_TREES = ("swiftkv", "analysis", "workflow", "config")
COMMITTED = "reports"  # the evidence of record and what is rendered from it (no rule writes reports/raw)
RUN = "results/reports"  # a run's own raw folders, tables, figures and page
ARCHIVE = "archive"  # reports/raw/archive/{superseded,pilots}/<name>: kept for the record, read by nothing
ARCHIVE_KINDS = ("superseded", "pilots")
DEFAULT_PROFILE = "default"  # the profile whose runs are the evidence of record (config/config.yaml)

# The raw folders the workflow's raw_* rules write (and a reports root may hold), besides the archive.
STUDIES = ("flops", "simscore", "forward_time", "distill_curve", "table2", "table4a", "table4b", "tableB1", "tableB2",
           "seeds", "lr_sweep", "budget_scaling", "advisor", "long_context", "served_fidelity", "suite",
           "extended_selection", "extended_suite",
           *(f"serving/{s}" for s in ("throughput", "latency", "kv-limit", "sharegpt")))
# The raw folder each table of a reports root is rendered from (the workflow's rules; analysis.reproduce).
TABLE_RAW = {"table1": "flops", "table_kv_memory": "flops", "simscore_crossings": "simscore",
             **{t: t for t in ("table2", "table4a", "table4b", "tableB1", "tableB2")}, "seeds": "seeds",
             "lr_sweep": "lr_sweep", "budget_scaling": "budget_scaling", "table3": "serving/kv-limit",
             "tableA3": "serving/sharegpt", "table_advisor": "advisor", "table_advisor_calibration": "advisor",
             "table_long_context": "long_context", "table_serving_fidelity": "served_fidelity",
             "suite_selection": "suite"}

# Fields that say when, where or how fast a result was computed, not what it is: left out of evidence_sha256.
# Dotted paths from the top of a JSON document (and of each line of a JSONL log). The timings of the timing studies
# (forward time, serving) are their measurements and are not listed.
VOLATILE = frozenset({
    "date", "pretty_env_info", "git_hash", "upper_git_hash", "start_time", "end_time",
    "total_evaluation_time_seconds",  # lm-eval's record of when and where
    "swiftkv.seconds_lm_eval", "swiftkv.seconds_per_task_group_share", "swiftkv.threads",  # swiftkv eval
    "seconds", "tokens_per_second", "torch_threads",  # fidelity, SimScore, advisor, long context
    "train_seconds", "train_tok_per_s", "wall_seconds_this_invocation",  # a distillation's summary
    "teacher_cache.build.wall_seconds", "teacher_cache.build.train_seconds", "teacher_cache.build.tokens_per_s",
    "teacher_cache.build.threads",
    "step_s", "tok_per_s",  # a training log's step lines
})


def _git(repo: str | Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _tree(path: str, repo: str | Path = ".") -> str:
    return _git(repo, "rev-parse", f"HEAD:{path}") or "unknown"


def uncommitted(repo: str | Path = ".") -> dict | None:
    """The tracked files outside ``reports/`` that differ from HEAD, and the sha256 of that diff (``git diff HEAD``);
    None when there are none (or outside git)."""
    scope = ("--", ".", ":(exclude)reports")
    files = _git(repo, "diff", "HEAD", "--name-only", *scope)
    if not files:
        return None
    diff = subprocess.run(["git", "-C", str(repo), "diff", "HEAD", "--binary", *scope], capture_output=True,
                          check=True).stdout
    return {"diff_sha256": hashlib.sha256(diff).hexdigest(), "files": files.splitlines()}


def eval_path(model: str, *parts: str) -> str:
    """Where an evaluation result lives under ``results/`` (``<variant>/<kv cache>/lm_eval.json``, ``heldout.json``
    or ``fidelity.json``, or a model's ``tasks.json``): one spelling for the rules that write the tables' inputs and
    for the analysis that reads them back from a raw folder (here, so that the workflow imports nothing heavy)."""
    return "/".join(("results", "eval", model, *parts))


def serving_raw(study: str, reports: str | Path = COMMITTED) -> str:
    """The raw folder of a serving study under a reports root: rule raw_serving writes it under results/reports;
    the serving figures, tables and claims read it."""
    return f"{reports}/raw/serving/{study}"


def raw_path(root: str | Path, source: str | Path, study: str | None = None) -> Path:
    """Where ``results/<rel>`` is stored in the raw folder ``root`` (without the ``.gz`` of a compressed file): at
    ``<rel>``, less a leading folder named like the study (``study``: the raw folder's name unless given, as when a
    folder is written under a temporary name)."""
    root, rel = Path(root), Path(source).relative_to("results")
    if len(rel.parts) > 1 and rel.parts[0] == (study or root.name):
        rel = Path(*rel.parts[1:])
    return root / rel


# -- what a file says, without when and how fast it was computed ---------------------------------------------------


def _drop(doc, paths: frozenset[str]):
    if not isinstance(doc, dict):
        return doc
    out = {}
    for key, value in doc.items():
        if key in paths:
            continue
        inner = frozenset(p.split(".", 1)[1] for p in paths if p.startswith(f"{key}."))
        out[key] = _drop(value, inner) if inner else value
    return out


def evidence_bytes(data: bytes, name: str) -> bytes:
    """The evidence of a file's bytes: a JSON document (or each line of a JSONL log) without its ``VOLATILE`` fields,
    in one canonical spelling; any other file (or one that does not parse) as it is."""
    name = name.removesuffix(".gz")
    try:
        if name.endswith(".json"):
            return json.dumps(_drop(json.loads(data), VOLATILE), sort_keys=True).encode()
        if name.endswith(".jsonl"):
            return "\n".join(json.dumps(_drop(json.loads(line), VOLATILE), sort_keys=True)
                             for line in data.decode().splitlines() if line.strip()).encode()
    except (ValueError, UnicodeDecodeError):
        pass
    return data


def evidence_sha256(data: bytes, name: str) -> str:
    return hashlib.sha256(evidence_bytes(data, name)).hexdigest()


def stored_source_bytes(root: str | Path, rel: str, meta: dict) -> bytes:
    """The bytes of a stored file as they were in ``results/`` (decompressed where the folder stores them gzipped)."""
    data = (Path(root) / rel).read_bytes()
    return gzip.decompress(data) if rel.endswith(".gz") and not meta["source"].endswith(".gz") else data


def evidence_digests(root: str | Path) -> dict[str, str]:
    """Per source path, the ``evidence_sha256`` of a raw folder's files, computed from the stored bytes (so that
    folders collected before manifests recorded it compare too)."""
    manifest = read_manifest(root)
    return {meta["source"]: evidence_sha256(stored_source_bytes(root, rel, meta), meta["source"])
            for rel, meta in manifest["files"].items()}


def _own_commit(data: bytes, name: str, repo: str | Path) -> str | None:
    """The commit a result file says computed it (lm-eval's ``git_hash``, a short id, made full where the repository
    knows it), or None."""
    if not name.endswith(".json"):
        return None
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    short = doc.get("git_hash") if isinstance(doc, dict) else None
    if not isinstance(short, str) or not short:
        return None
    return _git(repo, "rev-parse", "--verify", "--quiet", f"{short}^{{commit}}") or short


# -- collect, verify, restore --------------------------------------------------------------------------------------


def collect(sources: list[str | Path], dest: str | Path, config_hash: str, commit: str, repo: str | Path = ".",
            profile: str | None = None, overrides: dict | None = None, dirty: dict | None = None,
            study: str | None = None) -> dict:
    """Copy every file of ``sources`` (paths under ``results/``) into ``dest`` and write its manifest. ``commit``:
    HEAD (``git_commit``); ``dirty``: ``uncommitted()`` when it ends in ``+dirty``; ``study``: the name of the raw
    folder (``dest``'s own unless given: a temporary folder that is renamed into place afterwards needs it)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    files, targets = {}, {}
    for src in sorted({str(s) for s in sources}):
        data = Path(src).read_bytes()
        target = raw_path(dest, src, study)
        if len(data) > COMPRESS_ABOVE:  # gzip without a timestamp: the same input gives the same bytes
            target = target.with_name(target.name + ".gz")
        rel = target.relative_to(dest).as_posix()
        if rel in targets or rel == MANIFEST:
            raise RawError(f"{src} and {targets.get(rel, 'the manifest')} would both be stored as {dest / rel}")
        targets[rel] = src
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gzip.compress(data, mtime=0) if rel.endswith(".gz") else data)
        stored = target.read_bytes()
        meta = {"source": src, "source_sha256": hashlib.sha256(data).hexdigest(), "bytes": len(stored),
                "sha256": hashlib.sha256(stored).hexdigest(), "evidence_sha256": evidence_sha256(data, src)}
        own = _own_commit(data, src, repo)
        if own:
            meta["computed_at"] = own
        files[rel] = meta
    manifest = {"collected_at": commit, "trees": {t: _tree(t, repo) for t in CODE_TREES}, "config_hash": config_hash,
                "files": files}
    if profile is not None:
        manifest.update(profile=profile, overrides=overrides or {})
    if dirty:
        manifest["uncommitted"] = dirty
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def read_manifest(root: str | Path) -> dict:
    return json.loads((Path(root) / MANIFEST).read_text())


def verify(root: str | Path) -> list[str]:
    """Problems with a raw folder: files missing, changed or not in the manifest (an empty list: it is intact)."""
    root = Path(root)
    manifest = read_manifest(root)
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


class RawError(ValueError):
    """A raw folder cannot be collected, restored or published (one line: what is wrong, how to fix it)."""


def restore(root: str | Path, dest: str | Path = ".") -> list[Path]:
    """Write every file of the raw folder ``root`` back to its source path (``results/...``) under ``dest``, after
    checking the folder (``verify``) and each file's bytes against the source's sha256. A file already there with
    the same bytes is left as it is; a different one is never replaced (``RawError``, nothing written). Returns the
    paths written."""
    root = Path(root)
    if not (root / MANIFEST).is_file():
        raise RawError(f"{root} has no {MANIFEST}: not a raw folder (analysis/raw.py)")
    check_intact(root)
    return write_back([(root, rel, meta) for rel, meta in read_manifest(root)["files"].items()], dest)


def check_intact(root: Path) -> None:
    problems = verify(root)
    if problems:
        raise RawError(f"{root} is damaged ({'; '.join(problems[:3])}); check it out again from git")


def write_back(entries: list[tuple[Path, str, dict]], dest: str | Path) -> list[Path]:
    """Write stored files (raw folder, stored name, manifest entry) back to their source paths under ``dest``, each
    checked against the source's sha256; a file already there with the same bytes is left as it is, a different one
    is never replaced (``RawError``, nothing written). Returns the paths written."""
    planned = []
    for root, rel, meta in entries:
        data = stored_source_bytes(root, rel, meta)
        if hashlib.sha256(data).hexdigest() != meta["source_sha256"]:
            raise RawError(f"{root / rel} does not hold the bytes of {meta['source']} it was collected from")
        target = Path(dest) / meta["source"]
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
                                     description="Raw results: collect files of results/ into a raw folder with its "
                                     "manifest, restore a raw folder's files into results/ (so that Snakemake skips "
                                     "the jobs that made them), or verify a raw folder. Publishing a run's folders "
                                     "as the evidence of record: python -m analysis.publish.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("collect", help="copy files of results/ into a new raw folder and write its manifest")
    p.add_argument("dest", help=f"the raw folder to create, under {RUN}/raw/")
    p.add_argument("sources", nargs="+", help="files under results/")
    p.add_argument("--config-hash", required=True, help="the hash of the profile that computed them (the workflow's "
                   "config_hash(): sha256 of the resolved config, 12 hex digits)")
    p.add_argument("--profile", default=None, help="the name of that profile (config key 'profile')")
    p = sub.add_parser("restore", help="write raw folders' files back to results/ (never replaces a different file)")
    p.add_argument("raw", nargs="+", help="raw folders (with a manifest.json)")
    p = sub.add_parser("verify", help="list missing, changed or unlisted files of raw folders")
    p.add_argument("raw", nargs="+", help="raw folders (with a manifest.json)")
    args = parser.parse_args(argv)
    if args.command == "collect":
        bad = [s for s in args.sources if not Path(s).is_file() or Path(s).parts[:1] != ("results",)]
        if bad:
            parser.exit(2, f"error: {bad[0]}: not a file under results/ (give paths relative to the repository)\n")
        if Path(args.dest).parts[:3] != (*Path(RUN).parts, "raw") or len(Path(args.dest).parts) < 4:
            parser.exit(2, f"error: {args.dest}: a run's raw folders go under {RUN}/raw/ (the committed reports/raw "
                        "is written by python -m analysis.publish only)\n")
        if Path(args.dest).exists():
            parser.exit(2, f"error: {args.dest} exists; a raw folder is written once (choose another path)\n")
        from swiftkv.provenance import git_commit

        commit = git_commit()
        try:
            manifest = collect(args.sources, args.dest, args.config_hash, commit, profile=args.profile,
                               dirty=uncommitted() if commit.endswith("+dirty") else None)
        except RawError as err:
            shutil.rmtree(args.dest, ignore_errors=True)
            parser.exit(2, f"error: {err}\n")
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
