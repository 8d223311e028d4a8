"""Benchmark: vectorized backward induction vs a straightforward pure-Python loop.

Builds a synthetic instance (default 2,000 sequences x 500 states = 1,000,000 states, K_max = 12),
solves it with :func:`speclimits.oracle.solver.backward_induction` (the numpy lockstep backward
induction: V, k* and the full Q table, round costs included) and with :func:`speclimits.oracle.solver.solve_python` (a loop over
sequences, states and k), checks the values are identical, and prints both timings and the ratio.
Also times the full :func:`speclimits.oracle.solve` (backward induction plus the policy evaluations
behind the bounds: every static K, the Oracle's breakdown, rounds and accepted length).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_oracle.py [--sequences 2000] [--length 500]
        [--k-max 12] [--python-sequences N]   # N < sequences: the Python loop runs on the first N and is
                                              # extrapolated linearly (said so in the output)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from speclimits.costmodel import CostModel
from speclimits.oracle import OracleInputs, solve, solve_python
from speclimits.oracle.inputs import CostTable
from speclimits.oracle.solver import backward_induction


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, default=2000)
    ap.add_argument("--length", type=int, default=500)
    ap.add_argument("--k-max", type=int, default=12)
    ap.add_argument("--python-sequences", type=int, default=None,
                    help="run the Python loop on this many sequences only and extrapolate (default: all)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    inputs, model = make_instance(args.sequences, args.length, args.k_max)
    k_max = args.k_max
    print(f"instance: {inputs.n_sequences:,} sequences, {inputs.n_states:,} states, K_max = {k_max}")

    wall, cpu = [], []
    for _ in range(args.repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        value, k_star, q = backward_induction(inputs, CostTable.build(inputs, model, k_max))
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    t_vec, c_vec = min(wall), min(cpu)
    print(f"vectorized backward induction (V, k*, full Q table, costs included): best of {args.repeat}: "
          f"wall {t_vec:.3f} s, CPU {c_vec:.3f} s")
    w0, c0 = time.perf_counter(), time.process_time()
    res = solve(inputs, model, k_max=k_max)
    print(f"full solve (plus {k_max} static-K evaluations, breakdown, autoregressive): "
          f"wall {time.perf_counter() - w0:.3f} s, CPU {time.process_time() - c0:.3f} s")
    assert np.array_equal(res.value, value)

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
    print(f"ratio pure-Python / vectorized: wall {t_py * scale / t_vec:.0f}x, CPU {c_py * scale / c_vec:.0f}x "
          "(targets: >= 100x; vectorized <= 5 s). On a shared machine CPU time is the fairer measure.")
    assert max_diff <= 1e-9 and same_k


if __name__ == "__main__":
    main()
