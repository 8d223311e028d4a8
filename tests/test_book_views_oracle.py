"""The reader tables of the Oracle section show the Oracle's numbers, not other ones; its setup printout names
files relative to the site or the trace, not the build machine."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from speclimits import paper
from speclimits.book.present import fmt_ci
from speclimits.book.views import oracle as view
from speclimits.oracle import prepare_oracle
from speclimits.oracle.ablation import alpha_ablation
from speclimits.control.compare import compare_policies
from speclimits.oracle.report import best_online, oracle_report, policy_kind
from speclimits.oracle.validation import validation_by_surrogate
from speclimits.paths import DEFAULT_TRACE
from speclimits.stats import fit_trace_cost_model


@pytest.fixture(scope="module")
def setup(smoke_trace):
    return prepare_oracle(smoke_trace)


@pytest.fixture(scope="module")
def report(smoke_trace, setup):
    return oracle_report(smoke_trace, setup=setup, k_max=4, n_boot=5, seed=0)


@pytest.fixture(scope="module")
def comparison(setup):
    sub = setup.for_kind("greedy")
    return compare_policies(sub, k_max=4, seed=0, n_rollouts=4)


def test_bound_cells_carry_the_bootstrap_interval(report):
    t = view.bound(report).set_index("Quantity")
    col = [c for c in t.columns if c.endswith("[95% CI]")][0]
    iv = report.interval
    lo, hi = iv.interval["speedup"]
    assert t.loc["Oracle speedup over autoregressive (×)", col] == fmt_ci(iv.estimate["speedup"], lo, hi)
    lo, hi = iv.interval["gain_over_best_static"]
    assert t.loc["Oracle gain over the best static K (×)", col] == fmt_ci(iv.estimate["gain_over_best_static"], lo, hi)
    assert t.loc["Best static K (in hindsight)", col].startswith(str(report.headline.bounds.best_static_k))
    plateau = paper.THIRD_PARTY["mean_accepted_plateau"]["value"]
    assert t.loc["Accepted drafts per round", "Paper"].startswith(str(plateau))
    if report.with_k0 is not None:
        assert float(t.loc["Oracle speedup over autoregressive (×)", "With $k = 0$ allowed"]) == \
            pytest.approx(report.with_k0.bounds.speedup, abs=5e-4)


def test_validation_errors_are_the_used_surrogates_in_percent(setup):
    valid = validation_by_surrogate(setup, kind="greedy", k_max=4)
    used = setup.surrogate_label
    t = view.validation(valid, used)
    first = t.columns[2]
    assert first.startswith(used) and "(used)" in first
    mine = valid[valid["surrogate"] == used].sort_values("K")
    body = t.iloc[:-1]
    np.testing.assert_allclose(body[first].astype(float), 100 * mine["rel_error"].to_numpy(), atol=0.051)
    np.testing.assert_allclose(body["Measured speedup"].astype(float), mine["measured_speedup"], rtol=1e-12)
    worst = mine["rel_error"].abs()
    assert t.iloc[-1][first] == f"{100 * worst.max():.1f} (K = {int(mine.loc[worst.idxmax(), 'K'])})"


def test_k_star_shares_and_the_breakdown_match_the_solution(report):
    t = view.k_star_shares(report)
    for kind, res in report.by_kind.items():
        col = f"{kind} (% of states)"
        np.testing.assert_allclose(t[col].sum(), 100.0)
        expected = res.to_frame()["k_star"].value_counts(normalize=True) * 100
        got = t.set_index("$k^\\star$")[col]
        np.testing.assert_allclose(got.reindex(expected.index), expected)
    t = view.breakdown(report.headline.bounds)
    assert t["Share (%)"].sum() == pytest.approx(100.0)
    assert t["Expected time (ms)"].sum() == pytest.approx(sum(report.headline.bounds.breakdown_ms.values()))


def test_ablation_cases_and_moves_add_up(report, setup):
    ab = alpha_ablation(report.headline, draft_prob=setup.for_kind("greedy").raw_inputs.match_prob)
    assert view.cases_by_boundary(ab)["Cases"].sum() == len(ab.cases)
    assert view.moves(ab)["States"].sum() == report.headline.inputs.n_states
    n, share = view.cases_in_paper_range(ab)
    lo, hi = paper.CASE_MATCH_RANGE
    assert n == len(ab.cases)
    if n:
        assert share == pytest.approx(ab.cases["match_prob_added"].between(lo, hi).mean())
        shown, full = view.top_cases(ab, n=3)
        assert len(full) == n and list(shown["Added-token match prob."]) == \
            sorted(ab.cases["match_prob_added"], reverse=True)[: len(shown)]


def test_policies_keep_online_rules_and_the_reference_static_k(comparison):
    shown, full = view.policies(comparison)
    t = comparison.table
    online = t[~t["policy"].str.startswith("static K = ")]
    assert len(shown) == len(online) + len({comparison.best_static_k_train, comparison.best_static_k_test})
    assert full is t
    oracle = shown[shown["Policy"] == "Oracle (bound)"].iloc[0]
    assert oracle[view.SURROGATE_SHARE] == pytest.approx(100.0)
    hindsight = shown[shown["Policy"].str.contains("best in hindsight")].iloc[0]
    assert hindsight[view.SURROGATE_SHARE] == 0.0 and hindsight["vs best static K (×)"] == pytest.approx(1.0)
    name, gain = best_online(t)
    assert name != "Oracle (bound)" and not name.startswith("static K")
    rules = online[online["policy"] != "Oracle (bound)"]
    assert gain == pytest.approx(rules["gain_captured"].max())
    assert set(t["policy"].map(policy_kind)) == {"static", "online", "oracle"}
    assert (t["policy"].map(policy_kind) == "oracle").sum() == 1
    # compare_policies writes the kind itself; the label rule agrees with it on every row
    assert t["kind"].tolist() == t["policy"].map(policy_kind).tolist()
    assert best_online(t.drop(columns="kind")) == (name, gain)


@pytest.fixture(scope="module")
def replayed(setup, comparison):
    """Section 8's offline table on the comparison's fit and held-out greedy references (section 6's second
    yardstick)."""
    from speclimits.arms import POLICY_NAMES
    from speclimits.control.offline import offline_table

    fit = comparison.fit
    names = [f"static:{k}" for k in range(1, fit.k_max + 1)] + list(POLICY_NAMES)
    table, _ = offline_table(fit, setup.for_kind("greedy"), list(fit.test_seq_ids), names, n_rollouts=4, n_boot=49)
    return table


def test_key_results_are_the_computed_numbers(report, comparison, replayed):
    from speclimits.book.views.control import offline_best

    exact = offline_best(replayed)
    rows = view.key_results(report, best_online(comparison.table), exact)
    iv = report.interval
    assert rows[0].ours == fmt_ci(iv.estimate["speedup"], *iv.interval["speedup"])
    assert rows[1].ours == fmt_ci(iv.estimate["gain_over_best_static"], *iv.interval["gain_over_best_static"])
    assert rows[2].ours == str(report.headline.bounds.best_static_k)
    # section 8's yardstick first: the exact Oracle's gain, replayed, with its interval; then the surrogate's
    assert "exact Oracle's gain" in rows[-2].quantity and "replayed" in rows[-2].quantity
    assert rows[-2].ours == fmt_ci(exact["share"], exact["share_lo"], exact["share_hi"], 2)
    _, gain = best_online(comparison.table)
    assert "surrogate Oracle's gain" in rows[-1].quantity and rows[-1].ours == fmt_ci(gain, decimals=2)
    assert all(r.ref and r.ref.startswith("tbl-oracle-") for r in rows)
    assert len(view.key_results(report)) == len(rows) - 2  # no comparison: no share rows
    assert len(view.key_results(report, exact=exact)) == len(rows) - 1


def test_shares_sets_both_yardsticks_side_by_side(comparison, replayed):
    from speclimits.arms import POLICY_NAMES, policy_label
    from speclimits.book.views.control import offline

    t = view.shares(offline(replayed))
    assert t["Policy"].tolist() == [policy_label(p) for p in POLICY_NAMES]  # the rules, no static K
    assert [c for c in t.columns if c.startswith("Share")] == ["Share captured, exact Oracle [95% CI]",
                                                              "Share captured, surrogate Oracle [95% CI]"]
    # the surrogate yardstick is the policy table's share (one fit, one evaluation)
    ours = replayed.set_index("policy")["share_surrogate"]
    t = comparison.table
    theirs = t[~t["policy"].str.endswith("(rollouts)")].set_index("name")["gain_captured"]
    for name in POLICY_NAMES:
        assert ours[name] == pytest.approx(theirs[name], abs=1e-9)


def test_k_max_sweep_columns_per_kind_and_wrapped_printout():
    text = view.wrap(["x " * 100, "short"], width=40)  # printed lines stay within the column
    assert max(len(line) for line in text.splitlines()) <= 40
    assert text.splitlines()[-1] == "short"
    sw = pd.DataFrame({"k_max": [1, 2], "speedup": [1.1, 1.2], "gain_over_best_static": [1.0, 1.05],
                       "mean_accepted": [0.5, 0.8]})
    shown, full = view.k_max_sweep({"greedy": sw, "teacher-forced": sw.assign(speedup=[0.9, 0.95])})
    assert list(shown["Speedup, teacher-forced (×)"]) == [0.9, 0.95]
    assert list(shown["Gain, greedy (×)"]) == [1.0, 1.05]
    assert len(full) == 4 and set(full["references"]) == {"greedy", "teacher-forced"}


def test_for_sequences_keeps_exactly_the_named_references_in_setup_order(setup):
    ids = [str(s) for s in setup.inputs.seq_ids]
    wanted = [ids[3], ids[0], "not-a-reference"]
    sub = setup.for_sequences(wanted)
    assert [str(s) for s in sub.inputs.seq_ids] == [ids[0], ids[3]]
    assert [str(s) for s in sub.raw_inputs.seq_ids] == [ids[0], ids[3]]
    assert list(sub.kinds) == [setup.kinds[0], setup.kinds[3]]
    assert int(sub.inputs.n_tokens.sum()) == int(setup.inputs.n_tokens[[0, 3]].sum())
    with pytest.raises(Exception, match="none of the 1 requested"):
        setup.for_sequences(["not-a-reference"])


def test_setup_notes_name_no_absolute_path(tmp_path):
    cost_model = fit_trace_cost_model(DEFAULT_TRACE).write(tmp_path / "_static" / "cost_model.json").resolve()
    trace = DEFAULT_TRACE.resolve()
    setup = prepare_oracle(trace, cost_model)
    assert str(cost_model) in setup.notes[0]  # what the Oracle records (and the CLI prints)
    lines = view.relative_paths([*setup.notes], cost_model, trace)
    assert lines[0] == "cost model _static/cost_model.json"
    assert not any(str(tmp_path) in line or str(trace.parent) in line for line in lines)
    fitted = view.relative_paths(prepare_oracle(trace).notes, None, trace)
    assert fitted[0].startswith(f"cost model fitted on {trace.name}/rounds.parquet")
