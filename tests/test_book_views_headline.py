"""The intro's figure (speclimits.book.views.headline, speclimits.figures.headline): every mark is the
number it names, on the plain-decoding scale, from the committed engine runs and the gap decomposition."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from chartspec import dataset_with, encodings

from speclimits.book.views import headline
from speclimits.book.views.control_runs import TWIN_BENCH_DIR, load_bench_runs
from speclimits.control.decompose import gap_decomposition
from speclimits.control.fit import greedy_setup
from speclimits.control.rules import PolicyFit
from speclimits.figures.headline import speed_ladder
from speclimits.paths import TWIN_TRACE
from speclimits.trace import read_trace

MARKS = [m for m, _, _ in headline.MARKS]


@pytest.fixture(scope="module")
def batch1(tmp_path_factory):
    """The figure's rows at batch 1 in both regimes (the cheapest runs to decompose), computed into a fresh
    cache, and the cache folder."""
    cache = tmp_path_factory.mktemp("headline-cache")
    rows, notes = headline.headline_speeds(batches=(1,), cache_dir=cache)
    return rows, notes, cache


def test_marks_are_the_decomposition_on_the_measured_best_stock_k(batch1):
    """Twin, batch 1: the measured marks are the run's vs_plain of the best stock K (the run's choice) and of
    the Delta rule with λ fixed; each offline mark is that best stock K's speed times the decomposition's
    speed of its rung, the decomposition computed here with other Monte Carlo and bootstrap sizes (the replay
    world's point estimates do not depend on them)."""
    rows, notes, _ = batch1
    assert notes == []
    tr = read_trace(TWIN_TRACE)
    res = load_bench_runs(tr.meta, TWIN_BENCH_DIR)[0][1]
    fit = PolicyFit.from_dict(res["policy_fit"], origin=res["file"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gap = gap_decomposition(fit, greedy_setup(tr, fit.cost_model), bench=res, n_rollouts=8, n_boot=99)
    speed = gap.set_index("name")["speed_replay"]
    ours = rows[(rows["regime"] == "memory-bound twin") & (rows["batch"] == 1)].set_index("mark")
    assert ours.index.tolist() == MARKS
    vs_plain = {r["arm"]: r["vs_plain"] for r in res["summary"]}
    base = vs_plain[res["choice"]["best_stock"]]
    assert ours.loc["best stock K", "speed"] == pytest.approx(base, rel=1e-12)
    assert ours.loc["controller in vLLM", "speed"] == pytest.approx(vs_plain["delta-fixed"], rel=1e-12)
    for mark, rung in (("exact Oracle", "exact Oracle"), ("surrogate Oracle", "surrogate Oracle"),
                       ("real-time bound", "best causal rule, true probabilities")):
        assert ours.loc[mark, "over_best_static"] == pytest.approx(speed[rung], rel=1e-12), mark
        assert ours.loc[mark, "speed"] == pytest.approx(base * speed[rung], rel=1e-12), mark
    assert set(ours["harness"]) == {"measured", "offline"}
    assert (ours.loc[["best stock K", "controller in vLLM"], "harness"] == "measured").all()


def test_every_group_is_ordered_as_the_bounds_are(batch1):
    """Per regime and batch: the exact Oracle at or above every other mark, the surrogate Oracle above the
    best static K; each regime labelled with the machine that measured it."""
    rows, _, _ = batch1
    assert set(rows["regime"]) == {"memory-bound twin", "cache-resident pair"} and set(rows["batch"]) == {1}
    for (regime, batch), g in rows.groupby(["regime", "batch"]):
        s = g.set_index("mark")["speed"]
        assert s.index.tolist() == MARKS, (regime, batch)
        assert (s["exact Oracle"] >= s.drop("exact Oracle")).all(), (regime, batch)
        assert s["exact Oracle"] >= s["surrogate Oracle"] >= s["best stock K"] > 1.0, (regime, batch)
        assert g["machine"].str.startswith("AMD EPYC").all() and g["source"].str.endswith("bench-batch1.json").all()


def test_the_cache_gives_back_what_was_computed(batch1, monkeypatch):
    """A second call reads every decomposition from the cache (none is computed again) and gives the same rows,
    to the last digit."""
    rows, _, cache = batch1
    assert len(list(cache.glob("*.json"))) == 2

    def no_compute(*args, **kwargs):
        raise AssertionError("computed again despite the cache")

    monkeypatch.setattr("speclimits.control.decompose.gap_decomposition", no_compute)
    again, _ = headline.headline_speeds(batches=(1,), cache_dir=cache)
    pd.testing.assert_frame_equal(again, rows, check_exact=True)


def test_cache_key_follows_the_run_and_the_rule(tmp_path):
    res = TWIN_BENCH_DIR / "bench-batch1.json"
    key = headline.cache_key(TWIN_TRACE, res)
    assert key == headline.cache_key(TWIN_TRACE, res)
    assert key != headline.cache_key(TWIN_TRACE, TWIN_BENCH_DIR / "bench-batch4.json")
    assert key != headline.cache_key(TWIN_TRACE, res, rule="delta")


def test_figure_draws_every_mark_per_regime_and_batch_and_names_its_harness(batch1):
    rows, _, _ = batch1
    spec = speed_ladder(rows).to_dict()
    data = dataset_with(spec, "speed", "legend", "panel")
    assert len(data) == len(rows) and np.allclose(data["speed"], rows["speed"])
    assert list(dict.fromkeys(data["legend"])) == [f"{m} ({h})" for m, h, _ in headline.MARKS]
    assert {("y", "speed"), ("x", "batch size"), ("color", "legend"), ("column", "panel")} <= encodings(spec)
    text = headline.caption(rows)
    assert "**Measured**" in text and "**Offline**" in text and "Data:" in text
    for name in ("twin-eagle3", "measured-eagle3", "data/control/twin/bench-batch1.json",
                 "data/control/bench-batch1.json", "AMD EPYC"):
        assert name in text, name


def test_missing_regime_is_left_out_with_a_note(tmp_path):
    rows, notes = headline.headline_speeds(regimes=((tmp_path / "nope", TWIN_BENCH_DIR),), cache_dir=None)
    assert rows.empty and len(notes) == 1 and "nope" in notes[0]
