"""The draft token choice and its top-1 probability: :class:`TokenChoice` (the controller's greedy hook) and
the one compiled call (CPU, float32) it makes both with: :func:`load` gives the compiled ``top1`` (ids and
probabilities), :func:`top1_torch` its torch fallback, :func:`top1_probability` the probabilities alone. Torch
takes four dispatches, each paying call overhead with cold caches after the drafter's forward; the compiled
function makes both in one pass per row: 12.4 / 29.7 / 52.0 µs against 41.7 / 73.4 / 112.6 µs in torch at 1 /
4 / 8 rows (``benchmarks/fused_top1_probe.py``, one thread, cold caches).

Contract: the ids equal ``x.max(-1).indices`` (mapped through ``targets``) exactly; the probabilities equal
``x.softmax(-1).amax(-1)`` to about 1e-6 relative (they only set how many tokens are drafted, never the output).
A non-finite row, or ``x`` not a contiguous float32 CPU matrix, returns ``(None, [])`` and torch is used. The
build (about 40 s, once per machine and source) is cached by torch under a hash of the source, flags and this
CPU's flags; without a C++ compiler and ninja, or with ``SPECLIMITS_TOP1_OP=off``, the controller uses torch.
``scripts/setup.sh test`` builds it (by hand: ``.venv/bin/python -m speclimits.control.top1op``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from typing import Any

import numpy as np

from speclimits.errors import SpeclimitsError
from speclimits.machine import cpu_info

SOURCE = r"""
#include <torch/extension.h>
#include <cstdint>
#include <cstring>
#include <vector>

// whether f is finite, from its bits (-ffast-math lets the compiler assume every float is finite, so
// std::isfinite cannot be trusted here; integer tests of the exponent can)
static inline bool bits_finite(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return (u & 0x7f800000u) != 0x7f800000u;
}

// Per row of x (rows x V): the first maximum's index, mapped through targets (V ids) unless targets is
// empty, and 1 / sum(exp(x - max)). (None, []) where x is not a contiguous float32 CPU matrix, targets
// not V contiguous int64 ids on the CPU, or a row is not finite.
std::tuple<torch::Tensor, std::vector<double>> top1(const torch::Tensor& x, const torch::Tensor& targets) {
  const std::tuple<torch::Tensor, std::vector<double>> refuse{torch::Tensor(), std::vector<double>()};
  if (!x.defined() || x.dim() != 2 || x.scalar_type() != torch::kFloat || !x.device().is_cpu() ||
      !x.is_contiguous())
    return refuse;
  const int64_t n = x.size(0), V = x.size(1);
  const bool mapped = targets.defined() && targets.numel() > 0;
  if (V == 0 || (mapped && (targets.scalar_type() != torch::kLong || !targets.device().is_cpu() ||
                            !targets.is_contiguous() || targets.numel() != V)))
    return refuse;
  const float* p = x.data_ptr<float>();
  const int64_t* tg = mapped ? targets.data_ptr<int64_t>() : nullptr;
  torch::Tensor ids = torch::empty({n}, torch::kLong);
  int64_t* out = ids.data_ptr<int64_t>();
  std::vector<double> top(n);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = p + r * V;
    float m = row[0];
    int64_t a = 0;
    for (int64_t v = 1; v < V; ++v) {
      if (row[v] > m) { m = row[v]; a = v; }  // strict: the first maximum
    }
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t v = 0; v < V; ++v) s += expf(row[v] - m);
    // a NaN anywhere in the row, or a row of -inf (then x - max is NaN), makes s NaN; +inf makes it NaN too
    if (!bits_finite(m) || !bits_finite(s)) return refuse;
    top[r] = 1.0f / s;
    out[r] = mapped ? tg[a] : a;
  }
  return std::make_tuple(ids, top);
}
"""

FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp-simd"]

#: the loaded module, or the reason there is none (a string), once :func:`load` ran
_STATE: dict[str, Any] = {}


def module_name() -> str:
    """The extension's name in torch's cache: the source, the flags, torch's version and this CPU hashed."""
    import torch

    cpu = cpu_info(every_flag=True)
    key = "\n".join([SOURCE, " ".join(FLAGS), torch.__version__, cpu["model"], " ".join(cpu["flags"])])
    return "speclimits_top1_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def load() -> Any | None:
    """The compiled module (built first when it is not in torch's cache, about 40 s), or None with the
    reason in :func:`status`. Loaded, and checked against torch on a few rows, once per process."""
    if "module" in _STATE:
        return _STATE["module"]
    mod, reason, t0 = None, None, time.perf_counter()
    setting = os.environ.get("SPECLIMITS_TOP1_OP", "auto").strip().lower()
    if setting in ("off", "0", "no", "false", "torch"):
        reason = f"SPECLIMITS_TOP1_OP={setting}"
    else:
        try:
            from torch.utils.cpp_extension import load_inline, verify_ninja_availability

            here = os.path.dirname(sys.executable)  # a virtual environment's ninja (vLLM's dependency)
            if shutil.which("ninja") is None and os.path.exists(os.path.join(here, "ninja")):
                os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
            verify_ninja_availability()
            mod = load_inline(module_name(), cpp_sources=SOURCE, functions=["top1"], extra_cflags=FLAGS,
                              verbose=False)
            bad = disagreement(mod)
            if bad:
                mod, reason = None, f"the compiled op disagrees with torch ({bad})"
        except Exception as e:  # no compiler, no ninja, a failed build: torch's path is used
            msg = str(e).strip()
            reason = f"{type(e).__name__}: {msg.splitlines()[-1] if msg else ''}"
            mod = None
    _STATE.update(module=mod, reason=reason, load_s=time.perf_counter() - t0)
    return mod


def disagreement(mod: Any) -> str | None:
    """Where ``mod.top1`` parts from :func:`top1_torch` on random rows, tied rows and refused inputs
    (None when it agrees: ids equal, probabilities within 1e-5 relative)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    none = torch.empty(0, dtype=torch.long)
    for n, V in ((1, 4096), (4, 4096), (8, 8192), (3, 5)):
        x = torch.randn(n, V, generator=gen) * 3.0
        x[-1, V // 3] = x[-1, V - 1] = x[-1].max() + 1.0  # a tie: the first maximum
        targets = torch.arange(V) * 2 + 1
        for tg in (targets, None):
            ids, top = mod.top1(x, none if tg is None else tg)
            ref_ids, ref_top = top1_torch(x, tg)
            if ids is None or not torch.equal(ids, ref_ids):
                return f"ids at {n} x {V}"
            if not all(abs(a - b) <= 1e-5 * b for a, b in zip(top, ref_top)):
                return f"probabilities at {n} x {V}"
    bad = torch.zeros(2, 6)
    bad[1, 2] = float("nan")
    for x in (bad, torch.full((1, 6), float("-inf")), torch.zeros(2, 6, dtype=torch.float64), torch.zeros(6, 2).t()):
        if mod.top1(x, none)[0] is not None:
            return f"no refusal of a {tuple(x.shape)} {x.dtype} input that torch must handle"
    return None


def status() -> dict[str, Any]:
    """``{"compiled": bool, "reason": str | None, "load_s": float}`` after :func:`load` (empty before)."""
    if not _STATE:
        return {}
    return {"compiled": _STATE["module"] is not None, "reason": _STATE["reason"], "load_s": _STATE["load_s"]}


def top1_torch(x: Any, targets: Any = None) -> tuple[Any, list[float]]:
    """The compiled ``top1`` in torch: (ids, top-1 probabilities) of each row of ``x``; the ids are the
    probabilities' first maximum, mapped through ``targets`` (``index_select``: no index parsing)."""
    top, idx = x.softmax(-1).max(-1)
    return (idx if targets is None else targets.index_select(0, idx)), top.tolist()


def top1_probability(logits: Any, n_rows: int) -> list[float]:
    """The top-1 probability of each row of a draft step's logits (or an EAGLE-3 head's own: the same softmax),
    as Python floats: one softmax and one max in torch (the fastest form ``benchmarks/top1_probe.py`` found)."""
    import torch  # vLLM's own dependency (already loaded wherever this runs)

    if logits is None or logits.shape[0] != n_rows:
        raise SpeclimitsError(f"speclimits control: the drafter's compute_logits gave "
                              f"{None if logits is None else logits.shape[0]} rows for {n_rows} requests")
    x = logits if logits.dtype == torch.float32 else logits.float()  # the drafter runs without autograd
    return x.softmax(-1).amax(-1).tolist()


class TokenChoice:
    """The draft token choice on the steps whose top-1 probability the policy reads: :meth:`top1` gives the ids
    (the first maximum, as vLLM's argmax) and the probabilities in one call. The first ``trials`` read steps per
    row count run vLLM's argmax instead, timed in place (:meth:`argmax`); each later read step books that median
    to :attr:`saved_s`, so decision time is reported net of the argmax taken over. Other steps run vLLM's own."""

    def __init__(self, trials: int = 8) -> None:
        self.trials = int(trials)
        #: per row count, the argmax's times in place (the first ``trials`` calls)
        self.times: dict[int, list[float]] = {}
        #: per row count, the median of :attr:`times` once complete
        self.argmax_s: dict[int, float] = {}
        self.saved_s = 0.0
        #: False: vLLM's argmax makes every draft token, the top-1 is computed after the step (a probe sets it)
        self.own = True
        #: the compiled top-1, or None (torch makes every top-1)
        self.op: Any = None
        self._no_targets: Any = None
        #: steps whose top-1 the compiled op made, and those torch made
        self.op_steps = self.torch_steps = 0
        #: this draft step's logits as vLLM made them: over the target vocabulary, and an EAGLE-3 head's own
        self.logits: Any = None
        self.head: Any = None
        #: whether the head's own logits give the target-vocabulary logits' top-1 (None: not checked yet)
        self.head_ok: bool | None = None
        #: target id of each of the head's logits, where they increase (the compiled call then maps ids)
        self.targets: Any = None

    def argmax(self, logits: Any) -> Any:
        """vLLM's ``logits.argmax(-1)``, timed per row count (its first ``trials`` calls)."""
        t0 = time.perf_counter()
        ids = logits.argmax(dim=-1)
        dt = time.perf_counter() - t0
        n = int(logits.shape[0])
        times = self.times.setdefault(n, [])
        times.append(dt)
        if len(times) >= self.trials:
            self.argmax_s[n] = float(np.median(times))  # kept: a read step books it
        return ids

    def load_op(self) -> None:
        import torch

        self.op = load()
        self._no_targets = torch.empty(0, dtype=torch.long)

    def top1(self, logits: Any, targets: Any = None) -> tuple[Any, list[float]]:
        """(ids, top-1 probabilities) of one step's ``logits`` (mapped through ``targets`` unless None): the compiled
        call, or torch where it is not loaded or refuses; the argmax it replaced is booked to :attr:`saved_s`."""
        self.saved_s += self.argmax_s.get(int(logits.shape[0]), 0.0)
        op = self.op
        if op is not None:
            ids, top1 = op.top1(logits, self._no_targets if targets is None else targets)
            if ids is not None:
                self.op_steps += 1
                return ids, top1
        self.torch_steps += 1
        return top1_torch(logits, targets)

    def check_head(self, head: Any, n: int, d2t: Any) -> None:
        """Once, on the first read step: whether the head's own logits give the target-vocabulary logits' top-1
        (:attr:`head_ok`); where ``d2t`` (``draft_id_to_target_id``) maps them to increasing target ids with the
        same argmax, :attr:`targets`."""
        full = self.logits
        self.head_ok = False
        if head is None or full is None or head.shape[0] != full.shape[0] or head.shape[-1] > full.shape[-1]:
            return
        if not np.allclose(top1_probability(head, n), top1_probability(full, n), rtol=1e-5, atol=1e-7):
            return
        if d2t is not None and d2t.shape[0] == head.shape[-1]:
            import torch

            targets = torch.arange(d2t.shape[0], device=d2t.device) + d2t.detach()
            if bool((targets[1:] > targets[:-1]).all()) and torch.equal(targets[head.max(-1).indices],
                                                                         full.argmax(dim=-1)):
                self.targets = targets
        self.head_ok = True

    def to_dict(self) -> dict[str, Any]:
        return {str(n): {"argmax_us": 1e6 * float(np.median(t)), "timed": len(t)} for n, t in sorted(self.times.items())}


if __name__ == "__main__":  # build (or load) the op and check it against torch; exit 1 where it is not usable
    if load() is None:
        raise SystemExit(f"speclimits top1op: not used ({status()['reason']}); the controller uses torch")
    print(f"speclimits top1op: {module_name()} ready in {status()['load_s']:.1f} s, agrees with torch")
