"""Sweeps for ``tests/test_ray_sweep.py`` and ``benchmarks/bench_ray_sweep.py``, run inside a loopback-only network
namespace. ``python ray_scenarios.py WORK SCENARIO`` writes WORK/SCENARIO and prints one ``RESULT`` JSON line:
``serial`` the serial sweep (and Oracle pass with ``--oracle-k-max``); ``dist`` the same through ``speclimits trace
--workers 2`` (then the Oracle pass once more, with nothing left to run); ``kill`` worker 1 SIGKILLed mid-job once a
shard is on disk; ``resume`` as ``kill`` without retries (the sweep fails), then ``resume=True``."""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import threading
import time
from pathlib import Path


def _cpu_children_and_self() -> float:
    ru_self = resource.getrusage(resource.RUSAGE_SELF)
    ru_kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru_self.ru_utime + ru_self.ru_stime + ru_kids.ru_utime + ru_kids.ru_stime


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("work", type=Path)
    p.add_argument("scenario", choices=("serial", "dist", "kill", "resume"))
    p.add_argument("--k", default="0,3")
    p.add_argument("--limit", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=20)
    p.add_argument("--shard-size", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--kill-delay", type=float, default=None,
                   help="kill worker 1 this many seconds after its engine is up (the benchmark); default: when "
                        "it is given a job once some shard is on disk (deterministic)")
    p.add_argument("--prompts", default=None)
    p.add_argument("--batch", default=None, help="dist: batch sizes, as --batch of speclimits trace")
    p.add_argument("--oracle-k-max", type=int, default=None,
                   help="serial and dist: also run the Oracle pass with this K_max (dist: on the Ray workers)")
    args = p.parse_args()

    from speclimits.errors import SpeclimitsError
    from speclimits.paths import DATA_DIR
    from speclimits.tracing.ray_sweep import RaySettings, run_sweep_ray
    from speclimits.tracing.inputs import parse_k
    from speclimits.tracing.sweep import SweepConfig, run_sweep
    from speclimits.tracing.tinymodel import write_tiny_moe

    tiny = args.work / "tiny"
    if not (tiny / "config.json").exists():
        write_tiny_moe(tiny)
    out = args.work / args.scenario
    cfg = SweepConfig(target=str(tiny), draft=str(tiny), method="draft_model", out=str(out),
                      prompts=args.prompts or str(DATA_DIR / "prompts" / "smoke.jsonl"), k_values=parse_k(args.k),
                      max_tokens=args.max_tokens, load_format="dummy", tokens="all", progress=False,
                      limit=args.limit)
    events: list[tuple[float, str, dict]] = []
    t_start = time.perf_counter()
    killed: list[int] = []

    shards_done: list[dict] = []

    def on_event(kind: str, info: dict) -> None:
        events.append((round(time.perf_counter() - t_start, 3), kind, info))
        if args.scenario not in ("kill", "resume") or killed:
            return
        if kind == "done":
            shards_done.append(info)
        if info.get("worker") != 1 or not info.get("pid"):
            return
        if args.kill_delay is not None:
            if kind == "started":
                killed.append(info["pid"])
                threading.Timer(args.kill_delay, os.kill, (info["pid"], signal.SIGKILL)).start()
        elif kind in ("started", "dispatch") and shards_done:
            # the driver emits both right after handing worker 1 a job, so the kill lands mid-job (a timer
            # could fire while the worker sits idle after its last job, and then nothing fails)
            killed.append(info["pid"])
            os.kill(info["pid"], signal.SIGKILL)

    rs = RaySettings(workers=args.workers, shard_size=args.shard_size, on_event=on_event,
                     max_attempts=1 if args.scenario == "resume" else 3)
    cpu0, t0 = _cpu_children_and_self(), time.perf_counter()
    result: dict = {"scenario": args.scenario}
    if args.scenario == "serial":
        run_sweep(cfg)
        if args.oracle_k_max:
            from speclimits.tracing.oracle_mode import trace_oracle

            trace_oracle(cfg, k_max=args.oracle_k_max, batch=16)
    elif args.scenario == "resume":
        try:
            run_sweep_ray(cfg, rs)
            result["first_run"] = "completed"
        except SpeclimitsError as exc:
            result["first_run"] = f"failed: {str(exc)[:160]}"
        cfg.resume = True
        run_sweep_ray(cfg, RaySettings(workers=args.workers, shard_size=args.shard_size, on_event=on_event))
    elif args.scenario == "dist":
        from speclimits.cli import main as cli

        rc = cli(["trace", "--target", cfg.target, "--draft", cfg.draft, "--method", cfg.method, "--k", args.k,
                  "--prompts", cfg.prompts, "--limit", str(args.limit), "--max-tokens", str(args.max_tokens),
                  "--load-format", "dummy", "--tokens", "all", "--out", cfg.out, "--quiet",
                  "--workers", str(args.workers), "--shard-size", str(args.shard_size),
                  *(["--batch", args.batch] if args.batch else []),
                  *(["--oracle", "--oracle-k-max", str(args.oracle_k_max), "--oracle-batch", "16"]
                    if args.oracle_k_max else [])])
        if rc != 0:
            return rc
        if args.oracle_k_max:  # run again: every shard is on disk, so no job (and no Ray session) is needed
            from speclimits.tracing.ray_sweep import trace_oracle_ray

            dispatched = []
            rerun = RaySettings(workers=args.workers, shard_size=args.shard_size,
                                on_event=lambda kind, info: dispatched.append(kind))
            meta = trace_oracle_ray(cfg, args.oracle_k_max, 16, rerun)
            result["oracle_rerun"] = {"jobs": meta["oracle"]["distributed"]["runs"][-1]["jobs"], "events": dispatched}
    else:
        run_sweep_ray(cfg, rs)
    result.update(wall_s=round(time.perf_counter() - t0, 2), driver_cpu_s=round(_cpu_children_and_self() - cpu0, 2),
                  killed_pids=killed, events=events)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
