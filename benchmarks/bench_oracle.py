"""Benchmark: the Oracle's solve on 1M states and its bootstrap interval on the measured trace.

**Solve.** Builds a synthetic instance (default 2,000 sequences x 500 states = 1,000,000 states,
K_max = 12) and times

* the package's one solver, :func:`speclimits.oracle.solver.backward_induction` (numpy lockstep
  backward induction), values only (V(0) of every sequence, round costs included), and as
  :func:`speclimits.oracle.solve` runs it: V, k*, the full Q table and, in the same sweep, the policy
  evaluations behind the bounds (every static K, the Oracle's breakdown, rounds and accepted length);
* that full solve against the procedure it replaced (``tests/reference_oracle.py``'s plain backward
  induction, then separate :func:`~speclimits.oracle.solver.evaluate_arrays` passes for the Oracle's
  policy and for every static K), checking that the numbers are the same bits, and against
  ``tests/reference_oracle.py``'s ``solve_python`` (a loop over sequences, states and k), checking that
  the values are identical.

**Interval.** On a trace (default the bundled measured one, greedy references as in the headline)
times :func:`speclimits.oracle.uncertainty.bootstrap_bound` (199 replicates: refits from
per-generation sufficient statistics, every static K priced by linearity, the Oracle re-solved for
all replicates at once) against ``tests/reference_oracle.py``'s ``direct_replicates`` (resample
the rounds, refit, solve, one replicate at a time; ``--direct-boot`` of them, extrapolated to 199),
compares the replicates, and times ``speclimits oracle TRACE`` end to end (default interval, and
``--n-boot 0``).

Every figure is printed with its target and the ratio figure / target (<= 1: met). Times are the
best of ``--repeat`` runs (the first run of the full solve is printed too: it pays the page faults
of its 100 MB Q table); the load average is printed beside them.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_oracle.py [--sequences 2000] [--length 500]
        [--k-max 12] [--python-sequences N]   # N < sequences: the Python loop runs on the first N and is
                                              # extrapolated linearly (said so in the output)
        [--trace data/traces/measured-eagle3] [--direct-boot 20] [--skip-cli] [--json PATH]

``--json PATH``: also write the figures of the final table (``benchmarks/_figures.py``; read by
``benchmarks/run_all.py``); the "before" rows, the procedures replaced, go there without a target.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from speclimits.bootstrap import HEADLINE_N_BOOT, draw_counts
from speclimits.costmodel import CostModel
from speclimits.oracle import OracleInputs, prepare_oracle, solve
from speclimits.oracle.inputs import CostTable
from speclimits.oracle.solver import PART_NAMES, Layout, accepted_at, evaluate_arrays, first_values, survival
from speclimits.oracle.uncertainty import bootstrap_bound

from _figures import Figure, write_figures

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the reference copies live with the tests
from reference_oracle import backward_induction, direct_replicates, solve_python  # noqa: E402
#: Targets (seconds): issue 21 for the full solve and the command line; the original ones for the core.
TARGET_FULL_SOLVE_S = 1.0
TARGET_CLI_S = 5.0
TARGET_BACKWARD_S = 5.0
TARGET_PYTHON_RATIO = 100.0


def make_instance(n_seq: int, length: int, k_max: int, seed: int = 0) -> tuple[OracleInputs, CostModel]:
    rng = np.random.default_rng(seed)
    # lengths vary (length/2 .. 3 length/2) and add up to exactly n_seq * length states
    lengths = rng.integers(length // 2, 3 * length // 2 + 1, n_seq)
    lengths = np.maximum(1, np.round(lengths * (n_seq * length / lengths.sum())).astype(np.int64))
    lengths[np.argmin(lengths)] += n_seq * length - lengths.sum()
    n = int(lengths.sum())
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    seq = np.repeat(np.arange(n_seq), lengths)
    pos = np.arange(n) - offsets[seq]
    q = 1 / (1 + np.exp(-rng.normal(1.0, 1.2, (n, 1)))) * 0.97 ** np.arange(k_max)[None, :]
    u = 8 + np.cumsum(np.concatenate([np.zeros((n, 1)), rng.uniform(0.5, 4, (n, k_max))], axis=1), axis=1)
    inputs = OracleInputs(seq_ids=np.array([f"s{i}" for i in range(n_seq)], dtype=object),
                          offsets=offsets.astype(np.int64), pos=pos.astype(np.int64),
                          context_len=(300 + pos).astype(float), accept_len=rng.integers(0, k_max + 1, n),
                          match_prob=q, draft_conf=q, u_bar_window=u, origin="synthetic")
    by_m = {str(m): {"beta0": 7.0 + 0.8 * m if m <= 4 else 4.7 + 0.05 * m, "alpha": 0.08 if m <= 4 else 0.265}
            for m in range(1, k_max + 2)}
    model = CostModel.from_dict({"target": {"c": 1.1e-3, "by_m": by_m}, "draft": {"a": 0.459, "b": 0.073}})
    return inputs, model


def separate_passes(inputs: OracleInputs, model: CostModel, k_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The full solve as it was before the single sweep: backward induction, then one policy
    evaluation of the Oracle's breakdown / rounds / accepted and one of every static K.
    Returns V (n,) and the (S, 6) and (S, k_max) totals from the first states."""
    table = CostTable.build(inputs, model, k_max)
    v, k_star, _ = backward_induction(inputs, table)
    surv = survival(inputs, k_max)
    layout = Layout.build(inputs)
    cost = table.total()
    first = inputs.offsets[:-1]
    parts = table.parts(k_star)
    rewards = np.column_stack([parts[p] for p in PART_NAMES]
                              + [np.ones(inputs.n_states), accepted_at(surv, inputs.remaining, k_star)])
    oracle = evaluate_arrays(surv, k_star, rewards, layout)[first]
    static = evaluate_arrays(surv, np.arange(1, k_max + 1)[None, :], cost[:, 1:], layout)[first]
    return v, oracle, static


def timed(fn, repeat: int) -> tuple[float, float, float, object]:
    """(best wall, best CPU, first wall, last result) over ``repeat`` calls."""
    wall, cpu, out = [], [], None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return min(wall), min(cpu), wall[0], out


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ")[0:3].__str__()
    except OSError:
        return "n/a"


def figure(rows: list, name: str, value: float, target: float, note: str = "", higher_is_better: bool = False) -> None:
    ratio = target / value if higher_is_better else value / target
    rows.append((name, value, target, ratio, note, higher_is_better))
    print(f"  -> {name}: {value:.3f} (target {'>=' if higher_is_better else '<='} {target:g}; "
          f"ratio to target {ratio:.2f}{', met' if ratio <= 1 else ', NOT met'}) {note}")


def bench_solve(args, rows: list) -> None:
    inputs, model = make_instance(args.sequences, args.length, args.k_max)
    k_max = args.k_max
    print(f"instance: {inputs.n_sequences:,} sequences, {inputs.n_states:,} states, K_max = {k_max}; "
          f"load average {loadavg()}")

    def values_only():
        table = CostTable.build(inputs, model, k_max)
        return first_values(inputs, survival(inputs, k_max), table.fixed, table.slope, [model.c])[0]

    t_vec, c_vec, _, v_first = timed(values_only, args.repeat)
    print(f"vectorized backward induction (V(0) of every sequence, costs included): best of {args.repeat}: "
          f"wall {t_vec:.3f} s, CPU {c_vec:.3f} s")
    t_full, c_full, t_first, res = timed(lambda: solve(inputs, model, k_max=k_max), args.repeat)
    value, k_star = res.value, res.k_star
    print(f"full solve, one sweep (plus {k_max} static-K evaluations, breakdown, autoregressive): best of "
          f"{args.repeat}: wall {t_full:.3f} s, CPU {c_full:.3f} s (first call {t_first:.3f} s)")
    t_old, c_old, _, (v_old, oracle_old, static_old) = timed(lambda: separate_passes(inputs, model, k_max), args.repeat)
    first = inputs.offsets[:-1]
    static_new = res.per_sequence[[f"static_{k}_ms" for k in range(1, k_max + 1)]].to_numpy()
    same = (np.array_equal(value, v_old) and np.array_equal(value[first], v_first)
        and np.array_equal(static_old, static_new)
        and np.array_equal(oracle_old[:, 4], res.per_sequence["rounds"].to_numpy())
        and np.array_equal(oracle_old[:, 5], res.per_sequence["accepted"].to_numpy())
        and all(res.bounds.breakdown_ms[p] == float(oracle_old[:, i].sum()) for i, p in enumerate(PART_NAMES)))
    print(f"before: backward induction, then separate evaluation passes: best of {args.repeat}: wall {t_old:.3f} s, "
          f"CPU {c_old:.3f} s; same numbers bit for bit: {same}; speed-up {t_old / t_full:.1f}x wall")
    print(f"load average {loadavg()}")
    figure(rows, "full 1M-state solve, s (before: separate passes)", t_old, TARGET_FULL_SOLVE_S)
    figure(rows, "full 1M-state solve, s (after: one sweep)", t_full, TARGET_FULL_SOLVE_S,
           f"CPU {c_full:.3f} s, first call {t_first:.3f} s")
    figure(rows, "backward induction 1M states, s", t_vec, TARGET_BACKWARD_S)
    assert same, "the one-sweep solve must give the separate passes' numbers"
    assert value[first].sum() == res.bounds.oracle_ms

    if args.python_sequences == 0:
        return
    n_py = inputs.n_sequences if args.python_sequences is None else min(args.python_sequences, inputs.n_sequences)
    sub = inputs if n_py == inputs.n_sequences else inputs.subset(np.arange(n_py))
    w0, c0 = time.perf_counter(), time.process_time()
    v_py, k_py = solve_python(sub, model, k_max)
    t_py, c_py = time.perf_counter() - w0, time.process_time() - c0
    n_rows = sub.n_states
    max_diff = float(np.max(np.abs(np.asarray(v_py) - value[:n_rows])))
    same_k = bool(np.array_equal(np.asarray(k_py), k_star[:n_rows]))
    print(f"pure-Python loop on {n_rows:,} states: wall {t_py:.2f} s, CPU {c_py:.2f} s; "
          f"max |V_python - V_numpy| = {max_diff:.2e}; identical k*: {same_k}")
    scale = inputs.n_states / n_rows
    if n_rows < inputs.n_states:
        print(f"  extrapolated linearly to {inputs.n_states:,} states: wall {t_py * scale:.1f} s, CPU {c_py * scale:.1f} s")
    print(f"ratio pure-Python / full vectorized solve: wall {t_py * scale / t_full:.0f}x, CPU "
          f"{c_py * scale / c_full:.0f}x (On a shared machine CPU time is the fairer measure.)")
    figure(rows, "pure-Python / vectorized backward induction (CPU)", c_py * scale / c_full, TARGET_PYTHON_RATIO,
           higher_is_better=True)
    assert max_diff <= 1e-9 and same_k


def bench_interval(args, rows: list) -> None:
    setup = prepare_oracle(args.trace)
    kinds = setup.kind_counts()
    head = setup.for_kind("greedy" if "greedy" in kinds else next(iter(kinds)))
    result = head.solve()
    print(f"\ninterval on {args.trace} ({head.inputs.n_sequences} references, {head.inputs.n_states:,} states, "
          f"{setup.trace.rounds['generation_id'].nunique()} generations); load average {loadavg()}")
    t_fast, c_fast, _, fast = timed(lambda: bootstrap_bound(head, n_boot=HEADLINE_N_BOOT, seed=0, result=result),
                                    args.repeat)
    print(f"bootstrap_bound, {HEADLINE_N_BOOT} replicates: best of {args.repeat}: wall {t_fast:.3f} s, CPU {c_fast:.3f} s")
    n_direct = min(args.direct_boot, HEADLINE_N_BOOT)
    counts = draw_counts(setup.trace.rounds["generation_id"].nunique(), HEADLINE_N_BOOT, 0)[:n_direct]
    w0 = time.perf_counter()
    direct = direct_replicates(head, counts)
    t_direct = (time.perf_counter() - w0) * HEADLINE_N_BOOT / n_direct
    rel = max(float(np.max(np.abs(fast.replicates[q].to_numpy()[:n_direct] / direct[q].to_numpy() - 1)))
              for q in ("speedup", "gain_over_best_static", "ms_per_token"))
    same_k = bool((fast.replicates["best_static_k"].to_numpy()[:n_direct] == direct["best_static_k"].to_numpy()).all())
    print(f"before: direct replicates (resample, refit, solve) on the first {n_direct} of the same replicates: "
          f"{t_direct:.1f} s for {HEADLINE_N_BOOT}{' (extrapolated)' if n_direct < HEADLINE_N_BOOT else ''}; "
          f"largest relative difference of a replicate's quantities {rel:.1e}; same best static K: {same_k}")
    print("interval: " + "; ".join(f"{q} {fast.cell(q, 4)}" for q in ("speedup", "gain_over_best_static")))
    figure(rows, f"bootstrap interval, {HEADLINE_N_BOOT} replicates, s (before: direct)", t_direct, TARGET_CLI_S)
    figure(rows, f"bootstrap interval, {HEADLINE_N_BOOT} replicates, s (after)", t_fast, TARGET_CLI_S)
    assert rel < 1e-12 and same_k
    if args.skip_cli:
        return
    exe = [sys.executable, "-m", "speclimits.cli"]
    if (Path(sys.executable).parent / "speclimits").exists():
        exe = [str(Path(sys.executable).parent / "speclimits")]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    for extra, label in (([], f"default interval ({HEADLINE_N_BOOT} replicates)"), (["--n-boot", "0"], "--n-boot 0")):
        walls = []
        for _ in range(args.repeat):
            w0 = time.perf_counter()
            subprocess.run([*exe, "oracle", str(args.trace), "--json", *extra], check=True, cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL)
            walls.append(time.perf_counter() - w0)
        print(f"speclimits oracle {args.trace} {' '.join(extra)}: best of {args.repeat}: wall {min(walls):.2f} s "
              f"(all: {', '.join(f'{w:.2f}' for w in walls)}); load average {loadavg()}")
        figure(rows, f"speclimits oracle, {label}, s", min(walls), TARGET_CLI_S)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=2000)
    ap.add_argument("--length", type=int, default=500)
    ap.add_argument("--k-max", type=int, default=12)
    ap.add_argument("--python-sequences", type=int, default=None,
                    help="run the Python loop on this many sequences only and extrapolate (default: all; 0: skip)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--trace", type=Path, default=ROOT / "data" / "traces" / "measured-eagle3")
    ap.add_argument("--direct-boot", type=int, default=20,
                    help=f"direct replicates to time (extrapolated to {HEADLINE_N_BOOT}; default 20)")
    ap.add_argument("--skip-cli", action="store_true", help="do not time the command line")
    ap.add_argument("--skip-interval", action="store_true", help="only the 1M-state solve")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the table's figures as JSON")
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs; numpy {np.__version__}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    rows: list = []
    bench_solve(args, rows)
    if not args.skip_interval:
        bench_interval(args, rows)
    print(f"\n{'figure':<62} {'value':>9} {'target':>8} {'ratio':>6}")
    for name, value, target, ratio, *_ in rows:
        print(f"{name:<62} {value:>9.3f} {target:>8g} {ratio:>6.2f}")
    print(f"(ratio = value / target for times, target / value for the speed ratio: <= 1 is met); "
          f"load average {loadavg()}")
    if args.json:
        write_figures(args.json, json_figures(rows, args), extra={
            "sequences": args.sequences, "length": args.length, "k_max": args.k_max, "repeat": args.repeat,
            "python_sequences": args.python_sequences, "direct_boot": args.direct_boot, "trace": str(args.trace),
            "load_average_end": loadavg()})


def json_figures(rows: list, args) -> list[Figure]:
    """The table's rows as figures; a "before" row (the procedure replaced) keeps no target."""
    states = f"{args.sequences * args.length:,} states ({args.sequences} x {args.length}), K_max {args.k_max}"
    out = []
    for name, value, target, _, note, higher in rows:
        before = "(before" in name
        unit = "x" if higher else "s"
        extra = [note] if note else []
        if "solve" in name or "backward" in name:
            extra.append(states)
        if "pure-Python" in name and args.python_sequences:
            extra.append(f"Python loop on {args.python_sequences} sequences, extrapolated linearly")
        if "(before: direct)" in name and args.direct_boot < HEADLINE_N_BOOT:
            extra.append(f"{args.direct_boot} direct replicates, extrapolated to {HEADLINE_N_BOOT}")
        if name.startswith("speclimits oracle"):
            extra.append("end to end (a fresh process, imports included)")
        if before:
            extra.append(f"replaced procedure, for comparison (printed against the target {target:g})")
        extra.append(f"best of {args.repeat}" if unit == "s" and "(before: direct)" not in name else "")
        label = name.replace(", s (", " (").removesuffix(", s")
        out.append(Figure(label, value, unit, None if before else target, "higher" if higher else "lower",
                          "; ".join(e for e in extra if e)))
    return out


if __name__ == "__main__":
    main()
