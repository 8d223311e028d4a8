"""The controller's decisions on recorded rounds: the guard of the controller's refactoring (issue 42).

For batch sizes 1, 4 and 8, every shipped policy chooses k round by round on the held-out greedy references of
``data/traces/measured-eagle3``, priced as the committed benchmark run of that batch size priced them
(``data/control/bench-batchB.json``: its policy fit and the costs its engine profiled):

* ``path = "driver"``: the engine's round driver as :func:`speclimits.control.offline.batch_replay` runs it, one
  row per request per round: ``k`` kept, ``drafted`` steps the round ran;
* ``path = "offline"`` (batch 1 only): :func:`speclimits.control.offline.walk_actions`, one row per round.

Write the fixture (``tests/data/control-decisions.parquet``) with ``.venv/bin/python tests/decision_fixture.py``;
``tests/test_control_decisions.py`` replays it and asserts the same k in every row."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "control-decisions.parquet"
TRACE = ROOT / "data" / "traces" / "measured-eagle3"
BATCHES = (1, 4, 8)
#: every policy the controller ships: the extension's static K, the engine's rules and their variants
DRIVER_POLICIES = tuple(f"static:{k}" for k in range(1, 7)) + (
    "threshold", "delta", "delta-fixed", "delta:alone", "delta-fixed:alone", "delta-fixed:greedy-stop",
    "delta:raw-confidence", "ema", "cascade", "throughput")
#: the offline harness's rules (section 6's comparison, with the offline-only variant)
OFFLINE_POLICIES = tuple(f"static:{k}" for k in range(1, 7)) + (
    "threshold", "delta-fixed", "delta-fixed:greedy-stop", "delta", "delta:previous-u", "delta:raw-confidence",
    "ema", "cascade", "throughput")


def priced_setting(batch: int):
    """``(priced fit, profile, raw inputs of the references, groups of reference indices)`` of the
    committed run at ``batch``."""
    from speclimits.bench.control import block_prompts
    from speclimits.control.fit import greedy_setup
    from speclimits.control.offline import select
    from speclimits.control.profile import EngineProfile
    from speclimits.control.rules import PolicyFit

    res = json.loads((ROOT / "data" / "control" / f"bench-batch{batch}.json").read_text())
    fit = PolicyFit.from_dict({**res["policy_fit"], "curves": {}}, origin=f"bench-batch{batch}.json")
    prof = EngineProfile.from_dict(res["profile"])
    model = prof.cost_model(fit.cost_model, fit.u_bar_mean, fit.k_max)
    priced = replace(fit, cost_model=model, lambda_=fit.engine_lambda(model))
    setup = greedy_setup(TRACE, fit.cost_model)
    ids = [str(i) for i in res["prompt_ids"]]
    raw, _ = select(setup, ids, n_states=int(res["config"]["max_tokens"]) - 1)
    index = {str(s): i for i, s in enumerate(raw.seq_ids)}
    groups = [[index[ids[i]] for i in block_prompts(ids, batch, b)] for b in range(len(ids) // batch)]
    return priced, prof, raw, groups


def driver_decisions(batch: int, names=DRIVER_POLICIES) -> pd.DataFrame:
    """One row per policy, group, round and request: the k kept and the steps drafted, read off
    :meth:`RoundDriver.run_round` as :func:`batch_replay` calls it (one driver per group of references)."""
    from speclimits.control.driver import RoundDriver
    from speclimits.control.offline import batch_replay

    priced, prof, raw, groups = priced_setting(batch)
    rows: list[tuple] = []
    orig = RoundDriver.run_round
    drivers: list[object] = []  # held, so that no two drivers share an id
    log: list[tuple] = []

    def run_round(self, rids, conf, k_call, weights=None):
        keep, drafted = orig(self, rids, conf, k_call, weights)
        if not drivers or drivers[-1] is not self:
            drivers.append(self)
        log.append((len(drivers) - 1, [int(r) for r in rids], list(keep), int(drafted)))
        return keep, drafted

    RoundDriver.run_round = run_round
    try:
        for name in names:
            drivers.clear()
            log.clear()
            batch_replay(priced, raw, groups, [name], prof)
            rnd: dict[int, int] = {}
            for g, slots, keep, drafted in log:
                r = rnd[g] = rnd.get(g, -1) + 1
                rows.extend((name, batch, g, r, s, int(k), drafted) for s, k in zip(slots, keep))
    finally:
        RoundDriver.run_round = orig
    return pd.DataFrame(rows, columns=["policy", "batch", "group", "round", "slot", "k", "drafted"])


def offline_decisions(names=OFFLINE_POLICIES) -> pd.DataFrame:
    """One row per policy, reference and round of the offline replay at batch 1 (``slot`` 0, ``drafted`` -1)."""
    from speclimits.control.offline import walk_actions
    from speclimits.oracle.inputs import CostTable

    priced, _, raw, groups = priced_setting(1)
    rows: list[tuple] = []
    for name in names:
        for g, (s,) in enumerate(groups):
            one = raw.subset([s])
            pol = priced.make(name).bind(one, CostTable.build(one, priced.cost_model, priced.k_max))
            ks = walk_actions(pol, one)
            ks = ks[np.isfinite(ks)].astype(int)
            rows.extend((name, 1, g, r, 0, int(k), -1) for r, k in enumerate(ks))
    return pd.DataFrame(rows, columns=["policy", "batch", "group", "round", "slot", "k", "drafted"])


def decisions() -> pd.DataFrame:
    parts = [driver_decisions(b).assign(path="driver") for b in BATCHES]
    parts.append(offline_decisions().assign(path="offline"))
    out = pd.concat(parts, ignore_index=True)
    out = out[["path", "policy", "batch", "group", "round", "slot", "k", "drafted"]]
    for col in ("batch", "group", "round", "slot", "k", "drafted"):
        out[col] = out[col].astype(np.int16)
    out["path"] = out["path"].astype("category")
    out["policy"] = out["policy"].astype("category")
    return out


if __name__ == "__main__":
    frame = decisions()
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(FIXTURE, index=False, compression="zstd")
    print(frame.groupby(["path", "batch"], observed=True).size().rename("rows").to_string())
    print(FIXTURE, FIXTURE.stat().st_size, "bytes")
