"""The benchmark command: its summary on hand-made blocks, and a tiny end-to-end run in vLLM."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from speclimits.control.bench import parse_static, summarize
from speclimits.errors import SpeclimitsError
from speclimits.paths import DATA_DIR


def hand_blocks() -> pd.DataFrame:
    rows = []
    for block, noise in enumerate((1.0, 1.1)):
        for arm, ms in (("plain", 10.0), ("static:1", 7.0), ("static:2", 6.0), ("delta", 5.5)):
            rows.append(dict(block=block, arm=arm, ms_per_token=ms * noise, output_throughput=1e3 / (ms * noise),
                             cpu_ms_per_token=ms, duration_s=1.0, spec_decode_num_drafts=0 if arm == "plain" else 10,
                             spec_decode_draft_tokens=0 if arm == "plain" else 20,
                             spec_decode_accepted_tokens=0 if arm == "plain" else 12,
                             decide_us=np.nan if arm == "plain" else 100.0,
                             drafting_calls=np.nan if arm == "plain" else 10, wasted_draft_steps=0.0, mean_k=2.0))
    return pd.DataFrame(rows)


def test_summary_ratios_and_shares():
    bounds = {"oracle_exact_gain_over_best_static": 1.2, "oracle_surrogate_gain_over_best_static": 1.1}
    s = summarize(hand_blocks(), None, bounds).set_index("arm")
    assert s.loc["static:2", "best_static"] and s.loc["static:2", "vs_best_static"] == 1.0
    assert s.loc["delta", "speedup_vs_plain"] == pytest.approx(10.5 / 5.775)
    # T_static = 6.3 (median), T_oracle = 6.3 / 1.2; delta 5.775: share (1 - 5.775/6.3) / (1 - 1/1.2)
    assert s.loc["delta", "engine_share_exact"] == pytest.approx((1 - 5.775 / 6.3) / (1 - 1 / 1.2))
    assert s.loc["static:2", "engine_share_exact"] == 0.0
    assert s.loc["delta", "spec_decode_acceptance_length"] == pytest.approx(1 + 24 / 20)
    assert s.loc["delta", "decision_us_per_round"] == pytest.approx(10.0)
    assert s.loc["delta", "ms_per_token_min"] == 5.5 and s.loc["delta", "ms_per_token_max"] == pytest.approx(6.05)


def test_parse_static():
    assert parse_static("1-3,6") == [1, 2, 3, 6]
    with pytest.raises(SpeclimitsError, match="--static"):
        parse_static("a")
    with pytest.raises(SpeclimitsError, match=">= 1"):
        parse_static("0-2")


@pytest.mark.vllm
def test_tiny_benchmark_end_to_end(smoke_trace, tmp_path):
    """The tiny setting: config-only target as its own draft, two prompts, two blocks."""
    from speclimits.tracing.engine import apply_env_defaults

    apply_env_defaults()
    pytest.importorskip("vllm")
    from speclimits.cli import main
    from speclimits.tracing.tinymodel import write_tiny_moe

    target = write_tiny_moe(tmp_path / "tiny")
    policy = tmp_path / "policy.json"
    assert main(["control", "fit", str(smoke_trace), "--out", str(policy), "--k-max", "3"]) == 0
    out = tmp_path / "bench.json"
    code = main(["control", "bench", "--policy", str(policy), "--trace", str(smoke_trace), "--target", str(target),
                 "--draft", str(target), "--method", "draft_model", "--load-format", "dummy",
                 "--prompts", str(DATA_DIR / "prompts" / "smoke.jsonl"), "--ids", "all", "--limit", "2",
                 "--max-tokens", "12", "--blocks", "2", "--static", "1-3", "--policies", "threshold,ema",
                 "--batch", "2", "--out", str(out)])
    assert code == 0
    res = json.loads(out.read_text())
    assert res["lossless"] is True and res["label"].startswith("measured")
    s = pd.DataFrame(res["summary"]).set_index("arm")
    assert set(s.index) == {"plain", "static:1", "static:2", "static:3", "threshold", "ema"}
    assert (s["blocks"] == 2).all()
    # self-draft with dummy weights accepts every draft: acceptance length is 1 + K for static K
    for k in (1, 2, 3):
        assert s.loc[f"static:{k}", "spec_decode_acceptance_length"] == pytest.approx(1 + k, abs=0.35)
    assert "no offline prediction" in res["note"]  # the smoke trace's Oracle data does not cover these prompts
