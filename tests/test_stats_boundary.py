"""The regime rule on planted rounds tables: no regime, the paper's regime, a regime elsewhere; and on the
bundled sim-default trace (the planted m <= 4 | m >= 5)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from speclimits import paths, stats
from speclimits.stats import CellMoments
from speclimits.stats.boundary import detect_boundary, one_se_rule
from speclimits.trace import read_trace


def planted_rounds(split: int | None, seed: int, n_prompts: int = 24, jump: float = 0.17,
                   beta0_drop: bool = True) -> pd.DataFrame:
    """Decode rounds at K = 1..10, one generation per prompt and K. ``split`` None: the "no split" form (β0 linear
    in m, one α); else α = 0.08 up to m = split and 0.08 + ``jump`` above, with a β0 drop there unless
    ``beta0_drop`` is False. Noise: a per-generation shift plus 1.5% multiplicative row noise."""
    rng = np.random.default_rng(seed)
    rows = []
    gid = 0
    for k in range(1, 11):
        m = k + 1
        small = split is None or m <= split
        alpha = 0.15 if split is None else (0.08 if small else 0.08 + jump)
        beta0 = 5.0 + 0.2 * m if (split is None or small or not beta0_drop) else 3.0 + 0.05 * m
        for p in range(n_prompts):
            n = int(rng.integers(20, 60))
            u = rng.normal(8 + 2.5 * m, 1.5 + 0.2 * m, n)
            L = 200 + 40 * p + np.arange(n) * (m // 2 + 1)
            mean = beta0 + alpha * u + 1.1e-3 * L
            y = mean * (1 + rng.normal(0, 0.015, n)) + rng.normal(0, 0.05)
            rows.append(pd.DataFrame({"generation_id": gid, "prompt_id": f"p{p:02d}", "K": k, "m": m,
                                      "round": np.arange(1, n + 1), "phase": "decode", "t_target_ms": y,
                                      "t_draft_ms": 0.4 * k + 0.1, "u_bar": u, "e_max": u + rng.normal(2, 1, n),
                                      "context_len": L, "kv_usage": L / 1e5, "graph_bucket": m}))
            gid += 1
    return pd.concat(rows, ignore_index=True)


def _boundary(rounds: pd.DataFrame):
    return detect_boundary(CellMoments.from_rounds(rounds))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_regime_planted_reports_none(seed):
    b = _boundary(planted_rounds(None, seed))
    assert b.split is None, b.summary()
    # the curve is flat: every split's held-out RMSE is within a few percent of no split
    assert (b.curve["fold_rmse_mean"] > 0.97 * b.curve["fold_rmse_mean"].iloc[0]).all()


@pytest.mark.parametrize("split", [4, 7])
def test_planted_regime_is_found_where_planted(split):
    b = _boundary(planted_rounds(split, seed=10 + split))
    assert b.split == split and b.rule_split == split and b.argmin_split == split
    assert list(b.outer["selected"]) == [split] * 5
    assert "every outer fold" in b.reason


def test_outer_fold_disagreement_means_no_regime():
    # a weak regime (α + 0.003 above m = 6, β0 continuous): on all the data the one-SE rule picks it,
    # but two of the five outer training sets do not, so no regime is reported
    b = _boundary(planted_rounds(6, seed=4, jump=0.003, beta0_drop=False))
    assert b.rule_split == 6
    assert 0 < b.n_agree < len(b.outer)
    assert b.split is None and "disagree" in b.reason
    # with a clearer regime of the same kind every fold agrees and it is reported
    assert _boundary(planted_rounds(6, seed=4, jump=0.006, beta0_drop=False)).split == 6


def test_one_se_rule_on_a_hand_made_curve():
    curve = pd.DataFrame({"split": [np.nan, 2.0, 3.0], "fold_rmse_mean": [1.00, 0.97, 0.95],
                          "fold_rmse_se": [0.02, 0.02, 0.03]})
    assert one_se_rule(curve) == (3, 3)  # 1.00 > 0.95 + 0.03: the split stands
    assert one_se_rule(curve.assign(fold_rmse_se=[0.02, 0.02, 0.06])) == (None, 3)  # within one SE
    assert one_se_rule(curve.assign(fold_rmse_mean=[0.90, 0.97, 0.95])) == (None, None)


def test_paper_split_rows_and_rule_rows_on_planted_regime_elsewhere():
    rounds = planted_rounds(7, seed=3)
    res = stats.fit_final_model(rounds, n_boot=99)
    reg = res.regimes.set_index(["basis", "quantity"])
    rule = reg.loc["rule: m ≤ 7 | m > 7"]
    paper_split = reg.loc["paper split m ≤ 4 | m ≥ 5"]
    # the rule's split separates the planted α levels; the paper's mixes them into its large regime
    assert rule.loc["α(m), small regime (ms/expert)", "est_max"] < 0.09
    assert rule.loc["α(m), large regime (ms/expert)", "est_min"] > 0.24
    assert paper_split.loc["α(m), large regime (ms/expert)", "est_min"] < 0.09
    # the α-level ratio recovers the planted 0.25 / 0.08, with a bootstrap interval of sensible width
    ratio = rule.loc["α level ratio, large over small regime"]
    assert abs(ratio["est_min"] - 0.25 / 0.08) < 0.1
    assert ratio["min_lo"] < ratio["est_min"] < ratio["min_hi"]
    assert 0.01 < ratio["min_hi"] - ratio["min_lo"] < 0.4
    # interpolation tables are labelled by their own split
    assert set(res.interpolation.loc[res.interpolation["scheme"] == "transfer", "m"]) == {7, 8}
    assert set(res.interpolation_paper.loc[res.interpolation_paper["scheme"] == "transfer", "m"]) == {4, 5}
    # the headline and split rows are numbers; the book's view writes their cells beside the paper's
    head = res.headline()
    for col in ("est", "lo", "hi", "est2", "lo2", "hi2", "se", "se_prompt", "half"):
        assert pd.api.types.is_float_dtype(head[col]), col
    assert head.loc["regime boundary (last m of the small regime)", "est"] == 7
    from speclimits.book.views import final_model as view

    shown = view.headline(res).set_index("Quantity")
    assert shown.loc["regime boundary (last m of the small regime)", "Ours"] == "7"
    pooled = head.loc["pooled α (SE)"]
    assert shown.loc["pooled α (SE)", "Ours"] == f"{pooled['est']:.4f} ({pooled['se']:.4f})"
    assert shown.loc["pooled α (SE)", "Paper"] == "0.2528 (0.0014)"
    regimes = view.regimes(res).set_index(["Split", "Quantity"])
    cell = regimes.loc[("rule: m ≤ 7 | m > 7", "α level ratio, large over small regime")]
    assert cell["Ours"] == f"{ratio['est_min']:.2f}"
    assert cell["95% interval"] == f"[{ratio['min_lo']:.2f}, {ratio['min_hi']:.2f}]"


def test_bundled_simulated_trace():
    """sim-default plants m <= 4 | m >= 5 (the measured trace's "no regime": test_stats_cli_book.py)."""
    rounds = read_trace(paths.TRACES_DIR / "sim-default").rounds
    dec = rounds[(rounds["phase"] == "decode") & (rounds["K"] >= 1) & (rounds["t_target_ms"] > 0)]
    assert _boundary(dec.reset_index(drop=True)).split == 4
