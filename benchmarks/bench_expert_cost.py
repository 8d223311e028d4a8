"""The per-expert cost of MoE layers by experiment: planted routing, interleaved and repeated passes.

A stack of MoE layers shaped like a Hugging Face ``config.json`` (default: Qwen3-30B-A3B, the shape of
the paper's Qwen3-Coder-30B-A3B target: hidden 2048, expert width 768, 128 experts, top-8, 48 layers),
random weights in the model's dtype, SwiGLU experts. For every budget m (tokens in the verification
pass, default 1..11) and every number of unique experts Ū from top_k to min(m * top_k, E) (or a grid,
``--u-points``), each layer's routing is *planted* (``speclimits.planted.planted_layers``) so that the
pass touches exactly Ū experts per layer; passes are timed in a shuffled order every repeat, with a
fresh planted routing each time. Per m it fits T = β0(m) + α(m)·Ū (OLS, HC3 intervals) and reports α
in the paper's units (ms per unit of the per-layer Ū over all layers of the pass), beside the
memory-bandwidth floor (bytes of one expert × layers / a measured device-to-device copy bandwidth)
and the paper's regression values (A100 80GB, bf16: 0.078-0.084 ms for m <= 4, 0.264-0.268 for
m >= 5), and says whether α steps at m = 4/5 when the routing is held fixed.

The experts of a layer run as one fused path per projection (gate and up fused, as serving engines
store them, then down), reading only the routed experts, so the cost grows with Ū:

* ``grouped``: ``torch._grouped_mm`` over all E experts with token offsets (experts without tokens
  are empty groups), on a CUDA device that has it (Hopper, bf16) — what serving engines' fused MoE
  kernels do;
* ``gather``: the fallback: gather the Ū routed experts' weights and run batched matmuls over them
  with every token of the pass (combine weight 0 where a token is not routed to an expert).

On a GPU each (m, Ū) pass is one CUDA graph (the routing buffers refilled before each replay, the
L2 cache flushed), timed with CUDA events; on a CPU with ``time.perf_counter``. ``--synthetic-alpha X``
replaces the timer by T = β0(m) + X·Ū + noise (no weights, nothing timed) to check the fit.

Examples::

    # CPU, small shape, seconds
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_expert_cost.py --smoke --out /tmp/cpu-small.json
    # GPU, the paper's shape in bf16, all 48 layers
    python benchmarks/bench_expert_cost.py --device cuda --dtype bfloat16 --repeats 10 --max-seconds 200 \\
        --out $OUT/h200.json
    # refit a result file (e.g. one written where statsmodels was missing)
    .venv/bin/python benchmarks/bench_expert_cost.py --refit data/expert_cost/h200.json

Writes ``--out`` (JSON: machine, shape, path, every timed pass, the fit) and prints a table; ``--json``
writes the headline figures for ``benchmarks/run_all.py``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
for _p in (BENCH_DIR, BENCH_DIR.parent / "src"):  # run from a source tree without install, too
    if str(_p) not in sys.path:
        sys.path.append(str(_p))

from speclimits.planted import fit_expert_cost, planted_layers, regime_step, routing_weights, u_bar_grid  # noqa: E402
from speclimits.tracing.capture import unique_per_layer  # noqa: E402

#: Qwen3-30B-A3B's config.json, the fields this benchmark reads (Qwen3-Coder-30B-A3B has the same MoE shape).
QWEN3_30B_A3B = {"name": "Qwen3-30B-A3B", "model_type": "qwen3_moe", "hidden_size": 2048,
                 "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                 "num_hidden_layers": 48, "torch_dtype": "bfloat16"}
#: The CPU small shape of ``--smoke``: seconds on one core.
SMOKE = {"name": "small (smoke)", "model_type": "qwen3_moe", "hidden_size": 256, "moe_intermediate_size": 128,
         "num_experts": 32, "num_experts_per_tok": 4, "num_hidden_layers": 4, "torch_dtype": "float32"}
SMOKE_REPEATS = 5

#: Synthetic timer: β0(m) = SYNTH_BETA0 + SYNTH_BETA0_SLOPE * m (ms).
SYNTH_BETA0, SYNTH_BETA0_SLOPE = 1.0, 0.2


# ---------------------------------------------------------------------------
# Shape
# ---------------------------------------------------------------------------


def moe_shape(config: dict[str, Any]) -> dict[str, Any]:
    """The MoE shape of a config.json dict: ``hidden``, ``inter`` (one expert's width), ``n_experts``,
    ``top_k``, ``n_layers`` (MoE layers: ``num_hidden_layers`` less ``first_k_dense_replace``),
    ``dtype`` (its torch dtype name), ``name``. Accepts Qwen-MoE, Mixtral and DeepSeek spellings."""
    def pick(*keys: str) -> Any:
        for k in keys:
            if config.get(k) is not None:
                return config[k]
        raise ValueError(f"config has none of {keys}")

    n_layers = int(pick("num_hidden_layers")) - int(config.get("first_k_dense_replace") or 0)
    return {"name": config.get("name") or config.get("_name_or_path") or config.get("model_type", "?"),
            "hidden": int(pick("hidden_size")),
            "inter": int(pick("moe_intermediate_size", "intermediate_size")),
            "n_experts": int(pick("num_experts", "n_routed_experts", "num_local_experts")),
            "top_k": int(pick("num_experts_per_tok")),
            "n_layers": n_layers,
            "dtype": str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")}


def bytes_per_expert(shape: dict[str, Any], dtype_bytes: int) -> int:
    """Weights of one SwiGLU expert: gate, up and down, ``3 * hidden * inter`` elements."""
    return 3 * shape["hidden"] * shape["inter"] * dtype_bytes


# ---------------------------------------------------------------------------
# The MoE stack (torch, imported by the caller)
# ---------------------------------------------------------------------------


class MoEStack:
    """``n_layers`` MoE layers of ``n_experts`` SwiGLU experts with random weights.

    ``w13[l]``: ``(E, 2 * inter, hidden)`` (gate rows, then up rows), ``w2[l]``: ``(E, hidden, inter)``,
    the layout vLLM's fused MoE keeps. A pass maps ``x`` of shape ``(m, hidden)`` through every layer
    with a residual: ``x <- x + sum_j w[t, j] * expert_{ids[t, j]}(x_t)``.
    """

    def __init__(self, shape: dict[str, Any], n_layers: int, dtype: Any, device: Any, seed: int = 0) -> None:
        import torch

        self.torch = torch
        self.hidden, self.inter, self.n_experts = shape["hidden"], shape["inter"], shape["n_experts"]
        self.top_k, self.n_layers, self.dtype, self.device = shape["top_k"], n_layers, dtype, torch.device(device)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        e, h, i = self.n_experts, self.hidden, self.inter
        self.w13 = [torch.empty(e, 2 * i, h, dtype=dtype, device=self.device).normal_(0, h ** -0.5, generator=gen)
                    for _ in range(n_layers)]
        self.w2 = [torch.empty(e, h, i, dtype=dtype, device=self.device).normal_(0, i ** -0.5, generator=gen)
                   for _ in range(n_layers)]

    # routing -> the index tensors each path reads (shapes fixed by (m, u_bar), values by the draw)
    def routing_arrays(self, ids: np.ndarray, weights: np.ndarray, path: str) -> dict[str, np.ndarray]:
        """Host arrays of one planted routing ``ids`` ``(L, m, top_k)`` with combine ``weights``
        ``(m, top_k)`` (the same for every layer) for ``path``:

        * ``grouped``: ``token`` ``(L, m*top_k)`` (the token of each row, rows sorted by expert),
          ``weight`` ``(L, m*top_k)``, ``offs`` ``(L, E)`` int32 (cumulative rows per expert);
        * ``gather``: ``experts`` ``(L, u)`` (the unique experts) and ``combine`` ``(L, u, m)``.
        """
        n_layers, m, k = ids.shape
        flat = ids.reshape(n_layers, m * k)
        if path == "grouped":
            order = np.argsort(flat, axis=1, kind="stable")
            token = (np.arange(m * k) // k)[order]
            weight = np.take_along_axis(np.broadcast_to(weights.reshape(1, -1), flat.shape), order, axis=1)
            counts = np.stack([np.bincount(f, minlength=self.n_experts) for f in flat])
            return {"token": token, "weight": weight, "offs": np.cumsum(counts, axis=1).astype(np.int32)}
        uniq = np.stack([np.unique(f) for f in flat])  # planted: the same size in every layer
        combine = np.zeros((n_layers, uniq.shape[1], m))
        for layer in range(n_layers):
            pos = np.searchsorted(uniq[layer], ids[layer])  # (m, k) row of each routed expert in uniq
            np.add.at(combine[layer], (pos, np.broadcast_to(np.arange(m)[:, None], (m, k))), weights)
        return {"experts": uniq, "combine": combine}

    def to_device(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        t = self.torch
        kinds = {"token": t.int64, "experts": t.int64, "offs": t.int32, "weight": self.dtype, "combine": self.dtype}
        return {k: t.as_tensor(v).to(device=self.device, dtype=kinds[k]) for k, v in arrays.items()}

    def fill(self, buffers: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Copy a new routing of the same shapes into ``buffers`` in place (what a captured graph reads)."""
        for k, v in self.to_device(arrays).items():
            buffers[k].copy_(v)

    def forward(self, x: Any, route: dict[str, Any], path: str) -> Any:
        """One pass: ``x`` ``(m, hidden)`` -> ``(m, hidden)``, through every layer."""
        for layer in range(self.n_layers):
            y = (self._grouped if path == "grouped" else self._gather)(x, route, layer)
            x = x + y
        return x

    def _grouped(self, x: Any, route: dict[str, Any], layer: int) -> Any:
        t, i = self.torch, self.inter
        token, offs = route["token"][layer], route["offs"][layer]
        rows = x.index_select(0, token)  # (m*k, hidden), sorted by expert
        h = t._grouped_mm(rows, self.w13[layer].transpose(-2, -1), offs=offs)  # (m*k, 2*inter)
        act = t.nn.functional.silu(h[:, :i]) * h[:, i:]
        out = t._grouped_mm(act, self.w2[layer].transpose(-2, -1), offs=offs)  # (m*k, hidden)
        return t.zeros_like(x).index_add_(0, token, out * route["weight"][layer][:, None])

    def _gather(self, x: Any, route: dict[str, Any], layer: int) -> Any:
        t, i = self.torch, self.inter
        experts = route["experts"][layer]
        w13 = self.w13[layer].index_select(0, experts)  # (u, 2*inter, hidden): only the routed experts
        h = t.matmul(w13, x.t())  # (u, 2*inter, m): every token through every routed expert
        act = t.nn.functional.silu(h[:, :i]) * h[:, i:] * route["combine"][layer][:, None, :]
        w2 = self.w2[layer].index_select(0, experts)  # (u, hidden, inter)
        return t.matmul(w2, act).sum(0).t()  # (m, hidden)


def choose_path(requested: str, device: str, dtype: Any) -> tuple[str, str]:
    """``(path, why)``: ``grouped`` where asked for or, with ``auto``, on a CUDA device of compute
    capability >= 9.0 in bfloat16 where a small ``torch._grouped_mm`` runs; else ``gather``."""
    import torch

    if requested == "gather":
        return "gather", "asked for (--path gather)"
    if not hasattr(torch, "_grouped_mm"):
        if requested == "grouped":
            raise SystemExit("bench_expert_cost: this torch has no torch._grouped_mm (--path grouped)")
        return "gather", "torch has no _grouped_mm"
    if requested == "auto":
        if not device.startswith("cuda"):
            return "gather", "auto: not a CUDA device"
        cap = torch.cuda.get_device_capability(torch.device(device))
        if cap < (9, 0) or dtype != torch.bfloat16:
            return "gather", f"auto: compute capability {cap[0]}.{cap[1]} / {dtype} (grouped needs >= 9.0, bf16)"
    try:
        a = torch.randn(8, 64, device=device).to(dtype)
        b = torch.randn(2, 32, 64, device=device).to(dtype)
        torch._grouped_mm(a, b.transpose(-2, -1), offs=torch.tensor([3, 8], dtype=torch.int32, device=device))
    except Exception as err:  # noqa: BLE001 (any refusal means: use the fallback)
        if requested == "grouped":
            raise SystemExit(f"bench_expert_cost: torch._grouped_mm fails here: {err}")
        return "gather", f"auto: torch._grouped_mm failed ({type(err).__name__})"
    return "grouped", "asked for (--path grouped)" if requested == "grouped" else "auto: torch._grouped_mm runs here"


# ---------------------------------------------------------------------------
# Machine record and copy bandwidth
# ---------------------------------------------------------------------------


def nvidia_smi() -> dict[str, str] | None:
    """Clocks, power limit, temperature and driver of GPU 0 from ``nvidia-smi`` (None without it)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    fields = ("name", "driver_version", "pstate", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "power.limit", "temperature.gpu", "memory.total")
    try:
        out = subprocess.run([exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        return {"error": str(err)}
    return dict(zip(fields, (v.strip() for v in out.split(",")))) if out else None


def machine_record(device: str) -> dict[str, Any]:
    import torch

    from speclimits.machine import cpu_info

    rec: dict[str, Any] = {"device": device, "cpu": cpu_info(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "python": platform.python_version(),
                           "numpy": np.__version__,
                           "load_average_before": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                           "torch_threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        dev = torch.device(device)
        props = torch.cuda.get_device_properties(dev)
        rec.update(device_name=props.name, capability=".".join(map(str, torch.cuda.get_device_capability(dev))),
                   memory_gib=round(props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count,
                   nvidia_smi_before=nvidia_smi())
        rec["driver"] = (rec["nvidia_smi_before"] or {}).get("driver_version")
    else:
        rec["device_name"] = rec["cpu"]["model"]
    return rec


def copy_bandwidth(device: str, nbytes: int, reps: int = 10) -> dict[str, float]:
    """Device-to-device copy of a ``nbytes`` tensor: seconds per copy (median of ``reps``) and
    GB/s counted as read + write (2 * nbytes per copy), the rate a weight-streaming kernel can reach."""
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    times = []
    for r in range(reps + 2):
        if device.startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            s = a.elapsed_time(b) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            s = time.perf_counter() - t0
        if r >= 2:
            times.append(s)
    sec = float(np.median(times))
    del src, dst
    return {"bytes": nbytes, "seconds": sec, "gb_per_s": 2 * nbytes / sec / 1e9}


# ---------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------


def configs(shape: dict[str, Any], ms: list[int], u_points: int | None) -> list[tuple[int, int]]:
    return [(m, u) for m in ms for u in u_bar_grid(m, shape["top_k"], shape["n_experts"], u_points)]


def measure(args: argparse.Namespace, shape: dict[str, Any], n_layers: int, todo: list[tuple[int, int]],
            rng: np.random.Generator, say) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Time every (m, u_bar) of ``todo`` once per repeat, in a fresh shuffled order each repeat, with
    a fresh planted routing for every pass. Returns the passes and what ran (path, timer, bandwidth)."""
    import torch

    device = args.device
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(args.seed)
    if not device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    path, why = choose_path(args.path, device, dtype)
    cuda = device.startswith("cuda")
    graphs = cuda and not args.no_graphs
    info: dict[str, Any] = {"path": path, "path_reason": why,
                            "timer": ("CUDA events around a CUDA-graph replay" if graphs else
                                      "CUDA events (eager)" if cuda else "time.perf_counter (eager)"),
                            "torch_threads": torch.get_num_threads()}
    say(f"path: {path} ({why}); timer: {info['timer']}")
    t0 = time.perf_counter()
    stack = MoEStack(shape, n_layers, dtype, device, seed=args.seed)
    if cuda:
        torch.cuda.synchronize()
    info["weights_gib"] = round(sum(w.numel() * w.element_size() for w in stack.w13 + stack.w2) / 2**30, 3)
    say(f"weights: {info['weights_gib']} GiB in {time.perf_counter() - t0:.1f} s")
    info["copy"] = copy_bandwidth(device, args.copy_mb * 2**20)
    say(f"copy bandwidth: {info['copy']['gb_per_s']:.1f} GB/s (read + write, {args.copy_mb} MiB tensor)")
    flush = torch.empty(args.flush_mb * 2**20 // 4, dtype=torch.float32, device=device) if cuda else None

    def draw(m: int, u: int) -> dict[str, np.ndarray]:
        ids = planted_layers(n_layers, m, shape["top_k"], shape["n_experts"], u, rng)
        assert (unique_per_layer(ids.swapaxes(0, 1)) == u).all()
        return stack.routing_arrays(ids, routing_weights(m, shape["top_k"], rng), path)

    # one input, one set of routing buffers (and one graph) per config
    state: dict[tuple[int, int], dict[str, Any]] = {}
    pool = torch.cuda.graph_pool_handle() if graphs else None
    t0 = time.perf_counter()
    for m, u in todo:
        x = torch.randn(m, shape["hidden"], device=device).to(dtype)
        route = stack.to_device(draw(m, u))
        st: dict[str, Any] = {"x": x, "route": route}
        if graphs:
            try:
                st["graph"] = capture(stack, x, route, path, pool)
            except Exception as err:  # noqa: BLE001 (a path that cannot be captured is timed eagerly)
                graphs = False
                info["timer"] = f"CUDA events (eager: graph capture failed, {type(err).__name__}: {err})"[:300]
                say(info["timer"])
                for other in state.values():
                    other.pop("graph", None)
                torch.cuda.synchronize()
        if not graphs:
            stack.forward(x, route, path)  # warm-up
        state[(m, u)] = st
    if cuda:
        torch.cuda.synchronize()
    info["setup_s"] = time.perf_counter() - t0
    say(f"{len(todo)} configs {'captured' if graphs else 'warmed up'} in {info['setup_s']:.1f} s")

    samples: list[dict[str, Any]] = []
    start = time.perf_counter()
    order = list(todo)
    for rep in range(args.repeats):
        if args.max_seconds and rep > 0 and time.perf_counter() - start > args.max_seconds:
            say(f"stopped after {rep} repeats: --max-seconds {args.max_seconds} reached")
            break
        rng.shuffle(order)
        for m, u in order:
            st = state[(m, u)]
            stack.fill(st["route"], draw(m, u))
            if cuda:
                flush.zero_()  # evict the last pass's weights from L2
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                if "graph" in st:
                    st["graph"].replay()
                else:
                    stack.forward(st["x"], st["route"], path)
                b.record()
                b.synchronize()
                ms = a.elapsed_time(b)
            else:
                t = time.perf_counter()
                stack.forward(st["x"], st["route"], path)
                ms = (time.perf_counter() - t) * 1e3
            samples.append({"m": m, "u_bar": u, "t_ms": round(ms, 6), "repeat": rep})
    info["repeats_done"] = 1 + max(s["repeat"] for s in samples)
    info["measure_s"] = time.perf_counter() - start
    return samples, info


def capture(stack: MoEStack, x: Any, route: dict[str, Any], path: str, pool: Any) -> Any:
    """A CUDA graph of one pass reading ``x`` and the routing buffers ``route`` (warmed up on a side stream)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            stack.forward(x, route, path)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        stack.forward(x, route, path)
    return graph


def synthetic(args: argparse.Namespace, todo: list[tuple[int, int]],
              rng: np.random.Generator) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """T = β0(m) + X·Ū + N(0, noise²) in place of a timer, the same interleaving; nothing is timed."""
    samples, order = [], list(todo)
    for rep in range(args.repeats):
        rng.shuffle(order)
        for m, u in order:
            t = SYNTH_BETA0 + SYNTH_BETA0_SLOPE * m + args.synthetic_alpha * u + rng.normal(0, args.synthetic_noise)
            samples.append({"m": m, "u_bar": u, "t_ms": float(t), "repeat": rep})
    return samples, {"path": "none (synthetic timer)", "path_reason": "--synthetic-alpha", "copy": None,
                     "timer": f"synthetic: {SYNTH_BETA0} + {SYNTH_BETA0_SLOPE}*m + {args.synthetic_alpha}*u_bar "
                              f"+ N(0, {args.synthetic_noise}^2) ms", "repeats_done": args.repeats}


# ---------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------


def paper_alpha(m: int) -> tuple[float, float] | None:
    """The paper's per-K range of α(m) (A100 80GB, bf16, regression on observed rounds); None at m = 1."""
    from speclimits import paper

    if m < 2:
        return None
    return paper.ALPHA_SMALL if m <= paper.BOUNDARY_M else paper.ALPHA_LARGE


def analyse(doc: dict[str, Any]) -> dict[str, Any]:
    """Fit per m and scale to all layers; the floor, the paper's values and the step at m = 4/5."""
    from speclimits import paper

    shape, used = doc["shape"], doc["layers_used"]
    scale = shape["n_layers"] / used
    fit = fit_expert_cost([{k: s[k] for k in ("m", "u_bar", "t_ms")} for s in doc["samples"]])
    floor = doc.get("floor") or {}
    floor_ms = floor.get("ms_per_expert_all_layers")
    paper_shape = (shape["hidden"], shape["inter"], shape["n_experts"], shape["top_k"], shape["n_layers"]) == (
        2048, 768, 128, 8, 48)
    rows = []
    for r in fit.to_dict("records"):
        for col in ("alpha", "alpha_lo", "alpha_hi", "beta0", "beta0_lo", "beta0_hi"):
            r[f"{col}_all_layers"] = r[col] * scale
        rng_paper = paper_alpha(int(r["m"]))
        r["paper_alpha_lo"], r["paper_alpha_hi"] = rng_paper if rng_paper else (None, None)
        mid = sum(rng_paper) / 2 if rng_paper else None
        ok = mid is not None and paper_shape and np.isfinite(r["alpha"])
        r["ratio_to_paper"] = r["alpha_all_layers"] / mid if ok else None
        r["ratio_to_floor"] = (r["alpha_all_layers"] / floor_ms if floor_ms and np.isfinite(r["alpha"]) else None)
        rows.append(r)
    scaled = fit.assign(alpha=fit["alpha"] * scale, alpha_se=fit["alpha_se"] * scale)
    step = regime_step(scaled, boundary=paper.BOUNDARY_M)
    step["paper_ratio"] = paper.ALPHA_LEVEL_RATIO
    notes = [f"α and β0 are fitted on passes of {used} layer(s); *_all_layers multiply by {shape['n_layers']}/{used} "
             "(β0 scaled assumes its cost is per layer)" if used != shape["n_layers"] else
             f"all {used} MoE layers timed: *_all_layers equal the fitted values"]
    if not paper_shape:
        notes.append("the shape is not the paper's (Qwen3-30B-A3B: 2048/768/128/top-8/48): no ratio to the paper")
    return {"by_m": rows, "step": step, "notes": notes, "paper_shape": paper_shape}


def floor_record(shape: dict[str, Any], dtype_bytes: int, copy: dict[str, Any] | None) -> dict[str, Any]:
    from speclimits import paper

    b = bytes_per_expert(shape, dtype_bytes)
    rec = {"bytes_per_expert": b, "layers": shape["n_layers"], "bytes_per_expert_all_layers": b * shape["n_layers"],
           "copy_gb_per_s": copy["gb_per_s"] if copy else None, "ms_per_expert_all_layers": None,
           "paper_estimate": paper.BANDWIDTH_ESTIMATE}
    if copy:
        rec["ms_per_expert_all_layers"] = b * shape["n_layers"] / (copy["gb_per_s"] * 1e9) * 1e3
    return rec


def _cell(est: Any, lo: Any = None, hi: Any = None, d: int = 4) -> str:
    if est is None or not np.isfinite(est):
        return "—"
    return f"{est:.{d}f}" + (f" [{lo:.{d}f}, {hi:.{d}f}]" if lo is not None and np.isfinite(lo) else "")


def table(doc: dict[str, Any]) -> str:
    """The result as text: one line per m."""
    a = doc["analysis"]
    if a is None:
        return f"{len(doc['samples'])} passes timed; no fit (statsmodels missing): refit with --refit FILE"
    floor = doc["floor"].get("ms_per_expert_all_layers")
    head = (f"{'m':>3} {'passes':>6} {'Ū':>7}  {'α all layers ms/expert [95%]':>30}  {'β0 all layers ms [95%]':>26}"
            f"  {'floor':>7} {'α/floor':>7} {'paper α':>11} {'α/paper':>7}")
    lines = [head]
    for r in a["by_m"]:
        paper_cell = f"{r['paper_alpha_lo']:.3f}-{r['paper_alpha_hi']:.3f}" if r["paper_alpha_lo"] else "—"
        lines.append(
            f"{r['m']:>3} {r['n']:>6} {int(r['u_min']):>3}-{int(r['u_max']):<3}  "
            f"{_cell(r['alpha_all_layers'], r['alpha_lo_all_layers'], r['alpha_hi_all_layers']):>30}  "
            f"{_cell(r['beta0_all_layers'], r['beta0_lo_all_layers'], r['beta0_hi_all_layers'], 3):>26}  "
            f"{_cell(floor, d=4):>7} {_cell(r['ratio_to_floor'], d=2):>7} {paper_cell:>11} "
            f"{_cell(r['ratio_to_paper'], d=2):>7}" + (f"  ({r['note']})" if r["note"] else ""))
    s = a["step"]
    if s.get("jump") is not None:
        lines.append(f"step at m = 4/5 (routing held fixed): α(5) - α(4) = {s['jump']:.4f} "
                     f"[{s['jump_lo']:.4f}, {s['jump_hi']:.4f}] ms; largest adjacent jump at {s['largest_jump_at']}; "
                     f"mean α m >= 5 / m <= 4 = {_cell(s['ratio_large_to_small'], d=2)} "
                     f"(paper ≈ {s['paper_ratio']}); "
                     f"step: {'yes' if s['step'] else 'no'}")
    lines += [f"note: {n}" for n in a["notes"]]
    return "\n".join(lines)


def figures(doc: dict[str, Any]) -> list[Any]:
    from _figures import Figure

    s, rows = doc["analysis"]["step"], doc["analysis"]["by_m"]
    out = [Figure("α mean over m ≤ 4, all layers", s.get("alpha_small_mean"), "ms/expert",
                  note=f"{doc['regime']}; path {doc['run']['path']}"),
           Figure("α mean over m ≥ 5, all layers", s.get("alpha_large_mean"), "ms/expert"),
           Figure("α ratio m ≥ 5 / m ≤ 4", s.get("ratio_large_to_small"), "x", note="paper ≈ 3.2"),
           Figure("bandwidth floor, all layers", doc["floor"].get("ms_per_expert_all_layers"), "ms/expert")]
    identified = [r for r in rows if r["alpha"] is not None and np.isfinite(r["alpha"])]
    if identified:
        out.append(Figure("largest α CI half-width / α", max((r["alpha_hi"] - r["alpha"]) / abs(r["alpha"])
                                                           for r in identified if r["alpha"]), "x"))
    out.append(Figure("wall time", doc.get("wall_s"), "s"))
    return out


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------


def parse_ms(text: str) -> list[int]:
    """``1-11`` or ``1,2,5`` or ``1-4,8``."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return sorted(set(out))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, help="a Hugging Face config.json (default: Qwen3-30B-A3B's shape, "
                                                "built in)")
    ap.add_argument("--smoke", action="store_true",
                    help=f"the CPU small shape ({SMOKE['hidden_size']}/{SMOKE['moe_intermediate_size']}, "
                         f"{SMOKE['num_experts']} experts, top-{SMOKE['num_experts_per_tok']}, "
                         f"{SMOKE['num_hidden_layers']} layers, float32), {SMOKE_REPEATS} repeats: seconds on one core")
    ap.add_argument("--layers", type=int, help="time a stack of this many MoE layers (default: all of the "
                                               "config's); figures are also scaled to all layers")
    ap.add_argument("--dtype", help="weights and activations (default: the config's torch_dtype; float32 with "
                                    "--smoke)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    ap.add_argument("--path", choices=("auto", "grouped", "gather"), default="auto",
                    help="grouped: torch._grouped_mm; gather: gather the routed experts + batched matmul; "
                         "auto: grouped on a CUDA device >= 9.0 in bf16 where it runs, else gather")
    ap.add_argument("--m", default="1-11", help="budgets m (tokens per pass): 1-11, 1,2,5 or 1-4,8 (default 1-11)")
    ap.add_argument("--u-points", type=int, help="u_bar values per m, evenly over its range (default: all)")
    ap.add_argument("--repeats", type=int, help=f"passes per (m, u_bar), each repeat in a new shuffled order "
                                                f"(default 10; {SMOKE_REPEATS} with --smoke)")
    ap.add_argument("--max-seconds", type=float, default=0.0,
                    help="stop starting new repeats after this many seconds of timing (0: no limit)")
    ap.add_argument("--no-graphs", action="store_true", help="on CUDA: time eager passes, not graph replays")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on CPU (default 1)")
    ap.add_argument("--copy-mb", type=int, help="tensor size of the copy-bandwidth measurement in MiB "
                                                "(default 2048 on CUDA, 256 on CPU)")
    ap.add_argument("--flush-mb", type=int, default=256, help="on CUDA: buffer written before each timed pass "
                                                              "to evict L2 (default 256 MiB)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--synthetic-alpha", type=float, metavar="X",
                    help="no timing: T = 1.0 + 0.2*m + X*u_bar + noise (ms), to check that the fit recovers X")
    ap.add_argument("--synthetic-noise", type=float, default=0.02, help="noise SD of --synthetic-alpha (ms)")
    ap.add_argument("--label", help="regime label for the book (default: from the device and shape)")
    ap.add_argument("--refit", type=Path, metavar="JSON", help="read a result file and fit it again (nothing "
                                                               "measured); rewrites it unless --out is given")
    ap.add_argument("--out", type=Path, help="write the result JSON here")
    ap.add_argument("--json", type=Path, help="write the headline figures here (for benchmarks/run_all.py)")
    ap.add_argument("--quiet", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    say = (lambda _msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
    wall = time.perf_counter()
    if args.refit:
        doc = json.loads(args.refit.read_text())
        doc["analysis"] = analyse(doc)
        out = args.out or args.refit
    else:
        doc = run(args, say, sys.argv[1:] if argv is None else list(argv))
        out = args.out
    doc["wall_s"] = doc.get("wall_s") or time.perf_counter() - wall
    print(table(doc))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(dumps(_json_ready(doc)))
        say(f"written: {out}")
    if args.json and doc["analysis"] is not None:
        from _figures import write_figures

        write_figures(args.json, figures(doc), {"out": str(out) if out else None, "regime": doc["regime"]})
    return doc


def run(args: argparse.Namespace, say, argv: list[str]) -> dict[str, Any]:
    wall = time.perf_counter()
    config = dict(SMOKE if args.smoke else QWEN3_30B_A3B)
    if args.config:
        config = json.loads(args.config.read_text())
    shape = moe_shape(config)
    dtype = args.dtype or ("float32" if args.smoke else shape["dtype"])
    args.dtype = dtype
    args.repeats = args.repeats or (SMOKE_REPEATS if args.smoke else 10)
    args.copy_mb = args.copy_mb or (2048 if args.device.startswith("cuda") else 256)
    used = min(args.layers or shape["n_layers"], shape["n_layers"])
    if used < 1:
        raise SystemExit("bench_expert_cost: --layers must be at least 1")
    todo = configs(shape, parse_ms(args.m), args.u_points)
    rng = np.random.default_rng(args.seed)
    dtype_bytes = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}.get(dtype)
    if dtype_bytes is None:
        raise SystemExit(f"bench_expert_cost: --dtype {dtype} is not one of float32, float16, bfloat16, float64")
    say(f"shape: {shape['name']}: hidden {shape['hidden']}, expert width {shape['inter']}, {shape['n_experts']} "
        f"experts, top-{shape['top_k']}, {used} of {shape['n_layers']} MoE layers, {dtype}; {len(todo)} (m, Ū) "
        f"configs x {args.repeats} repeats")
    synthetic_run = args.synthetic_alpha is not None
    if synthetic_run:
        machine = {"device": "none", "device_name": "synthetic timer", "python": platform.python_version()}
        samples, info = synthetic(args, todo, rng)
    else:
        machine = machine_record(args.device)
        samples, info = measure(args, shape, used, todo, rng, say)
        machine["load_average_after"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        if args.device.startswith("cuda"):
            machine["nvidia_smi_after"] = nvidia_smi()
    where = ("GPU " + machine.get("device_name", "?") if args.device.startswith("cuda") else
             "CPU " + str(machine.get("device_name", "?")))
    small = "small shape" if (shape["hidden"], shape["inter"]) != (2048, 768) else f"{shape['name']} shape"
    regime = args.label or ("synthetic timer (not a measurement)" if synthetic_run else f"{where}, {small}, measured")
    doc = {"kind": "expert_cost", "measured": not synthetic_run, "regime": regime,
           "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "produced_by": "python benchmarks/bench_expert_cost.py " + shlex.join(argv),
           "machine": machine, "config": config, "shape": shape, "layers_used": used, "dtype": dtype,
           "m": parse_ms(args.m), "u_points": args.u_points, "repeats": args.repeats, "seed": args.seed,
           "run": info, "floor": floor_record(shape, dtype_bytes, info.get("copy")), "samples": samples}
    doc["wall_s"] = time.perf_counter() - wall
    try:
        doc["analysis"] = analyse(doc)
    except ImportError as err:  # e.g. a device machine without statsmodels: keep the passes, refit later
        doc["analysis"] = None
        say(f"fit skipped ({err}); refit with --refit FILE where statsmodels is installed")
    return doc


def dumps(doc: dict[str, Any]) -> str:
    """The result as JSON text: indented, with one line per timed pass."""
    head = json.dumps({k: v for k, v in doc.items() if k != "samples"}, indent=1, allow_nan=False)
    rows = ",\n".join("  " + json.dumps(s, separators=(",", ":"), allow_nan=False) for s in doc.get("samples", []))
    return head[:-2] + ',\n "samples": [\n' + rows + "\n ]\n}\n"


def _json_ready(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_ready(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.bool_):
        return bool(x)
    return x


if __name__ == "__main__":
    main()
