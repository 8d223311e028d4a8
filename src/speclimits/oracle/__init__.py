"""The Oracle: a Bellman / stochastic-shortest-path bound on adaptive speculation length (DESIGN §2).

>>> from speclimits.oracle import load_inputs, solve      # doctest: +SKIP
>>> res = solve(load_inputs("data/traces/sim-default"), cost_model, k_max=10)  # doctest: +SKIP
>>> print(res.summary())                                  # doctest: +SKIP

Modules: :mod:`~speclimits.oracle.inputs` (arrays and costs), :mod:`~speclimits.oracle.solver`
(backward induction, policy evaluation, the frozen result), :mod:`~speclimits.oracle.delta`
(Delta Space), :mod:`~speclimits.oracle.ablation` (α = 0), :mod:`~speclimits.oracle.policies`
(online rules measured against the bound), :mod:`~speclimits.oracle.cli` (``speclimits oracle``).
"""

from speclimits.oracle.inputs import CostTable, OracleInputs, default_cost_model, load_inputs
from speclimits.oracle.solver import OracleBounds, OracleResult, evaluate_policy, solve, solve_python, sweep_k_max

__all__ = [
    "CostTable", "OracleInputs", "OracleBounds", "OracleResult", "default_cost_model", "evaluate_policy",
    "load_inputs", "solve", "solve_python", "sweep_k_max",
]
