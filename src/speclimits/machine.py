"""Which machine a timing belongs to: the CPU's model and the instruction-set flags that change kernels.

The same pair of models ran plain decoding at 10.6–11.0 ms/token on a CPU with AVX-512 and at
20–28 ms/token on one with AVX2 alone, and their greedy outputs differed (other kernels, other
rounding): a number without its machine cannot be compared. :func:`cpu_info` reads ``/proc/cpuinfo``
(Linux; elsewhere what :mod:`platform` knows) and keeps the flags of :data:`KERNEL_FLAGS`.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

#: Instruction-set extensions that select different matmul / attention kernels in PyTorch and vLLM's CPU build.
KERNEL_FLAGS = ("avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_info(cpuinfo: str | Path = "/proc/cpuinfo", every_flag: bool = False) -> dict[str, Any]:
    """``{"model": ..., "flags": [...], "cores": n}``: the first processor's model name and which of
    :data:`KERNEL_FLAGS` it has (in that order; ``every_flag``: all its flags, sorted)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key == "flags":
            flags = set(value.split())
            break
    chosen = sorted(flags) if every_flag else [f for f in KERNEL_FLAGS if f in flags]
    return {"model": model, "flags": chosen, "cores": os.cpu_count()}


def describe(info: dict[str, Any]) -> str:
    """One line for a page: ``"AMD EPYC ... (2 cores; avx2, avx512f, ...)"``."""
    flags = ", ".join(info.get("flags") or []) or "no AVX2/AVX-512/AMX flags"
    return f"{info.get('model', '?')} ({info.get('cores', '?')} cores; {flags})"
