"""Shared fixtures: small simulated traces made once per session."""

from __future__ import annotations

import os

import pytest

# keep numerical libraries to one thread: the machine has two cores and tests run beside other work
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


@pytest.fixture(scope="session")
def smoke_trace(tmp_path_factory):
    """A smoke-preset simulated trace directory (seed 1)."""
    from speclimits.simulate import preset, simulate

    out = tmp_path_factory.mktemp("trace") / "smoke"
    simulate(preset("smoke"), seed=1, out=out, progress=False)
    return out
