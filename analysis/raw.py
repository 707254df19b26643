"""Raw results in the repository (issue 16, item 6): the small files behind a report, copied from ``results/`` into
``reports/raw/<study>/`` (same relative paths, no checkpoints) with a manifest, so that the report's table can be
regenerated — and its verdicts re-derived — from a clone, without the run.

``manifest.json``: ``collected_at`` (HEAD when the files were collected; ``+dirty`` when tracked files outside
``reports/`` differed from it), ``trees`` (the git tree ids of the code that
computes results: ``swiftkv``, ``analysis``, ``workflow``, ``config`` — equal trees at two commits mean the same
code), ``config_hash`` (the resolved profile) and per file its source path and the source's sha256, and the stored size
and sha256 (files over 64 KiB are stored gzip-compressed as ``<name>.gz``; ``analysis.io.read_json`` reads them).
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
    out = {}
    for manifest in sorted(Path(reports).glob(f"raw/*/{MANIFEST}")):
        m = json.loads(manifest.read_text())
        out[manifest.parent.name] = {"collected at": m["collected_at"], "config hash": m["config_hash"],
                                     "files": len(m["files"])}
    return out
