#!/usr/bin/env bash
# Set everything up (including vLLM's CPU build) and run the whole test suite.
# Pass pytest options through, e.g. `bash scripts/test.sh -m "not vllm and not book"` for a quick run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# the distributed (Ray) tests fail instead of skipping when they cannot run here; each starts Ray
# only inside a loopback-only network namespace it creates (unshare -n; see tests/test_ray_sweep.py)
export SPECLIMITS_REQUIRE_RAY_TESTS=${SPECLIMITS_REQUIRE_RAY_TESTS:-1}
# likewise the browser tests (headless Chromium, installed by setup.sh test)
export SPECLIMITS_REQUIRE_BROWSER_TESTS=${SPECLIMITS_REQUIRE_BROWSER_TESTS:-1}
# one pytest worker per core (at most 4: an engine test's worker peaks near 6.5 GB). Each test file
# runs whole on one worker (the files that read the smoke book together), heaviest first: see
# tests/conftest.py (pytest_xdist_make_scheduler, pytest_collection_modifyitems). `-n 0`: one process.
# (counted without OMP_NUM_THREADS, which GNU nproc would report instead of the cores)
workers=${SPECLIMITS_TEST_WORKERS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)}
[ "$workers" -gt 4 ] && workers=4
.venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
