"""Subprocesses that never outlive their parent: each in its own process group, told to die with this process, the
whole group terminated on exit (SIGTERM, then SIGKILL), SIGTERM to this process turned into the exit that runs
those ``finally`` blocks. Used by the vLLM engine (``swiftkv.bench.serving.vllm``) for its servers and benchmarks."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _raise_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def process_group(cmd: list[str], env: dict[str, str], log_path: Path):
    """Start ``cmd`` in its own process group (output to ``log_path``); always end the whole group on exit."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent)
        try:
            yield proc
        finally:
            stop_group(proc)
            signal.signal(signal.SIGTERM, previous)


def stop_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL what is left after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(proc.pid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def tail(path: Path, lines: int = 1, match: str | None = None) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    if match:
        text = [t for t in text if match in t] or text
    return " | ".join(t.strip() for t in text[-lines:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_list() -> str:
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return ",".join(map(str, cpus))
