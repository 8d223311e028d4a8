"""The online-control charts (speclimits.figures.control) draw their rows at the package's common sizes."""

from __future__ import annotations

import numpy as np
import pandas as pd
from chartspec import dataset_with, encodings

from speclimits.figures import _common
from speclimits.figures import control as fig


def _share(batch: int) -> pd.DataFrame:
    return pd.DataFrame({"policy": ["delta", "delta", "threshold", "threshold"],
                         "where": ["offline", "engine"] * 2, "share": [0.4, 0.3, 0.2, 0.25],
                         "lo": [0.3, 0.2, 0.1, 0.2], "hi": [0.5, 0.4, 0.3, 0.3], "batch": batch})


def test_share_captured_stacks_one_panel_per_batch_with_its_own_rows():
    spec = fig.share_captured_by_batch({1: _share(1), 4: _share(4)}).to_dict()
    assert len(spec["vconcat"]) == 2 and spec["resolve"]["scale"]["x"] == "shared"
    for panel, b in zip(spec["vconcat"], (1, 4)):
        assert panel["spec"]["width"] == _common.WIDTH and panel["spec"]["height"] == _common.HEIGHT * 0.8
        rows = pd.DataFrame(spec["datasets"][panel["data"]["name"]])
        assert set(rows["batch"]) == {b} and len(rows) == 4  # each panel draws its own batch only
    assert {("x", "share"), ("x", "lo"), ("x2", "hi"), ("y", "policy")} <= encodings(spec)


def test_k_along_reference_draws_the_policies_and_both_oracles():
    frame = pd.DataFrame({"pos": [0, 1, 2], "k_star_exact": [3, 2, 1], "k_star_surrogate": [3, 3, 1],
                          "delta": [2, np.nan, 1]})
    spec = fig.k_along_reference(frame, ["delta"]).to_dict()
    assert spec["width"] == _common.WIDTH and spec["height"] == _common.HEIGHT
    d = dataset_with(spec, "who", "pos", "k")
    assert sorted(set(d["who"])) == ["delta", "k_star_exact", "k_star_surrogate"]
    assert len(d) == 8  # the state delta's walk did not visit is left out
