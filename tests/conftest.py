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
def grid_traces(tmp_path_factory):
    """Smoke-preset traces (seed 0) on thin K grids, keyed by grid: ``0,2,4``, ``0-4``, ``0,2,4,6``, ``1-6``
    and ``0,2`` (a single K > 0: the shape of an n-gram arm's budget); ``no-oracle``: the 0-4 grid without
    its Oracle data."""
    import shutil

    from speclimits.simulate import preset, simulate
    from speclimits.tracing.inputs import parse_k

    root = tmp_path_factory.mktemp("grids")
    out = {}
    for grid in ("0,2,4", "0-4", "0,2,4,6", "1-6", "0,2"):
        out[grid] = root / grid.replace(",", "_")
        simulate(preset("smoke", k_values=parse_k(grid)), seed=0, out=out[grid], progress=False)
    out["no-oracle"] = root / "no-oracle"
    shutil.copytree(out["0-4"], out["no-oracle"])
    (out["no-oracle"] / "oracle.parquet").unlink()
    return out


@pytest.fixture(scope="session")
def smoke_policy(smoke_trace):
    """The online policies fitted on the smoke trace (K_max = 4, seed 0) and its greedy Oracle setup."""
    from speclimits.control.fit import fit_policy, greedy_setup

    fit = fit_policy(smoke_trace, k_max=4, seed=0)
    return fit, greedy_setup(smoke_trace, fit.cost_model)


@pytest.fixture(scope="session")
def default_book(tmp_path_factory):
    """The one full build of a test run: the book as ``speclimits book`` builds it (the bundled
    measured trace), with smoke parameters. Returns the build folder: executed notebooks under
    ``source/book/<name>.ipynb``, the site under ``_build/html``."""
    from speclimits.book import build_book

    out = tmp_path_factory.mktemp("book") / "site"
    build_book(None, smoke=True, out=out, progress=False)
    return out


#: The sections whose simulated-trace paths the tests read (executed, no site built).
SIMULATED_PAGES = ["02_factors", "03_final_model", "04_draft_model", "05_robustness", "06_oracle", "07_linguistic"]


@pytest.fixture(scope="session")
def simulated_pages(smoke_trace, tmp_path_factory):
    """:data:`SIMULATED_PAGES` executed on the SIMULATED smoke trace with smoke parameters (no site)."""
    from speclimits.book import build_book

    out = tmp_path_factory.mktemp("simulated-pages") / "site"
    build_book(smoke_trace, smoke=True, out=out, progress=False, pages=SIMULATED_PAGES, site=False)
    return out


def benchmark_module(name: str):
    """``benchmarks/<name>.py``, imported from its file (the benchmarks are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def executed_notebook_text(build, name: str) -> str:
    """The executed notebook ``book/<name>`` of a build folder, as JSON text."""
    return (build / "source" / "book" / f"{name}.ipynb").read_text()


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


# ---------------------------------------------------------------------------
# Parallel runs (scripts/test.sh: pytest-xdist, -n N --dist loadfile --no-loadscope-reorder)
# ---------------------------------------------------------------------------

#: Test files that read the session's book builds: one work unit, so each is built on one worker only.
BOOK_FILES = ("test_book.py", "test_book_browser.py", "test_linguistic_cli_book.py",
                    "test_oracle_analysis.py", "test_stats_cli_book.py")
BOOK_FIXTURES = {"default_book", "simulated_pages"}
#: How much a marked test weighs when ordering the work units (Ray sessions and engines are the slow ones).
MARK_WEIGHT = {"ray": 3, "vllm": 2, "book": 2, "browser": 2}


def work_unit(nodeid: str) -> str:
    """The work unit of a test: its file, or one unit for the files that read the book builds."""
    path = nodeid.split("::", 1)[0]
    return "book" if path.rsplit("/", 1)[-1] in BOOK_FILES else path


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, with the smoke-book files as one unit (a test file runs whole on one
    worker, so a module's engine is built once; the smoke book too). pytest-xdist's own
    ``xdist_group`` marks do not group under pytest 9.2 (they set a node id attribute pytest no
    longer reads), so the grouping is the scheduler's."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class BookFileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return BookFileScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """On an xdist worker: put the heavy work units first (stable), so that the two workers are not
    left with one long unit at the end (longest first; with ``--no-loadscope-reorder`` the units
    are handed out in collection order). Every worker collects and sorts the same items alike.

    Everywhere: a test file that uses a book fixture must be listed in :data:`BOOK_FILES`
    (the scheduler sees node ids only, not fixtures), else a book would be built on two workers."""
    unlisted = sorted({item.path.name for item in items if BOOK_FIXTURES & set(getattr(item, "fixturenames", ()))}
                      - set(BOOK_FILES))
    if unlisted:
        raise pytest.UsageError(f"tests/conftest.py: add {', '.join(unlisted)} to BOOK_FILES "
                                "(files that use a book fixture share one xdist work unit)")
    if not hasattr(config, "workerinput"):
        return
    weight: dict[str, int] = {}
    for item in items:
        unit = work_unit(item.nodeid)
        w = max((MARK_WEIGHT.get(m.name, 0) for m in item.iter_markers()), default=0)
        weight[unit] = weight.get(unit, 0) + w
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-weight[work_unit(item.nodeid)], order[id(item)]))
