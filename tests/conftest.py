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


@pytest.fixture(scope="session")
def smoke_book(smoke_trace, tmp_path_factory):
    """The whole book built once on the smoke trace with smoke parameters (every section executed).

    Returns the build folder: executed notebooks under ``source/book/<name>.ipynb``, the site under
    ``_build/html``. Section tests read their executed notebook from here instead of running it again.
    """
    from speclimits.book import build_book

    out = tmp_path_factory.mktemp("book") / "site"
    build_book(smoke_trace, smoke=True, out=out, progress=False)
    return out


def executed_notebook_text(smoke_book, name: str) -> str:
    """The executed notebook ``book/<name>`` of the smoke build, as JSON text."""
    return (smoke_book / "source" / "book" / f"{name}.ipynb").read_text()


@pytest.fixture(scope="module")
def vllm_mod():
    """vLLM, imported after the harness's CPU defaults (skips the module where vLLM is missing)."""
    from speclimits.tracing.engine import apply_env_defaults

    apply_env_defaults()
    return pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def tiny_moe(vllm_mod, tmp_path_factory):
    """A tiny random-weight Qwen3-MoE folder (one per test module) for the engine tests."""
    from speclimits.tracing.tinymodel import write_tiny_moe

    return write_tiny_moe(tmp_path_factory.mktemp("tiny"))
