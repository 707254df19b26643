"""User-facing errors: each carries one line that says what is wrong and how to fix it."""


class SwiftKVError(ValueError):
    """An error the user can fix (bad argument, missing package, bad checksum, unsupported model).

    The CLI prints ``error: <message>`` and exits with status 2 instead of a traceback.
    """


class RunFailed(SwiftKVError):
    """A run that started and failed (a diverged distillation): the CLI prints its one line and exits with status 1,
    the status of a failed run, not of a usage error."""

    exit_status = 1


def print_error(message: str) -> None:
    """``message`` as one line on stderr in a single write: the ranks of a launch share the stream, and a line written
    in pieces (text, then its newline) can run into another rank's."""
    import io
    import os
    import sys

    line = f"error: {message}\n"
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # a captured stream (tests): one write call
        sys.stderr.write(line)
        return
    sys.stderr.flush()
    os.write(fd, line.encode(errors="replace"))
