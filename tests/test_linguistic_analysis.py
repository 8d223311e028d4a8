"""k* by context, routing contrasts, panels and the gallery: hand-checkable units, the alignment of
Oracle states with tokens, and recovery of the simulator's planted effects within the CIs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from speclimits import linguistic as ling
from speclimits.errors import SpeclimitsError, TraceFormatError
from speclimits.linguistic import gallery
from speclimits.bootstrap import draw_counts, ratio_bootstrap
from speclimits.oracle import OracleInputs, solve
from speclimits.simulate import make_meta, preset, simulate


def _sim(n_prompts: int, seed: int, **over):
    """A simulated trace with every prompt in the Oracle table (only K = 1 rounds: they are not used)."""
    cfg = preset("smoke", n_prompts=n_prompts, oracle_prompts=n_prompts, k_values=[1], **over)
    tables = simulate(cfg, seed=seed, progress=False)
    res = solve(OracleInputs.from_frame(tables["oracle"]), cfg.truth(), k_max=10)
    lab = ling.label_trace_tokens(tables["tokens"])
    return {"cfg": cfg, "meta": make_meta(cfg, seed), "res": res, "lab": lab, "oracle": tables["oracle"],
            "dec": ling.decision_table(res, lab)}


@pytest.fixture(scope="module")
def sim():
    return _sim(42, seed=1)


@pytest.fixture(scope="module")
def reference():
    """Ten times larger, another seed: the population values the small trace's CIs should cover."""
    return _sim(420, seed=99)


# -- units --


def test_ratio_bootstrap_by_hand():
    rng = np.random.default_rng(0)
    w = draw_counts(5, 200, rng)
    assert w.shape == (200, 5) and (w.sum(axis=1) == 5).all()
    est, lo, hi = ratio_bootstrap(np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 4.0]), 500, rng)
    assert est == pytest.approx(6 / 8)
    assert 0.5 <= lo <= est <= hi <= 1.0
    # one cluster: nothing to resample, the interval collapses on the estimate
    est, lo, hi = ratio_bootstrap(np.array([3.0]), np.array([4.0]), 100, rng)
    assert est == lo == hi == 0.75


def test_cluster_bootstrap_is_wider_than_an_iid_one_when_responses_differ():
    # 10 responses of 50 decisions: half the responses always long, half never
    df = pd.DataFrame({"seq_id": np.repeat(np.arange(10), 50), "k_star": np.repeat([6, 1] * 5, 50),
                       "label": "prose_vocab"})
    clustered = ling.k_by_context(df, n_boot=2000, seed=1).iloc[0]
    iid = ling.k_by_context(df.assign(seq_id=np.arange(len(df))), n_boot=2000, seed=1).iloc[0]
    assert clustered.share_long == iid.share_long == 0.5
    assert clustered.n_responses == 10 and clustered.n_decisions == 500
    assert (clustered.long_hi - clustered.long_lo) > 3 * (iid.long_hi - iid.long_lo)


def _brute_mode(surv_row, k, remaining):
    s = [1.0] + list(surv_row[:k]) + [0.0]
    p = {j: (s[j] - s[j + 1]) if j < k else s[k] for j in range(k + 1)}
    capped = {}
    for j, v in p.items():
        jj = min(j, remaining - 1)
        capped[jj] = capped.get(jj, 0.0) + v
    best = max(capped.values())
    return min(j for j, v in capped.items() if v == best)


def test_modal_advancement_against_enumeration():
    rng = np.random.default_rng(3)
    q = rng.uniform(0.05, 0.99, size=(300, 6))
    surv = np.cumprod(q, axis=1)
    k = rng.integers(1, 7, 300)
    rem = rng.integers(1, 9, 300)
    got = ling.modal_advancement(surv, k, rem)
    want = [_brute_mode(surv[i], int(k[i]), int(rem[i])) for i in range(300)]
    assert got.tolist() == want
    # q = 0.9 everywhere, k = 4: P(a=4) = 0.656 is the mode; q = 0.3: a = 0
    assert ling.modal_advancement(np.cumprod(np.full((1, 4), 0.9), axis=1), np.array([4]))[0] == 4
    assert ling.modal_advancement(np.cumprod(np.full((1, 4), 0.3), axis=1), np.array([4]))[0] == 0


def test_decisions_take_the_label_of_the_token_the_first_draft_step_targets():
    # one sequence of 12 states and 13 token rows (row 0 = the token the context ends with at state 0);
    # the draft cannot match token row 6, so the state whose FIRST step targets it is state pos = 5
    # (rows pos + 1), which must get k* = 1 and row 6's label
    n = 12
    q_row = np.full(n + 1, 0.95)
    q_row[6] = 0.01
    row = np.arange(n)[:, None] + np.arange(1, 7)[None, :]  # draft step i of state pos predicts row pos + i
    mp = np.where(row <= n, q_row[np.clip(row, 0, n)], 0.0)
    u = np.tile(8.0 + 2.0 * np.arange(7), (n, 1))
    inp = OracleInputs.from_arrays([n], mp, u, seq_ids=["s"])
    res = solve(inp, preset("smoke").truth(), k_max=6)
    texts = [" the", " model"] * 6 + [" the"]
    texts[6] = " модель"
    tok = pd.DataFrame({"seq_id": "s", "pos": np.arange(n + 1), "text": texts, "new_experts": 2.0})
    dec = ling.decision_table(res, ling.label_trace_tokens(tok))
    at = dec.set_index("pos")
    assert at.loc[5, "label"] == "script_change" and at.loc[5, "text"] == " модель"
    assert at.loc[5, "token_pos"] == 6
    assert at.loc[5, "k_star"] == 1 and at.loc[5, "match_prob_1"] == pytest.approx(0.01)
    assert at.loc[4, "label"] != "script_change"
    assert at.loc[4, "match_prob_1"] == pytest.approx(0.95)
    assert dec.attrs["n_unmatched"] == 0
    # the old simulator convention (as many token rows as states) is refused, not joined one token off
    with pytest.raises(SpeclimitsError, match="one more"):
        ling.decision_table(res, ling.label_trace_tokens(tok.iloc[:n]))


def test_decision_table_against_a_hand_join(tmp_path):
    # two sequences (3 and 2 states), token ids chosen so that every row is distinct
    inp = OracleInputs.from_arrays([3, 2], np.full((5, 2), 0.5), np.tile([4.0, 5.0, 6.0], (5, 1)),
                                   seq_ids=["a", "b"])
    res = solve(inp, preset("smoke").truth(), k_max=2)
    tok = pd.DataFrame({"seq_id": ["a"] * 4 + ["b"] * 3, "pos": [0, 1, 2, 3, 0, 1, 2],
                        "token_id": [10, 11, 12, 13, 20, 21, 22],
                        "text": [" zero", " one", " two", " three", " nul", " eins", " zwei"], "new_experts": 1.0})
    dec = ling.decision_table(res, ling.label_trace_tokens(tok), kinds=np.array(["greedy", "teacher-forced"]))
    # by hand: state (a, 0) -> row (a, 1) = 11, (a, 1) -> 12, (a, 2) -> 13, (b, 0) -> 21, (b, 1) -> 22
    assert list(zip(dec["seq_id"], dec["pos"], dec["token_id"])) == [
        ("a", 0, 11), ("a", 1, 12), ("a", 2, 13), ("b", 0, 21), ("b", 1, 22)]
    assert dec["text"].tolist() == [" one", " two", " three", " eins", " zwei"]
    assert dec["reference_kind"].tolist() == ["greedy"] * 3 + ["teacher-forced"] * 2
    assert (dec["token_pos"] == dec["pos"] + 1).all()
    csv = pd.read_csv(ling.write_decisions(dec, tmp_path / "d.csv"))
    pq = pd.read_parquet(ling.write_decisions(dec, tmp_path / "d.parquet"))
    for back in (csv, pq):
        assert back["token_id"].tolist() == [11, 12, 13, 21, 22]
        assert back["k_star"].tolist() == dec["k_star"].tolist()
        assert {"seq_id", "pos", "token_id", "text", "label", "k_star", "reference_kind"} <= set(back.columns)
    with pytest.raises(SpeclimitsError, match="suffix"):
        ling.write_decisions(dec, tmp_path / "d.txt")
    with pytest.raises(SpeclimitsError, match="2 sequences"):
        ling.decision_table(res, ling.label_trace_tokens(tok), kinds=np.array(["greedy"]))
    # the one join: any step, any state; step 0 is the window's opening token
    got = ling.state_tokens(pd.DataFrame({"seq_id": ["a", "b", "b"], "pos": [0, 1, 1]}), tok, step=[0, 1, 2],
                            columns=["token_id"])
    assert got["token_id"].tolist()[:2] == [10, 22] and not got["has_token"].iloc[2]


# -- k* by context: planted effects --


def test_k_by_context_recovers_the_planted_ordering_and_sizes(sim, reference):
    for by in ("context", "label"):
        tab = ling.k_by_context(sim["dec"], by=by, n_boot=999, seed=0).set_index("context")
        # sign: code formatting drafts long, script change short (planted q 0.96 vs 0.15)
        assert tab.loc["code_format", "long_lo"] > tab.loc["prose_vocab", "long_hi"]
        assert tab.loc["prose_vocab", "long_lo"] > tab.loc["script_change", "long_hi"]
        assert tab.loc["script_change", "share_k1"] > 0.85
        assert tab.loc["code_format", "n_decisions"] == (sim["dec"][by].astype(str) == "code_format").sum()
        assert tab.loc["code_format", "paper_share_long"] == 0.718
    # size: the small trace's intervals cover the population values of a ten times larger trace
    small = ling.k_by_context(sim["dec"], by="context", n_boot=999, seed=0).set_index("context")
    big = ling.k_by_context(reference["dec"], by="context", n_boot=9, seed=0).set_index("context")
    for ctx in ("code_format", "code_structure", "prose_vocab", "prose_boundary", "markup"):
        assert small.loc[ctx, "long_lo"] <= big.loc[ctx, "share_long"] <= small.loc[ctx, "long_hi"], ctx


def test_decision_table_needs_labels_and_k_by_context_a_column(sim):
    with pytest.raises(SpeclimitsError, match="label_trace_tokens"):
        ling.decision_table(sim["res"], sim["lab"].drop(columns="label"))
    with pytest.raises(SpeclimitsError, match="no column 'nope'"):
        ling.k_by_context(sim["dec"], by="nope")
    fine = ling.k_by_context(sim["dec"], by="label_fine", n_boot=50)
    assert set(fine["context"]) <= {"function_start", "control_flow", "comment", "word_continuation"}
    shares = ling.k_star_shares(sim["dec"])
    assert np.allclose(shares.groupby("context")["share"].sum(), 1.0)


# -- routing: planted effects --


def test_script_change_routing_recovers_the_planted_difference(reference):
    # script changes are rare (a few per Cyrillic-prose response): the larger trace is needed for the sign
    c = ling.script_change_contrast(reference["lab"])
    assert c.n_events > 100 and set(c.events["direction"]) == {"latin->cyrillic", "cyrillic->latin"}
    s = c.summary(n_boot=1999, seed=0)
    truth = ling.planted_contrast(c, reference["meta"])
    assert truth > 0.15  # planted: lower routing overlap at a script change
    assert s["diff_lo"] > 0
    assert s["diff_lo"] <= truth <= s["diff_hi"]
    # before/at are the token and the one before it
    ev = c.events.iloc[0]
    lab = reference["lab"].set_index(["seq_id", "pos"])
    assert ev["at"] == lab.loc[(ev["seq_id"], ev["pos"]), "new_experts"]
    assert ev["before"] == lab.loc[(ev["seq_id"], ev["pos"] - 1), "new_experts"]


def test_first_mismatch_reference_contrast_recovers_the_planted_difference(sim):
    c = ling.first_mismatch_contrast(sim["res"], sim["lab"], source="reference")
    inp = sim["res"].inputs
    # every state with a mismatch inside the sequence is an event: the missed row pos + a + 1 and the row
    # before it, pos + a >= 0, are both in the tokens table (row 0 = the token before the reference)
    assert c.n_events == int(((inp.accept_len < inp.k_list) & (inp.accept_len < inp.remaining)).sum())
    s = c.summary(n_boot=1999, seed=0)
    truth = ling.planted_contrast(c, sim["meta"])
    assert s["diff_lo"] <= truth <= s["diff_hi"]
    assert (c.events["token_pos"] == c.events["pos"] + c.events["step"]).all()
    ne = sim["lab"].set_index(["seq_id", "pos"])["new_experts"]
    ev = c.events.iloc[:50]
    np.testing.assert_array_equal(ev["at"], ne.loc[list(zip(ev["seq_id"], ev["pos"] + ev["step"]))].to_numpy())
    np.testing.assert_array_equal(ev["before"], ne.loc[list(zip(ev["seq_id"], ev["pos"] + ev["step"] - 1))].to_numpy())


@pytest.mark.parametrize("shift", [0.0, -0.1])
def test_first_mismatch_window_detects_a_planted_junk_tail_shift(shift):
    t = _sim(42, seed=1, junk_rho_shift=shift)
    c = ling.first_mismatch_contrast(t["res"], source="window")
    s = c.summary(n_boot=999, seed=0)
    top_k, n_exp = t["cfg"].top_k, t["cfg"].n_experts
    # planted size: the junk token's overlap drops by |shift|, so it adds about
    # top_k * |shift| * (1 - U/E) more experts per layer than a correct draft would
    planted = float((top_k * -shift * (1 - c.events["u_before"] / n_exp)).mean())
    assert s["adjusted_lo"] <= planted <= s["adjusted_hi"]
    if shift < 0:
        assert s["adjusted_lo"] > 0.3
    assert c.controls is not None and (c.controls["step"] >= 2).all()


def test_routing_table_and_errors(sim):
    cs = [ling.script_change_contrast(sim["lab"]), ling.first_mismatch_contrast(sim["res"], source="window")]
    tab = ling.routing_table(cs, n_boot=99)
    assert tab["paper_diff"].tolist() == [0.46, 0.01]
    assert np.isnan(tab.loc[0, "adjusted"]) and np.isfinite(tab.loc[1, "adjusted"])
    with pytest.raises(SpeclimitsError, match="tokens table"):
        ling.first_mismatch_contrast(sim["res"], None, source="reference")
    with pytest.raises(SpeclimitsError, match="source"):
        ling.first_mismatch_contrast(sim["res"], source="both")
    with pytest.raises(TraceFormatError, match="new_experts"):
        ling.script_change_contrast(sim["lab"].drop(columns="new_experts"))


# -- panels and the gallery --


def test_gallery_follows_its_selection_rule(sim):
    dec = sim["dec"]
    excl = [(str(dec.loc[0, "seq_id"]), int(dec.loc[0, "pos"]))]
    gal = gallery.select_gallery(dec, n_per_group=4, exclude=excl, seed=0)
    assert len(gal) == 12 and gal["seq_id"].nunique() == 12
    assert gal.attrs["short"] == {}
    assert (gal["group"].value_counts() == 4).all()
    assert excl[0] not in set(zip(gal["seq_id"], gal["pos"]))
    k_max = sim["res"].k_max
    assert (gal["remaining"] > k_max).all()
    reg = gal[gal["group"] == "regular continuation"]
    assert (reg["accept_len"] >= 8).all() and (reg["k_star"] >= 4).all()
    st = gal[gal["group"] == "structural boundary"]
    assert (st["label"].isin(ling.BOUNDARY_LABELS) | st["label_fine"].isin(gallery.STRUCTURE_FINE)).all()
    ce = gal[gal["group"] == "counterexample"]
    assert (ce["k_star"] >= 4).all()
    assert (ce["label"].isin(ling.BOUNDARY_LABELS) | (ce["accept_len"] <= 1)).all()
    assert ce["subtype"].nunique() >= 2
    again = gallery.select_gallery(dec, n_per_group=4, exclude=excl, seed=0)
    pd.testing.assert_frame_equal(gal, again)


def test_ablation_cases_are_shifts_from_different_responses(sim):
    from speclimits.oracle.ablation import alpha_ablation

    cases = gallery.select_ablation_cases(alpha_ablation(sim["res"]).cases, n=4)
    assert 1 <= len(cases) <= 4
    assert cases["seq_id"].nunique() == len(cases)
    assert (cases["k_star_alpha0"] != cases["k_star"]).all() and (cases["q0_diff"] < 0).all()
    assert cases["match_prob_added"].is_monotonic_decreasing or cases["boundary"].nunique() > 1


def test_panel_data_rows_statuses_and_draft_tokens(sim):
    res, lab = sim["res"], sim["lab"]
    dec = sim["dec"]
    pick = dec[(dec["accept_len"] == 2) & (dec["remaining"] > 10)].iloc[[0]]
    p = gallery.panel_data(res, lab, pick)
    s, n = str(pick["seq_id"].iloc[0]), int(pick["pos"].iloc[0])
    tgt = p[p["row"] == "target"].set_index("step")
    dr = p[p["row"] == "draft"].set_index("step")
    assert len(tgt) == res.k_max
    tok = lab.set_index(["seq_id", "pos"])["text"]
    for i in range(1, res.k_max + 1):
        assert tgt.loc[i, "raw_text"] == tok.loc[(s, n + i)]  # draft step i of state n predicts row n + i
    assert tgt["status"].tolist()[:4] == ["match", "match", "first mismatch", "after mismatch"]
    assert dr.loc[1, "raw_text"] == tgt.loc[1, "raw_text"]
    assert dr.loc[3, "raw_text"] == gallery.MISMATCH_GLYPH and dr.loc[4, "raw_text"] == gallery.UNKNOWN_GLYPH
    k = int(pick["k_star"].iloc[0])
    assert (tgt["past_kstar"] == (tgt.index > k)).all()
    assert (tgt["a_mode"] == pick["a_mode"].iloc[0]).all()
    # a trace that carries the draft's tokens: they are shown instead of placeholders, by their text where
    # the tokens table has the id
    oracle = sim["oracle"].copy()
    known = int(lab["token_id"].iloc[0])
    oracle["draft_tokens"] = [[known] + [-5] * 9 for _ in range(len(oracle))]
    p3 = gallery.panel_data(res, lab, pick, oracle=oracle)
    text = dict(zip(lab["token_id"].astype(int), lab["text"].astype(str)))[known]
    assert p3[p3["row"] == "draft"]["raw_text"].tolist() == [text] + ["#-5"] * 9
    with pytest.raises(SpeclimitsError, match="not in the Oracle"):
        gallery.panel_data(res, lab, pd.DataFrame({"seq_id": ["nope"], "pos": [0]}))


def test_figures_encode_the_results(sim):
    from chartspec import dataset_with, encodings

    from speclimits import figures

    dec, res, lab = sim["dec"], sim["res"], sim["lab"]
    gal = gallery.select_gallery(dec, n_per_group=1)
    spec = figures.decision_panels(gallery.panel_data(res, lab, gal)).to_dict()
    assert spec["facet"]["row"]["field"] == "panel"
    rules = [layer for layer in spec["spec"]["layer"] if layer["mark"]["type"] == "rule"]
    assert len(rules) == 2  # k* and a_mode (no α = 0 line without k_star_alpha0)
    tab = ling.k_by_context(dec, n_boot=20)
    for measure, (est, lo, hi) in (("long", ("share_long", "long_lo", "long_hi")),
                                   ("k1", ("share_k1", "k1_lo", "k1_hi"))):
        spec = figures.k_by_context_chart(tab, measure=measure).to_dict()
        assert {("x", lo), ("x2", hi), ("x", est), ("x", f"paper_{est}")} <= encodings(spec)
        plotted = dataset_with(spec, "context", est).set_index("context")
        np.testing.assert_allclose(plotted[est], tab.set_index("context")[est])
    shares = ling.k_star_shares(dec)
    spec = figures.k_star_distribution_chart(shares).to_dict()
    assert {("x", "share"), ("color", "k_star"), ("y", "context")} <= encodings(spec)
    per_context = dataset_with(spec, "context", "share").groupby("context")["share"].sum()
    np.testing.assert_allclose(per_context, 1.0)  # each context's k* shares add up
    rt = ling.routing_table([ling.script_change_contrast(lab), ling.first_mismatch_contrast(res, source="window")],
                            n_boot=20)
    spec = figures.routing_contrast_chart(rt).to_dict()
    assert {("x", "diff"), ("x", "lo"), ("x2", "hi"), ("color", "source")} <= encodings(spec)
    ours = dataset_with(spec, "contrast", "source", "diff").query("source == 'this trace'")
    assert set(rt["diff"]) <= set(ours["diff"])
    paper_rows = dataset_with(spec, "contrast", "source", "diff").query("source == 'paper'")
    assert set(paper_rows["diff"]) == set(rt["paper_diff"])
    conf = ling.label_agreement(lab).confusion
    spec = figures.label_confusion_chart(conf).to_dict()
    assert ("x", "labelled") in encodings(spec) and ("color", "share") in encodings(spec)
    cells = dataset_with(spec, "labelled", "share")
    planted_col = [c for c in cells.columns if c not in ("labelled", "share", "n")][0]
    np.testing.assert_allclose(cells.groupby(planted_col)["share"].sum(), 1.0)  # shares of each planted context


def test_missing_new_experts_values_drop_events_not_the_analysis(sim):
    lab = sim["lab"].copy()
    full = ling.script_change_contrast(lab)
    first = full.events.iloc[0]
    lab.loc[(lab["seq_id"] == first["seq_id"]) & (lab["pos"] == first["pos"]), "new_experts"] = np.nan
    assert ling.script_change_contrast(lab).n_events == full.n_events - 1
    ref = ling.first_mismatch_contrast(sim["res"], lab, source="reference")
    assert np.isfinite(ref.events[["before", "at"]].to_numpy()).all()
    with pytest.raises(TraceFormatError, match="no finite number"):
        ling.script_change_contrast(lab.assign(new_experts=np.nan))
