"""Serial vs distributed (Ray, 2 workers) K sweep on the same prompts and K values, and the fault run.

Every run is the scenario script ``tests/ray_scenarios.py`` in its own process, and every run
that starts Ray runs inside a loopback-only network namespace created here
(:func:`speclimits.tracing.ray_sweep.loopback_command`: ``unshare -n``, ``lo`` up, usage
statistics off, scratch HOME); the serial run goes through the same wrapper so that both pay
the same start-up. The tiny config-only MoE (dummy weights, the target as its own draft).

Figures per run: wall seconds (inside the script: planning to finalised meta.json, Ray start
and engine builds included); CPU seconds of the reaped process tree (``RUSAGE_CHILDREN`` of this
process around the run: the script and, for Ray runs, the driver with Ray's GCS and raylet;
Ray's worker processes are not reaped into it); the workers' own CPU seconds
(``time.process_time`` each reports at the end; a killed worker's are lost); their sum; engine
builds; and for the fault run the retried jobs and worker restarts. The wall-time ratio is serial /
distributed (> 1: distributed is faster). After the runs, the traces are compared: tokens,
accepted counts and rounds per generation must be equal.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_ray_sweep.py [--prompts 8] [--k 0-3] [--max-tokens 48] \
        [--repeat 1] [--json PATH]

``--json PATH``: also write the wall times, the ratios and the fault run's retries as figures (no
targets; ``benchmarks/_figures.py``, read by ``benchmarks/run_all.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from _figures import Figure, write_figures

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "tests" / "ray_scenarios.py"


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _run(work: Path, scenario: str, env: dict[str, str], extra: list[str]) -> dict:
    from speclimits.tracing.ray_sweep import loopback_command

    cpu0 = _children_cpu()
    proc = subprocess.run(loopback_command([sys.executable, str(SCENARIOS), str(work), scenario, *extra]),
                          capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{scenario} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    out["tree_cpu_s"] = round(_children_cpu() - cpu0, 2)
    return out


def _same_trace(a: Path, b: Path) -> bool:
    from speclimits.trace import read_generations, read_trace

    def per_generation(root: Path) -> dict:
        gens = read_generations(root)
        r = read_trace(root).rounds.sort_values(["generation_id", "round"])
        return {int(g): (gens[int(g)]["output_token_ids"],
                         d[["n_draft", "n_accepted", "n_emitted", "m", "context_len"]].to_numpy().tolist())
                for g, d in r.groupby("generation_id")}

    return per_generation(a) == per_generation(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="token-id prompts (random, 16-40 tokens)")
    ap.add_argument("--k", default="0-3", help="K values (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--shard-size", type=int, default=2)
    ap.add_argument("--kill-delay", type=float, default=1.0, help="seconds after worker 1's engine is up")
    ap.add_argument("--repeat", type=int, default=1, help="serial/distributed pairs (alternating order)")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the headline figures as JSON")
    args = ap.parse_args()
    load0 = os.getloadavg()

    from speclimits.tracing.ray_sweep import loopback_available, loopback_env

    why = loopback_available()
    if why:
        raise SystemExit(f"cannot run Ray safely here: {why}")
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    rng = random.Random(0)
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"r{i}", "prompt_token_ids": [rng.randrange(1, 512) for _ in
                                                                               range(rng.randrange(16, 41))]}) + "\n"
                               for i in range(args.prompts)))
    (work / "home").mkdir()
    env = loopback_env(work / "home")
    env["PYTHONPATH"] = str(ROOT / "src") + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    extra = ["--k", args.k, "--limit", str(args.prompts), "--max-tokens", str(args.max_tokens), "--prompts",
             str(prompts), "--shard-size", str(args.shard_size), "--kill-delay", str(args.kill_delay)]
    # serial and distributed alternate (a shared machine's load drifts); the fault run comes last
    order = [(f"rep{i}", s) for i in range(args.repeat) for s in (("serial", "dist") if i % 2 == 0 else
                                                                  ("dist", "serial"))] + [("rep0", "kill")]
    results = {}
    for rep, scenario in order:
        (work / rep).mkdir(exist_ok=True)
        results[rep, scenario] = _run(work / rep, scenario, env, extra)

    from speclimits.trace import read_trace

    print(f"tiny MoE, {args.prompts} prompts x K = {args.k}, {args.max_tokens} tokens each, shard size "
          f"{args.shard_size}; work folder {work}; load average before/after: {load0} / {os.getloadavg()}")
    print(f"{'run':12s} {'wall s':>8s} {'tree CPU s':>11s} {'worker CPU s':>13s} {'CPU s':>8s} {'builds':>7s} "
          f"{'retried':>8s} {'restarts':>9s} {'equal serial':>13s}")
    cpu, figures, runs = {}, [], {}
    for (rep, name), res in results.items():
        meta = read_trace(work / rep / name).meta
        run = (meta.get("distributed") or {}).get("runs", [{}])[-1]
        usage = run.get("usage", [])
        worker_cpu = sum(u["cpu_s"] for u in usage)
        cpu[rep, name] = res["tree_cpu_s"] + worker_cpu
        builds = sum(u["engine_builds"] for u in usage) if usage else len(meta["k_values"])
        same = (_same_trace(work / "rep0" / "serial", work / rep / name) and meta["complete"]
                and meta["checks"]["counters_match"])
        print(f"{rep + ' ' + name:12s} {res['wall_s']:8.1f} {res['tree_cpu_s']:11.1f} {worker_cpu:13.1f} "
              f"{cpu[rep, name]:8.1f} {builds:7d} {run.get('retried_jobs', 0):8d} {run.get('worker_restarts', 0):9d} "
              f"{str(same):>13s}")
        runs[f"{rep} {name}"] = dict(wall_s=res["wall_s"], tree_cpu_s=res["tree_cpu_s"], worker_cpu_s=worker_cpu,
                                     cpu_s=cpu[rep, name], builds=builds, retried=run.get("retried_jobs", 0),
                                     restarts=run.get("worker_restarts", 0), equal_serial=bool(same))
        figures.append(Figure(f"ray sweep, {rep} {name}: wall time", res["wall_s"], "s",
                              note=f"CPU {cpu[rep, name]:.1f} s, {builds} engine builds"
                                   + (f", {run.get('retried_jobs', 0)} retried jobs, {run.get('worker_restarts', 0)} "
                                      "worker restarts" if name == "kill" else "")
                                   + f"; trace equal to serial: {same}"))
    for i in range(args.repeat):
        ser, dist = results[f"rep{i}", "serial"], results[f"rep{i}", "dist"]
        print(f"rep{i}: wall-time ratio serial / 2 workers: {ser['wall_s'] / dist['wall_s']:.2f}x; "
              f"CPU time 2 workers / serial: {cpu[f'rep{i}', 'dist'] / cpu[f'rep{i}', 'serial']:.2f}x")
        figures += [Figure(f"ray sweep, rep{i}: wall-time ratio serial / 2 workers", ser["wall_s"] / dist["wall_s"],
                           "x", better="higher"),
                    Figure(f"ray sweep, rep{i}: CPU time 2 workers / serial",
                           cpu[f"rep{i}", "dist"] / cpu[f"rep{i}", "serial"], "x")]
    if args.json:
        write_figures(args.json, figures, extra={
            "prompts": args.prompts, "k": args.k, "max_tokens": args.max_tokens, "shard_size": args.shard_size,
            "kill_delay": args.kill_delay, "repeat": args.repeat, "runs": runs,
            "all_equal_serial": all(r["equal_serial"] for r in runs.values())})


if __name__ == "__main__":
    main()
