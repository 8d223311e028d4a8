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
.venv/bin/python -m pytest "$@"
