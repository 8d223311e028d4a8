"""The Oracle: a Bellman / stochastic-shortest-path bound on adaptive speculation length (the book's methods page, "The Oracle").

>>> from speclimits.oracle import prepare_oracle           # doctest: +SKIP
>>> setup = prepare_oracle("data/traces/measured-eagle3")   # doctest: +SKIP
>>> print(setup.solve(k_max=10).summary())                 # doctest: +SKIP

Modules: :mod:`~speclimits.oracle.prepare` (the one route from a trace to the Oracle's inputs,
cost model and surrogate), :mod:`~speclimits.oracle.inputs` (arrays and costs),
:mod:`~speclimits.oracle.calibration` (is the draft's probability calibrated?), :mod:`~speclimits.oracle.solver`
(backward induction, policy evaluation, the frozen result), :mod:`~speclimits.oracle.delta`
(Delta Space), :mod:`~speclimits.oracle.ablation` (α = 0), :mod:`~speclimits.oracle.cli`
(``speclimits oracle``). The online rules measured against the bound live in :mod:`speclimits.control`
(which imports this package, never the reverse).
"""

from speclimits.oracle.inputs import CostTable, OracleInputs
from speclimits.oracle.prepare import SURROGATES, OracleSetup, compare_surrogates, load_inputs, prepare_oracle
from speclimits.oracle.solver import OracleBounds, OracleResult, evaluate_policy, solve, sweep_k_max

__all__ = [
    "SURROGATES", "CostTable", "OracleInputs", "OracleBounds", "OracleResult", "OracleSetup", "compare_surrogates",
    "evaluate_policy", "load_inputs", "prepare_oracle", "solve", "sweep_k_max",
]
