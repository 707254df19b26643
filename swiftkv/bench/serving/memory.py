"""Peak memory of a code block: process RSS sampled by a thread (CPU) or the CUDA allocator's peak (GPU).

The C allocator keeps freed blocks for reuse, so an in-process RSS peak says little about the block itself
unless large allocations go straight to the kernel: ``large_allocations_unpooled()`` sets glibc's mmap
threshold low (32 KiB) so that every large tensor is mapped on allocation and unmapped when freed, and the RSS
rise during the block is the memory the block really held (KV cache, activations, logits).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time

import torch

logger = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def rss_bytes() -> int:
    """Resident set size of this process now (Linux), 0 where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return 0


def large_allocations_unpooled(threshold: int = 32 * 1024) -> bool:
    """Ask glibc to mmap (and unmap on free) every allocation >= ``threshold``; False where that is not possible."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, threshold) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, threshold) == 1
        libc.malloc_trim(0)
        return ok
    except (OSError, AttributeError):
        return False


class PeakMemory:
    """``with PeakMemory(device) as m: ...`` then ``m.peak`` (bytes) and ``m.delta`` (peak minus the level before).

    CPU: RSS sampled every ``interval`` s by a thread (torch kernels release the GIL, so it keeps sampling).
    CUDA: ``torch.cuda.max_memory_allocated`` (exact).
    """

    def __init__(self, device: torch.device | str = "cpu", interval: float = 0.002):
        self.device = torch.device(device)
        self.interval = interval
        self.before = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def delta(self) -> int:
        return max(0, self.peak - self.before)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval)

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.before = self.peak = torch.cuda.memory_allocated(self.device)
        else:
            self.before = self.peak = rss_bytes()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, rss_bytes())
