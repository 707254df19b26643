"""User-facing errors: each carries one line that says what is wrong and how to fix it."""


class SwiftKVError(ValueError):
    """An error the user can fix (bad argument, missing package, bad checksum, unsupported model).

    The CLI prints ``error: <message>`` and exits with status 2 instead of a traceback.
    """


class RunFailed(SwiftKVError):
    """A run that started and failed (a diverged distillation): the CLI prints its one line and exits with status 1,
    the status of a failed run, not of a usage error."""

    exit_status = 1
