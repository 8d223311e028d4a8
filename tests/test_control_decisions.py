"""The controller decides as it did: every policy's k per round on recorded rounds at batch 1, 4 and 8
(``tests/data/control-decisions.parquet``, written by ``tests/decision_fixture.py`` from the code before
the controller's consolidation, issue 42, and again for the rules with memory when the offline harness
took the engine's observation timing), through the engine's round driver and the offline replay."""

from __future__ import annotations

import pandas as pd
import pytest

from decision_fixture import BATCHES, FIXTURE, driver_decisions, offline_decisions

COLUMNS = ["policy", "batch", "group", "round", "slot", "k", "drafted"]


@pytest.fixture(scope="module")
def recorded() -> pd.DataFrame:
    d = pd.read_parquet(FIXTURE)
    d["policy"] = d["policy"].astype(str)
    return d


def same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    got = got[COLUMNS].astype({c: "int64" for c in COLUMNS[1:]}).reset_index(drop=True)
    want = want[COLUMNS].astype({c: "int64" for c in COLUMNS[1:]}).reset_index(drop=True)
    for name, w in want.groupby("policy", sort=False):
        g = got[got["policy"] == name].reset_index(drop=True)
        pd.testing.assert_frame_equal(g, w.reset_index(drop=True), obj=f"{name} at batch {w['batch'].iat[0]}")
    assert set(got["policy"]) == set(want["policy"])


def test_the_fixture_covers_600_rounds_per_batch_size(recorded):
    for b in BATCHES:
        d = recorded[(recorded["path"] == "driver") & (recorded["batch"] == b)]
        assert d.groupby("policy").size().min() >= 600


@pytest.mark.parametrize("batch", BATCHES)
def test_the_round_driver_decides_as_recorded(recorded, batch):
    want = recorded[(recorded["path"] == "driver") & (recorded["batch"] == batch)]
    same(driver_decisions(batch), want)


def test_the_offline_replay_decides_as_recorded(recorded):
    same(offline_decisions(), recorded[recorded["path"] == "offline"])
