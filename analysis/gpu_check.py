"""Runs of the hand-run GPU check (``bin/gpu-bench``, on a lent GPU machine, outside the DAG) kept as evidence:
``reports/gpu/<date>-<gpu>/<run>/`` holds what one run wrote (sections.json, environment.txt, the sections' JSON and
logs) and a ``manifest.json`` (the commit that ran, the command, each file's sha256); ``README.md`` beside the runs is
generated from them, so every number on it comes from the stored JSON::

    python -m analysis.gpu_check collect reports/gpu/2026-12-04-h200/run1 OUTDIR --commit C --command "..."
    python -m analysis.gpu_check render reports/gpu/2026-12-04-h200          # writes its README.md
    python -m analysis.gpu_check render --check reports/gpu/2026-12-04-h200  # exit 1 if README.md is stale
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

KEPT = (".json", ".txt", ".log")  # what a run folder keeps of bin/gpu-bench's OUTDIR (not sections.tsv: in the json)
GIB = 2 ** 30


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def collect(dest: Path, source: Path, commit: str, command: str) -> Path:
    """Copy one run's OUTDIR into ``dest`` (a new folder: never over an existing one) with its manifest."""
    if dest.exists():
        raise SystemExit(f"error: {dest} exists; a run folder is written once (pick another name)")
    if not (source / "sections.json").is_file():
        raise SystemExit(f"error: {source}/sections.json not found: give the OUTDIR of a bin/gpu-bench run")
    dest.mkdir(parents=True)
    files = {}
    for f in sorted(source.iterdir()):
        if f.is_file() and f.suffix in KEPT:
            shutil.copy2(f, dest / f.name)
            files[f.name] = _sha256(dest / f.name)
    manifest = {"commit": commit, "command": command, "files": files}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return dest


def verify(run: Path) -> list[str]:
    """Files of a run folder that are missing or differ from its manifest."""
    manifest = json.loads((run / "manifest.json").read_text())
    return [f"{run.name}/{name}: {'missing' if not (run / name).is_file() else 'changed'}"
            for name, digest in manifest["files"].items()
            if not (run / name).is_file() or _sha256(run / name) != digest]


def _load(run: Path, name: str):
    path = run / name
    return json.loads(path.read_text()) if path.is_file() else None


def _sections(run: Path) -> list[str]:
    rows = ["| section | status | seconds | detail |", "|---|---|---:|---|"]
    for name, s in (_load(run, "sections.json") or {}).items():
        rows.append(f"| {name} | {s['status']} | {s['seconds']} | {s['detail'].replace('|', '/')} |")
    return rows


def _prefill(doc: dict) -> list[str]:
    rows = [f"{doc['model']} ({'random weights, ' if doc.get('random_weights') else ''}{doc['dtype']}, "
            f"{doc['num_hidden_layers']} layers), batch 1, median of {doc['settings'].get('repeats')} repeats after "
            f"{doc['settings'].get('warmup')} warm-ups; speedup = median of the same repeat's base / SwiftKV time", "",
            "| variant | prompt tokens | median | [q1, q3] | speedup | FLOPs-predicted |", "|---|---:|---:|---:|---:|---:|"]
    for r in doc["results"]:
        rows.append(f"| {r['variant']} | {r['prefill_tokens']} | {r['median_s'] * 1e3:.1f} ms | "
                    f"[{r['q1_s'] * 1e3:.1f}, {r['q3_s'] * 1e3:.1f}] | {r['paired_speedup_median']:.2f}x | "
                    f"{1 / r['predicted_ratio']:.2f}x |")
    return rows


def _distill_memory(doc: dict) -> list[str]:
    sh = doc["shape"]
    shape = (f"random weights of hidden size {sh['hidden_size']}, {sh['num_hidden_layers']} layers, "
             f"{sh['num_key_value_heads']} KV heads, vocabulary {sh['vocab_size']}")
    rows = [f"One optimizer step (SwiftKV-50, partial scope; {shape}); peak allocated GPU memory "
            "(`torch.cuda.max_memory_allocated`, weights included) against the accounting's prediction", "",
            "| case | tokens per row | peak GPU | predicted | loss |", "|---|---:|---:|---:|---:|"]
    for r in doc["results"]:
        loss = r["ranks"][0].get("loss")
        rows.append(f"| {r['case']} | {r['length']} | {r['peak_gpu_bytes_max_rank'] / GIB:.2f} GiB | "
                    f"{r['predicted_bytes']['total'] / GIB:.2f} GiB | {loss:.4g} |")
    return rows


def _throughput(doc: dict) -> list[str]:
    s = doc["settings"]
    rows = [f"{doc['model']} ({doc['dtype']}) through transformers' `generate()`: {doc['workload']['num_requests']} "
            f"requests of {doc['workload']['output_len']} new tokens in one batch, {s['repeats']} repeats after "
            f"{s['warmup']} warm-up; tok/s = (prompt + new tokens) / elapsed, the median over repeats, every repeat "
            "listed", "",
            "| variant | input tokens | tok/s | repeats (tok/s) | paired speedup | predicted | peak GPU |",
            "|---|---:|---:|---|---:|---:|---:|"]
    for r in doc["results"]:
        runs = ", ".join(f"{x:.0f}" for x in r["throughput_runs_tok_s"])
        rows.append(f"| {r['label']} | {r['input_len']} | {r['throughput_tok_s']:.0f} | {runs} | "
                    f"{r['paired_speedup']:.2f}x | {r['predicted_speedup']:.2f}x | "
                    f"{r['peak_cuda_allocated_bytes'] / GIB:.1f} GiB |")
    return rows


def page(folder: Path) -> str:
    """The markdown of a folder of GPU-check runs."""
    runs = sorted(p.parent for p in folder.glob("*/manifest.json"))
    parts = [f"# GPU check {folder.name}", "",
             "Generated by `python -m analysis.gpu_check render` from the runs' files beside it; do not edit. "
             "Each run is one `bin/gpu-bench` call on a lent GPU machine (outside the DAG)."]
    for run in runs:
        manifest = json.loads((run / "manifest.json").read_text())
        env = (run / "environment.txt").read_text().strip().splitlines() if (run / "environment.txt").is_file() else []
        parts += ["", f"## {run.name}", "", f"Commit `{manifest['commit']}`; command: `{manifest['command']}`", ""]
        parts += [f"    {line}" for line in env] + [""] + _sections(run)
        for name, title, make in (("distill-memory.json", "Distillation step memory", _distill_memory),
                                  ("prefill.json", "Prefill time (Fig. 2, right)", _prefill),
                                  ("throughput.json", "Generation throughput (Fig. 3, through transformers)",
                                   _throughput)):
            doc = _load(run, name)
            if doc is not None:
                parts += ["", f"### {title}", ""] + make(doc)
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.gpu_check", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("collect", help="copy one bin/gpu-bench OUTDIR into a new run folder with its manifest")
    c.add_argument("dest")
    c.add_argument("source")
    c.add_argument("--commit", required=True, help="the commit the run ran (git rev-parse HEAD of the tree sent)")
    c.add_argument("--command", required=True, help="the command line that ran it")
    r = sub.add_parser("render", help="write FOLDER/README.md from its runs")
    r.add_argument("folder")
    r.add_argument("--check", action="store_true", help="change nothing; exit 1 if README.md is stale or a file "
                   "differs from its manifest")
    args = parser.parse_args(argv)
    if args.verb == "collect":
        collect(Path(args.dest), Path(args.source), args.commit, args.command)
        return 0
    folder = Path(args.folder)
    if not any(folder.glob("*/manifest.json")):
        print(f"error: {folder} holds no run folder (*/manifest.json); collect one first", file=sys.stderr)
        return 2
    problems = [p for run in sorted(folder.glob("*/manifest.json")) for p in verify(run.parent)]
    text = page(folder)
    target = folder / "README.md"
    if args.check:
        stale = not target.is_file() or target.read_text() != text
        for p in problems + ([f"{target} is stale; run python -m analysis.gpu_check render {folder}"] if stale else []):
            print(p, file=sys.stderr)
        return 1 if problems or stale else 0
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        return 1
    target.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
