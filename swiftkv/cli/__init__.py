"""The ``swiftkv`` command line: one module per family of commands, each parser beside its handler, and the
handlers parse options and call the library. Each command imports its heavy dependencies only when it runs.

- ``options``: the parser class, argument types, model arguments, dtype / device resolution;
- ``model``: prepare-model, convert, generate, simscore, flops;
- ``distill``: distill, teacher-cache;
- ``bigbench``: the benchmark task files (fetch, extract, generate, build ...);
- ``evaluate``: heldout-ppl-task, eval, fidelity-teacher, long-context;
- ``bench``: bench prefill / distill / distill-memory; ``serving``: bench serve / vllm / served-fidelity /
  sharegpt-requests.

A command's parser says, in its defaults, what it writes (``output_kind``: a ``dir`` or a ``file``, checked before
any work; any other kind is checked by the command), whether its model is checked before torch is imported
(``check_model``, default yes) and whether that check includes the student's shape (``check_student_shape``).
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys

from swiftkv.cli import bench, bigbench, distill, evaluate, model
from swiftkv.cli.options import Parser
from swiftkv.errors import SwiftKVError, print_error


def command_inputs(args) -> list[str]:
    """The local paths a command reads (its model, --base, --teacher-cache, task and data files ...): its output may
    never be, contain or lie inside one of them."""
    from swiftkv.data.assets import EMBEDDED_MODELS, model_dir

    found = []
    for name in INPUT_OPTIONS:
        values = getattr(args, name, None)
        for value in values if isinstance(values, list) else [values]:
            if not isinstance(value, str) or not value:
                continue
            if name == "models":
                value = value.partition("=")[2]  # bench vllm's LABEL=MODEL
            if value in EMBEDDED_MODELS:
                value = str(model_dir(value, getattr(args, "resources", None)))
            if os.path.exists(value):
                found.append(value)
    return found


# options whose values are paths a command reads
INPUT_OPTIONS = ("model", "base", "models", "teacher_cache", "tasks_json", "bigbench_manifest", "include_path",
                 "tasks_dir", "tarball", "heldout", "requests", "trained", "model_config", "variants",
                 "fidelity_teacher")


def check_outputs(args) -> None:
    """Refuse bad output paths (foreign, protected, a link, the wrong kind, the command's own input) before the
    command does any work."""
    from swiftkv.io import check_not_input, check_output_dir, check_output_file

    kind = getattr(args, "output_kind", None)
    target = getattr(args, "output_dir", None) or getattr(args, "output", None)
    if kind not in ("dir", "file") or target is None:
        return
    inputs = command_inputs(args)
    if kind == "dir":
        what = getattr(args, "output_what", None)
        what = what(args) if callable(what) else what
        check_output_dir(target, args.overwrite, what, inputs, replace=not getattr(args, "output_appends", False))
        return
    check_output_file(target, args.overwrite, inputs)
    for extra in getattr(args, "extra_outputs", lambda _: [])(args):  # e.g. simscore's metadata beside its CSV
        check_output_file(extra, args.overwrite, inputs)
    for folder in getattr(args, "extra_dirs", lambda _: [])(args):  # e.g. a benchmark's work folder (added to)
        check_not_input(folder, inputs, new_inside_ok=True)


def check_inputs(args) -> None:
    """The model a command reads, checked before torch is imported: unknown id, damaged directory, --teacher on a
    model that is not a SwiftKV checkpoint, a student shape (convert's l, g) that does not fit it."""
    from swiftkv.loading import check_student_shape, require_swiftkv_checkpoint, resolve_model

    name = getattr(args, "model", None)
    # distill checks its model itself, after its settings (a bad variant or option is named first)
    if name is None or not getattr(args, "check_model", True) or getattr(args, "random_weights", False):
        return
    if name.endswith(".json") and os.path.isfile(name):  # a config for random weights (timing only)
        return
    resources = getattr(args, "resources", None)
    resolve_model(name, resources)
    if getattr(args, "teacher", False):
        require_swiftkv_checkpoint(name, resources, "--teacher")
    if getattr(args, "check_student_shape", False):
        check_student_shape(name, resources, args.num_key_value_layers, args.key_value_group_size)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="swiftkv",
        description="SwiftKV: rewire, distil, evaluate and benchmark prefill-skipping transformers models.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    model.add_parsers(sub)
    distill.add_parsers(sub)
    bigbench.add_parsers(sub)
    evaluate.add_parsers(sub)
    group = sub.add_parser("bench", help="benchmarks (results saved as JSON)").add_subparsers(dest="bench",
                                                                                               metavar="BENCH")
    group.required = True
    bench.add_parsers(group)
    _add_overwrite_flags(parser)
    return parser


def _add_overwrite_flags(parser: argparse.ArgumentParser) -> None:
    """Give every command that writes an output ``--overwrite`` (see swiftkv.io for what it permits)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _add_overwrite_flags(child)
    if parser.get_default("output_kind") is not None:
        parser.add_argument("--overwrite", action="store_true",
                            help="replace an existing output that swiftkv did not write (never the working "
                            "directory, its ancestors, a repository, your home, or a symbolic link)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from swiftkv import io

    io.COMMAND = shlex.join(["swiftkv", *(sys.argv[1:] if argv is None else argv)])  # recorded in output markers
    try:
        check_outputs(args)
        check_inputs(args)
        args.func(args)
    except SwiftKVError as err:
        print_error(str(err))
        return getattr(err, "exit_status", 2)
    except OSError as err:  # a missing input, an unwritable place, a full disk: one line, not a traceback
        where = f": {err.filename}" if err.filename else ""
        print_error(f"{err.strerror or err}{where}")
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        io.COMMAND = None
    return 0
