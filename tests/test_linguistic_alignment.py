"""The state/token convention on the bundled measured trace and on the simulator (the methods page,
"Reference kinds and positions"): state ``pos`` drafts token row ``pos + 1`` first."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from speclimits import linguistic as ling
from speclimits.oracle import prepare_oracle
from speclimits.paths import MODELS_DIR, default_trace
from speclimits.simulate import preset, simulate
from speclimits.trace import read_trace
from speclimits.trace.prompts import PROMPTS_FILE, read_prompts

MEASURED = default_trace()


@pytest.fixture(scope="module")
def measured():
    tr = read_trace(MEASURED)
    assert not tr.simulated and tr.oracle is not None and tr.tokens is not None
    setup = prepare_oracle(tr, surrogate="raw")
    return {"tr": tr, "setup": setup, "kinds": dict(zip(setup.inputs.seq_ids.astype(str), setup.kinds))}


def test_first_draft_token_is_row_pos_plus_1_in_every_state(measured):
    tr = measured["tr"]
    chk = ling.alignment_check(tr.oracle, tr.tokens, measured["kinds"]).set_index("reference_kind")
    assert set(chk.index) == {"greedy", "teacher-forced"}
    # the convention: 100% (where accept_len >= 1, the first draft IS the reference token it predicts)
    assert (chk["share_row_pos_plus_1"] == 1.0).all()
    assert chk.loc["greedy", "n_states"] > 3000 and chk.loc["teacher-forced", "n_states"] > 200
    # the other rule (row pos) joins the wrong token almost always: the check can tell them apart
    assert (chk["share_row_pos"] < 0.2).all()


def test_decision_table_on_the_measured_trace_uses_the_same_rows(measured):
    tr, setup = measured["tr"], measured["setup"]
    res = setup.solve(k_max=4)
    dec = ling.decision_table(res, ling.label_trace_tokens(tr.tokens), setup.kinds)
    assert len(dec) == len(tr.oracle) and dec.attrs["n_unmatched"] == 0
    first = tr.oracle.set_index([tr.oracle["seq_id"].astype(str), "pos"])
    keys = list(zip(dec["seq_id"], dec["pos"]))
    d0 = np.array([int(v[0]) for v in first.loc[keys, "draft_tokens"]])
    acc = first.loc[keys, "accept_len"].to_numpy()
    assert (dec["token_id"].to_numpy()[acc >= 1] == d0[acc >= 1]).all()
    prompts = read_prompts(tr.path / PROMPTS_FILE)  # greedy: every prompt without a held-out reference
    forced = sum(p.teacher_forced for p in prompts)
    assert dec.groupby("reference_kind")["seq_id"].nunique().to_dict() == {"greedy": len(prompts) - forced,
                                                                           "teacher-forced": forced}
    assert forced == 12


def test_routing_is_that_of_the_pass_reading_the_token(measured):
    # where the draft matched, the window's first two rows read token rows pos and pos + 1, so
    # u_bar_window[1] - u_bar_window[0] at state pos is row pos + 1's new_experts: exactly, on greedy references
    tr = measured["tr"]
    chk = ling.window_routing_check(tr.oracle, tr.tokens)
    assert len(chk) > 2900
    assert chk["abs_diff"].max() < 1e-9
    # the harness's producing-row tables (one row later) or any other offset fail the same comparison
    for offset in (0, 2):
        assert (ling.window_routing_check(tr.oracle, tr.tokens, row_offset=offset)["abs_diff"] > 1e-9).mean() > 0.5


def test_teacher_forced_text_is_the_tokenizer_decoding(measured):
    tokenizers = pytest.importorskip("tokenizers")
    path = MODELS_DIR / "target" / "tokenizer.json"
    if not path.exists():
        pytest.skip(f"{path} not present")
    tk = tokenizers.Tokenizer.from_file(str(path))
    tok = measured["tr"].tokens
    forced = tok[tok["reference_kind"] == "teacher-forced"].iloc[::7]
    assert [tk.decode([int(t)]) for t in forced["token_id"]] == forced["text"].tolist()


def test_simulator_writes_one_token_row_more_than_states():
    cfg = preset("smoke", n_prompts=14, oracle_prompts=14, k_values=[1])
    tables = simulate(cfg, seed=3, progress=False)
    o, t = tables["oracle"], tables["tokens"]
    assert (t.groupby("seq_id").size() == o.groupby("seq_id").size() + 1).all()
    # state pos's first draft predicts row pos + 1: at a planted script change (q = 0.15, against
    # 0.55-0.96 elsewhere) the state's first-step match probability is low; one row off it is not
    q = o["match_prob"].map(lambda v: float(v[0])).to_numpy()
    for step, low in ((1, True), (0, False)):
        ctx = ling.state_tokens(o, t, step=step, columns=["context"])["context"].to_numpy()
        at_change = q[ctx == "script_change"]
        assert at_change.size >= 10
        assert (at_change.mean() < 0.35) == low, step


def test_study_keeps_the_reference_kinds_apart(measured):
    tr, setup = measured["tr"], measured["setup"]
    res = setup.solve(k_max=4)
    lab = ling.label_trace_tokens(tr.tokens)
    studies = ling.study_by_kind(res, lab, setup.kinds, n_boot=49, seed=0)
    assert list(studies) == ["greedy", "teacher-forced"] and ling.headline(studies).kind == "greedy"
    dec = ling.decision_table(res, lab, setup.kinds)
    for kind, st in studies.items():
        alone = ling.k_by_context(dec[dec["reference_kind"] == kind], n_boot=49, seed=0)
        pd.testing.assert_frame_equal(st.k_by_context.reset_index(drop=True), alone.reset_index(drop=True),
                                      check_dtype=False)
        assert set(st.decisions["seq_id"]) == {s for s, k in measured["kinds"].items() if k == kind}
    # routing on the teacher-forced references: no reference-token events (not recorded), said so;
    # the window contrast (the Oracle's own windows) splits the pooled events exactly
    forced = studies["teacher-forced"]
    assert forced.routing.set_index("contrast").loc[["script_change", "first_mismatch_reference"], "n_events"].eq(0).all()
    assert "not recorded" in forced.note and studies["greedy"].note == ""
    pooled = ling.first_mismatch_contrast(res, source="window").n_events
    assert sum(st.contrasts[2].n_events for st in studies.values()) == pooled


def test_paper_comparison_verdicts_by_hand():
    k = pd.DataFrame({"context": ["code_format", "script_change"], "n_decisions": [100, 20], "n_responses": [10, 5],
                      "share_long": [0.70, 0.50], "long_lo": [0.60, 0.30], "long_hi": [0.80, 0.70],
                      "share_k1": [0.1, 0.95], "k1_lo": [0.05, 0.90], "k1_hi": [0.15, 0.99]})
    r = pd.DataFrame({"contrast": ["script_change", "first_mismatch_reference"], "n_events": [20, 0],
                      "n_responses": [5, 0], "diff": [-0.5, np.nan], "diff_lo": [-0.8, np.nan],
                      "diff_hi": [-0.2, np.nan]})
    st = ling.KindStudy("greedy", pd.DataFrame({"seq_id": []}), k, k, (), r, "")
    got = ling.paper_comparison(st).set_index("quantity")["verdict"]
    assert got["k* >= 4 at code formatting"] == "consistent"        # [0.60, 0.80] meets the paper's [0.614, 0.818]
    assert got["k* >= 4 at a script change"] == "differs"           # [0.30, 0.70] vs [0.010, 0.100]
    assert got["k* = 1 at a script change"] == "consistent"         # [0.90, 0.99] vs [0.867, 0.990]
    assert got["k* >= 4 at prose vocabulary"] == "no data"
    assert got["new experts: script change - step before"] == "differs"  # [-0.8, -0.2] vs [0.26, 0.66]
    assert got["new experts: first mismatch - step before"] == "no data"


def test_bundled_tokens_follow_the_layout_rules(measured):
    # the same rules a trace written by the harness is checked against (tests/test_tracing_vllm.py): teacher-forced
    # rows hold the reference the Oracle walks, without routing; greedy routing is missing on the last token only;
    # the target's own choice (target_agrees, target_token_id) agrees with oracle.parquet's forced
    from tokens_layout import layout_failures

    tr = measured["tr"]
    held_out = {p.id: list(p.reference_token_ids) for p in read_prompts(MEASURED / PROMPTS_FILE)
                if p.reference_token_ids is not None}
    assert layout_failures(tr.oracle, tr.tokens, held_out, min_states=200) == []
    # and they can fail: routing one row off, or a teacher-forced sequence holding the greedy output
    shifted = tr.tokens.assign(new_experts=tr.tokens.groupby("seq_id")["new_experts"].shift(-1))
    assert any("window routing" in f for f in layout_failures(tr.oracle, shifted, held_out))
    s = next(iter(held_out))
    wrong = tr.tokens.copy()
    wrong.loc[wrong["seq_id"].astype(str) == s, "token_id"] += 1
    assert any(f.startswith(f"{s}: teacher-forced rows are not") for f in layout_failures(tr.oracle, wrong, held_out))
