"""The bundled measured batch sweeps (data/traces/measured-batch, and twin-batch of the memory-bound twin):
valid, checked against vLLM, and on the same greedy references as the batch-1 trace of their target, so the
bound at batch b applies to them."""

from __future__ import annotations

import json

import pytest

from speclimits import paths
from speclimits.trace import read_trace, validate_trace

BATCH = paths.BATCH_TRACE

pytestmark = pytest.mark.skipif(not (BATCH / "meta.json").exists(), reason="no bundled batch trace")


def _generations(root):
    return [json.loads(line) for line in (root / "generations.jsonl").read_text().splitlines() if line.strip()]


#: (batch sweep, the batch-1 trace of the same target)
PAIRS = [(paths.BATCH_TRACE, paths.BUNDLED_TRACE), (paths.TRACES_DIR / "twin-batch", paths.TWIN_TRACE)]


@pytest.mark.parametrize("batch, _", PAIRS, ids=["trained", "twin"])
def test_bundled_batch_trace_is_valid_complete_and_matches_vllm_counters(batch, _):
    validate_trace(batch)
    tr = read_trace(batch)
    assert not tr.simulated and tr.meta["complete"]
    assert tr.batch_sizes == [1, 2, 4, 8, 16] and tr.meta["k_values"] == list(range(7))
    checks = tr.meta["checks"]
    assert checks["counters_match"] and checks["emitted_match"] and not checks["token_mismatch_generations"]
    # every step of every batch holds at most b requests, and the rounds add up to the step's rows
    steps = tr.steps
    assert (steps["n_reqs"] <= steps["b"]).all()
    rows = tr.rounds.groupby(["batch_id", "step"])["m"].sum()
    assert (rows.to_numpy() == steps.set_index(["batch_id", "step"]).loc[rows.index, "n_tokens"].to_numpy()).all()


@pytest.mark.parametrize("batch, single", PAIRS, ids=["trained", "twin"])
def test_batched_greedy_outputs_equal_the_default_traces_references(batch, single):
    default = {g["prompt_id"]: g["output_token_ids"] for g in _generations(single) if g["K"] == 0}
    gens = _generations(batch)
    assert len(gens) == 32 * 7 * 5
    differ = [(g["prompt_id"], g["b"], g["K"]) for g in gens if g["output_token_ids"] != default[g["prompt_id"]]]
    assert not differ, f"{len(differ)} batched generations differ from the default trace's greedy output: {differ[:5]}"


def test_repeat_pass_covers_every_cell():
    rep = json.loads((BATCH / "repeat-pass.json").read_text())
    cells = {(c["b"], c["K"]) for c in rep["cells"]}
    assert cells == {(b, k) for b in (1, 2, 4, 8, 16) for k in range(7)}
