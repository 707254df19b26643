"""What every ``swiftkv`` command shares: the parser with one-line errors, argument types, the model arguments, and
dtype / device resolution (the core's, imported when a command runs)."""

from __future__ import annotations

import argparse
import math

from swiftkv.errors import SwiftKVError


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: X)" to an option's help unless the help already names its default or there is none."""

    def _get_help_string(self, action):
        if "default" in (action.help or "") or action.default is None:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``error: swiftkv CMD: what is wrong (see swiftkv CMD --help)``, exit 2."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer (>= 1)")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give an integer >= 0")
    return value


def number(low: float = -math.inf, high: float = math.inf, low_open: bool = False, high_open: bool = False):
    """argparse type: a finite number in the interval from ``low`` to ``high`` (open at the ends marked so)."""
    shown = (f"{'(' if low_open or low == -math.inf else '['}{low:g}, "
             f"{high:g}{')' if high_open or high == math.inf else ']'}")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number")
        below = value < low or (low_open and value == low)
        above = value > high or (high_open and value == high)
        if below or above:
            raise argparse.ArgumentTypeError(f"{value:g} is outside {shown}")
        return value

    parse.__name__ = "number"  # argparse names the type in its messages
    return parse


def unit_fraction(text: str) -> float:
    """argparse type: a number in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value} is outside (0, 1]")
    return value


def non_empty(text: str) -> str:
    """argparse type: a string with something in it."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def add_model_args(p: argparse.ArgumentParser, dtype: str = "float32") -> None:
    p.add_argument("model", help="embedded id (e.g. smollm2-135m), a model directory, or a hub id (owner/name)")
    p.add_argument("--dtype", default=dtype, help=f"weights dtype: float32, bfloat16, float16, or auto (default {dtype})")
    p.add_argument("--resources", default=None, help="resources folder (default $SWIFTKV_RESOURCES or ./resources)")


def resolve_dtype(name: str, device: str = "cpu"):
    from swiftkv.device import resolve_dtype as resolve

    return resolve(name, device)


def resolve_device(name: str) -> str:
    from swiftkv.device import resolve_device as resolve

    return resolve(name)


def as_teacher(model, name: str) -> None:
    """Run a SwiftKV checkpoint with its original wiring; a hub model's type is known only once it is loaded."""
    if not hasattr(model, "swiftkv"):
        raise SwiftKVError(f"--teacher needs a SwiftKV checkpoint; {name} is a {model.config.model_type} model, "
                           "which always runs as itself (drop --teacher)")
    model.swiftkv(False)
