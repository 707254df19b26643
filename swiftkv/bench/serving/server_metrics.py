"""What a running vLLM server says of itself on ``/metrics`` (Prometheus text): how many requests it runs at once.

The kv-limit study's mechanism is concurrency: a smaller KV cache per request lets more requests run together. vLLM
publishes the requests its scheduler is running as the gauge ``vllm:num_requests_running`` (one label set per engine
core), so a round's concurrency is measured, not inferred from the cache size: ``RunningRequests`` polls the gauge
from a thread while the round runs and keeps the peak.
"""

from __future__ import annotations

import contextlib
import threading
import urllib.error
import urllib.request

RUNNING_GAUGE = "vllm:num_requests_running"


def running_requests(metrics: str) -> float | None:
    """The requests a vLLM server is running now, from its Prometheus text (``vllm:num_requests_running``, summed
    over its label sets: one per engine); None where the text has no such gauge."""
    values = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if line.startswith(RUNNING_GAUGE) and line[len(RUNNING_GAUGE):len(RUNNING_GAUGE) + 1] in ("{", " ")]
    return sum(values) if values else None


class RunningRequests:
    """While open, polls a server's ``/metrics`` every ``interval`` seconds from a thread; ``peak``: the most
    requests it ran at once (None if no poll read the gauge)."""

    def __init__(self, url: str, interval: float = 0.2):
        self.url, self.interval = url, interval
        self.peak: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while True:
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                text = urllib.request.urlopen(f"{self.url}/metrics", timeout=2).read().decode(errors="replace")
                now = running_requests(text)
                if now is not None:
                    self.peak = now if self.peak is None else max(self.peak, now)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "RunningRequests":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
