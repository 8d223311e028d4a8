"""The controller as a user runs it: inside ``vllm serve`` (OpenAI-compatible server, loopback only).

The scenario (tests/serve_scenario.py) runs in a network namespace whose only interface is ``lo``, so
the server cannot be reached from, or reach, anything else. Marked ``vllm``: it starts a real server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from speclimits.paths import DATA_DIR

pytestmark = pytest.mark.vllm
SCENARIO = Path(__file__).with_name("serve_scenario.py")


def test_policy_inside_vllm_serve_is_lossless(tmp_path):
    """Armed by the environment alone; requests cancelled mid-generation leave no state behind and change
    no other request's output; vLLM's own per-request speculative metrics report, step by step, the drafts the
    controller kept (its k of each round that kept one) and how many were accepted."""
    from loopback import QUIET_VLLM_ENV, require

    from speclimits.control.fit import fit_policy
    from speclimits.tracing.ray_sweep import loopback_command

    require("vllm", what="the server test")
    policy = fit_policy(DATA_DIR / "traces" / "measured-eagle3", k_max=6).write(tmp_path / "policy.json")
    env = dict(os.environ, HOME=str(tmp_path), VLLM_ENABLE_V1_MULTIPROCESSING="0", **QUIET_VLLM_ENV)
    proc = subprocess.run(loopback_command([sys.executable, str(SCENARIO), str(tmp_path), str(policy)]),
                          capture_output=True, text=True, env=env, timeout=900)
    log = tmp_path / "server.log"
    tail = log.read_text()[-3000:] if log.exists() else ""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:] + tail
    res = json.loads([x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT "):])
    assert len(res["armed"]) == 1 and "armed policy delta" in res["armed"][0] and "12 profiling rounds" in res["armed"][0]
    assert res["policy"] == "delta"
    assert res["served"] == res["plain"]  # the policy changes the speed, never the greedy output
    assert res["cancelled_chunks"] == [3, 3, 3] and res["live_requests"] == 0  # aborted requests released
    assert len(res["requests"]) >= 6  # per request, the k of each round: the cancelled ones and the others
    assert all(isinstance(k, int) for ks in res["requests"].values() for k in ks)
    assert res["n_rounds"] > 12 and res["profile"] is not None  # profiled on the first rounds, then the policy
    assert set(res["ks"]) >= {1, 2, 3}
    assert len(res["spec_metrics"]) == 3
    for rid, m in res["spec_metrics"].items():
        ours = [ks for key, ks in res["requests"].items() if key.startswith(rid)]
        assert len(ours) == 1, (rid, list(res["requests"]))
        kept = [k for k in ours[0] if k > 0]  # a round that kept no draft verifies nothing in vLLM's count
        drafted, accepted = m["per_step_drafted"], m["per_step_accepted"]
        # every verified round as the controller kept it (the last round drafted may end with the request)
        assert drafted == kept[: len(drafted)] and len(kept) - len(drafted) <= 1, (drafted, kept)
        assert len(accepted) == len(drafted) and all(0 <= a <= d for a, d in zip(accepted, drafted))
        assert m["num_draft_tokens"] == sum(drafted) and m["num_accepted_draft_tokens"] == sum(accepted)
