"""Random Oracle instances shared by the solver tests (a cost model and inputs drawn from one generator)."""

from __future__ import annotations

import numpy as np

from speclimits.costmodel import CostModel
from speclimits.oracle import OracleInputs


def random_model(rng: np.random.Generator, m_max: int, with_m1: bool = True) -> CostModel:
    ms = range(1 if with_m1 else 2, m_max + 1)
    by_m = {str(m): {"beta0": float(rng.uniform(3, 10)), "alpha": float(rng.uniform(0.0, 0.4))} for m in ms}
    return CostModel.from_dict({"target": {"c": float(rng.uniform(0, 2e-3)), "by_m": by_m},
                                "draft": {"a": float(rng.uniform(0.1, 1.5)), "b": float(rng.uniform(0, 0.5))}})


def random_inputs(rng: np.random.Generator, n_tokens: list[int], k_list: int) -> OracleInputs:
    n = sum(n_tokens)
    match = rng.uniform(0, 1, (n, k_list)) ** rng.uniform(0.2, 2.0)
    match[rng.random((n, k_list)) < 0.1] = 1.0
    u = 8 + np.cumsum(np.concatenate([np.zeros((n, 1)), rng.uniform(0, 6, (n, k_list))], axis=1), axis=1)
    return OracleInputs.from_arrays(n_tokens, match, u, context_len=rng.integers(0, 3000, n),
                                    accept_len=rng.integers(0, k_list + 1, n),
                                    draft_conf=rng.uniform(0, 1, (n, k_list)))
