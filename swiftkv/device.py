"""Where and in what precision a model runs: the device and dtype resolution every entry point shares."""

from __future__ import annotations

from pathlib import Path

import torch


def fast_dtype(device: str) -> torch.dtype:
    """bf16 where the hardware is fast at it (CUDA, CPUs with AVX512-BF16/AMX), else fp32."""
    if device.startswith("cuda"):
        return torch.bfloat16
    has_bf16 = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "")() in ("AVX512", "AMX")
    try:
        flags = Path("/proc/cpuinfo").read_text()
        has_bf16 = has_bf16 and ("avx512_bf16" in flags or "amx_bf16" in flags)
    except OSError:
        pass
    return torch.bfloat16 if has_bf16 else torch.float32


def resolve_dtype(name, device: str = "cpu") -> torch.dtype:
    """'auto' -> ``fast_dtype(device)``; a dtype name (float32, bf16, ...) -> that torch dtype."""
    from swiftkv.loading import parse_dtype

    return fast_dtype(device) if name == "auto" else parse_dtype(name)


def resolve_device(name: str) -> str:
    """'auto' -> 'cuda' where a GPU is visible, else 'cpu'; anything else as given."""
    if name != "auto":
        return name
    return "cuda" if torch.cuda.is_available() else "cpu"
