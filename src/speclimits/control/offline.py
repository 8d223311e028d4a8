"""The offline harness of the online policies: evaluation on Oracle inputs, and the prediction beside the bounds.

Every round is decided by the engine's own round driver, with its observation timing, and priced as the Oracle
prices it (the true window Ū) plus ``a`` ms per draft step drafted and dropped. Two harnesses: a **replay** of
the real greedy outcomes (what the engine should reproduce token for token) and the **surrogate** expected time
under the Oracle's match probabilities (exact policy evaluation for a rule without memory, else Monte Carlo
rollouts with common draws). Each has its own Oracle and best static K; a policy captures the share
:func:`gain_share` of the Oracle's gain. Sections 6 (:mod:`speclimits.control.compare`) and 8 share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from speclimits.bootstrap import draw_counts, percentile_interval
from speclimits.control.rules import Policy, PolicyFit
from speclimits.control.driver import RoundDriver
from speclimits.errors import SpeclimitsError
from speclimits.oracle import OracleSetup, solve
from speclimits.oracle.inputs import CostTable, OracleInputs
from speclimits.oracle.solver import evaluate_policy


def draw_accept_lengths(inputs: OracleInputs, k_max: int, n_rollouts: int, seed: int = 0) -> np.ndarray:
    """(n_rollouts, n_states) greedy match lengths drawn from ``match_prob`` (0..k_max)."""
    rng = np.random.default_rng(seed)
    out = np.empty((n_rollouts, inputs.n_states), dtype=np.int16)
    mp = inputs.match_prob[:, :k_max]
    for r in range(n_rollouts):
        hit = rng.random(mp.shape) < mp
        out[r] = np.where(hit.all(axis=1), k_max, np.argmin(hit, axis=1))
    return out


def state_actions(policy: Policy) -> tuple[np.ndarray, np.ndarray]:
    """A rule without memory at every state of the bound inputs, each state's round run alone through the
    round driver on its recorded confidences: ``(k (n,), extra draft ms (n,))`` (``a`` ms per dropped step)."""
    if not policy.markov:
        raise TypeError(f"{policy.name} has memory: evaluate it with rollouts")
    k_max, n = policy.k_max, policy.inputs.n_states
    conf = policy.inputs.draft_conf[:, :k_max].tolist()
    run = RoundDriver(policy).run_round
    keep, drafted = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    for i in range(n):
        k, drafted[i] = run(["state"], [conf[i]], k_max)
        keep[i] = k[0]
    return keep, (drafted - keep) * policy.model.a


def walk(driver: RoundDriver, rid: Any, seq: int, accept: np.ndarray, conf: list[list[float]], cost: np.ndarray,
         visit: Any = None) -> tuple[float, int]:
    """Walk sequence ``seq`` once as the engine runs request ``rid`` at batch 1: ``accept`` the match length per
    state, a round priced ``cost[state, k]`` plus ``a`` ms per dropped draft step, observed one round late with
    the window's Ū; ``visit(state, k)`` per round. Returns the time (ms) and rounds."""
    pol = driver.policy
    inp, k_max, a_ms = pol.inputs, pol.k_max, pol.model.a
    off, n = int(inp.offsets[seq]), int(inp.n_tokens[seq])
    pos, time_ms, rounds = 0, 0.0, 0
    while pos < n:
        row = off + pos
        (k,), drafted = driver.run_round([rid], [conf[row]], k_max)
        emitted = min(min(k, int(accept[row])) + 1, n - pos)
        c = cost[row, k] + (drafted - k) * a_ms
        driver.verified([rid], [k], [c], [pos], [inp.u_bar_window[row, k]])
        if visit is not None:
            visit(row, k)
        time_ms += c
        rounds += 1
        pos += emitted
    return time_ms, rounds


def rollout(policy: Policy, accept: np.ndarray) -> pd.DataFrame:
    """Walk every sequence of the bound ``policy`` once per row of ``accept`` (:func:`walk`, each sequence a
    request with its own memory). Per sequence: ``seq_id``, ``time_ms`` (mean over rollouts), ``time_se``
    (its standard error), ``rounds`` (mean) and ``n_rollouts``."""
    inp = policy.inputs
    cost, conf = policy.table.total(), inp.draft_conf[:, : policy.k_max].tolist()
    n_roll, n_seq = accept.shape[0], inp.n_sequences
    t, rounds = np.zeros((n_roll, n_seq)), np.zeros((n_roll, n_seq))
    driver = RoundDriver(policy)
    for r in range(n_roll):
        for s in range(n_seq):
            t[r, s], rounds[r, s] = walk(driver, (r, s), s, accept[r], conf, cost)
        driver.release([(r, s) for s in range(n_seq)])
    return pd.DataFrame({"seq_id": inp.seq_ids, "time_ms": t.mean(axis=0),
                         "time_se": t.std(axis=0, ddof=1) / np.sqrt(n_roll) if n_roll > 1 else np.nan,
                         "rounds": rounds.mean(axis=0), "n_rollouts": n_roll})


def evaluate_exact(policy: Policy, deterministic: bool = False) -> pd.DataFrame:
    """Exact expected time per sequence of a state-only policy (the Oracle's policy evaluation)."""
    k, extra = state_actions(policy)
    return evaluate_policy(policy.inputs, policy.table.model, actions=k, k_max=policy.k_max,
                           deterministic=deterministic, extra_cost=extra)


def gain_share(t_policy: Any, t_static: Any, t_oracle: Any) -> Any:
    """Share of the Oracle's gain over the best static K captured: ``(1 - T/T_s) / (1 - T_o/T_s)``."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return (1 - np.asarray(t_policy) / t_static) / (1 - np.asarray(t_oracle) / t_static)


def select(setup: OracleSetup, seq_ids: list[str], n_states: int | None = None) -> tuple[OracleInputs, OracleInputs]:
    """``(raw, surrogate)`` inputs of the given references (in that order), optionally truncated."""
    index = {str(s): i for i, s in enumerate(setup.raw_inputs.seq_ids)}
    missing = [s for s in seq_ids if s not in index]
    if missing:
        raise SpeclimitsError(f"{setup.trace.path}: no greedy Oracle data for references {missing[:5]}")
    idx = [index[s] for s in seq_ids]
    raw, sur = setup.raw_inputs.subset(idx), setup.inputs.subset(idx)
    if n_states is not None:
        raw, sur = raw.head(n_states), sur.head(n_states)
    return raw, sur


def surrogate_evaluations(fit: PolicyFit, names: Sequence[str], sur: OracleInputs, deterministic: bool,
                          n_rollouts: int, seed: int) -> dict[str, tuple[pd.DataFrame, str]]:
    """Per name: its per-sequence evaluation under the surrogate and how: ``exact`` (no memory), ``rollouts``
    (``n_rollouts`` seeded draws, shared by every rule) or ``replay`` (memory, deterministic surrogate)."""
    table = CostTable.build(sur, fit.cost_model, fit.k_max)
    draws = None
    out = {}
    for name in names:
        pol = fit.make(name).bind(sur, table)
        if pol.markov:
            out[name] = (evaluate_exact(pol, deterministic=deterministic), "exact")
        elif deterministic:
            out[name] = (rollout(pol, sur.accept_len[None, :].astype(np.int16)), "replay")
        else:
            if draws is None:
                draws = draw_accept_lengths(sur, fit.k_max, n_rollouts, seed=seed)
            out[name] = (rollout(pol, draws), "rollouts")
    return out


def offline_table(fit: PolicyFit, setup: OracleSetup, seq_ids: list[str], names: list[str],
                  n_states: int | None = None, n_rollouts: int = 64, seed: int = 0, n_boot: int = 999
                  ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The offline prediction table and the Oracle's bounds on ``seq_ids``: one row per name (``policy``,
    ``replay_ms_per_token``, ``replay_tokens_per_round``, ``surrogate_ms_per_token``, ``share_exact`` /
    ``share_surrogate`` against each harness's Oracle and best static K, 95% intervals ``*_lo``, ``*_hi``) and a
    dict of the bounds."""
    raw, sur = select(setup, seq_ids, n_states)
    t_raw, replay_accept = CostTable.build(raw, fit.cost_model, fit.k_max), raw.accept_len[None, :].astype(np.int16)
    rep, tpr = {}, {}
    for name in names:
        ev = rollout(fit.make(name).bind(raw, t_raw), replay_accept)
        rep[name], tpr[name] = ev["time_ms"].to_numpy(), float(raw.n_tokens.sum() / ev["rounds"].sum())
    exp = {name: ev["time_ms"].to_numpy()
           for name, (ev, _) in surrogate_evaluations(fit, names, sur, setup.deterministic, n_rollouts, seed).items()}
    o_exact = solve(raw, fit.cost_model, k_max=fit.k_max, deterministic=True)
    o_sur = solve(sur, fit.cost_model, k_max=fit.k_max, deterministic=setup.deterministic)
    n_tok = float(raw.n_tokens.sum())
    static = [n for n in names if n.startswith("static:")]
    if not static:
        raise SpeclimitsError("offline_table needs at least one static:K arm (the best static K is the reference)")
    best_rep = min(static, key=lambda n: rep[n].sum())
    best_sur = min(static, key=lambda n: exp[n].sum())
    w = draw_counts(raw.n_sequences, n_boot, seed)
    o_e_seq, o_s_seq = o_exact.per_sequence["value_ms"].to_numpy(), o_sur.per_sequence["value_ms"].to_numpy()
    rows = []
    for name in names:
        row = {"policy": name, "replay_ms_per_token": rep[name].sum() / n_tok, "replay_tokens_per_round": tpr[name],
               "surrogate_ms_per_token": exp[name].sum() / n_tok}
        for key, times, base, orc in (("share_exact", rep, best_rep, o_e_seq), ("share_surrogate", exp, best_sur,
                                                                                  o_s_seq)):
            row[key] = float(gain_share(times[name].sum(), times[base].sum(), orc.sum()))
            reps = gain_share(w @ times[name], w @ times[base], w @ orc)
            row[f"{key}_lo"], row[f"{key}_hi"] = percentile_interval(reps)
        rows.append(row)
    bounds = {
        "oracle_exact_ms_per_token": o_exact.bounds.oracle_ms / n_tok,
        "oracle_surrogate_ms_per_token": o_sur.bounds.oracle_ms / n_tok,
        "oracle_exact_gain_over_best_static": o_exact.bounds.gain_over_best_static,
        "oracle_surrogate_gain_over_best_static": o_sur.bounds.gain_over_best_static,
        "best_static_k_replay": int(best_rep.split(":")[1]), "best_static_k_surrogate": int(best_sur.split(":")[1]),
        "surrogate": setup.surrogate_label, "k_max": fit.k_max, "n_sequences": raw.n_sequences,
        "n_states": int(raw.n_states), "seq_ids": [str(s) for s in raw.seq_ids],
        "k_star_exact": o_exact.to_frame()[["seq_id", "pos", "k_star"]],
    }
    return pd.DataFrame(rows), bounds


def k_chosen_along(fit: PolicyFit, setup: OracleSetup, seq_id: str, names: list[str],
                   n_states: int | None = None) -> pd.DataFrame:
    """Along one greedy reference, replayed: ``pos`` of each round's state, the k each policy chose
    there (NaN where its rounds skipped the state) and the exact-greedy and surrogate Oracles' k*."""
    raw, sur = select(setup, [seq_id], n_states)
    out = pd.DataFrame({"pos": raw.pos})
    out["k_star_exact"] = solve(raw, fit.cost_model, k_max=fit.k_max, deterministic=True).to_frame()["k_star"].values
    out["k_star_surrogate"] = solve(sur, fit.cost_model, k_max=fit.k_max,
                                    deterministic=setup.deterministic).to_frame()["k_star"].values
    table = CostTable.build(raw, fit.cost_model, fit.k_max)
    for name in names:
        out[name] = walk_actions(fit.make(name).bind(raw, table), raw)
    return out


def walk_actions(pol: Any, raw: OracleInputs) -> np.ndarray:
    """(n,) the k a bound policy takes at each state visited by the replayed greedy walk of one sequence
    (NaN at states it skips)."""
    out = np.full(raw.n_states, np.nan)
    walk(RoundDriver(pol), "walk", 0, raw.accept_len, raw.draft_conf[:, :pol.k_max].tolist(), pol.table.total(),
         visit=out.__setitem__)
    return out


# -- Batch > 1: the engine's round driver on a batch of greedy references --------------------------


def batch_replay(fit: PolicyFit, raw: OracleInputs, groups: list[list[int]], names: list[str], profile: Any,
                 weigh: Any = None) -> dict[str, dict[str, float]]:
    """Replay the greedy references at batch > 1 as the engine runs them: per group (indices into ``raw``, one
    engine batch) every round goes through the round driver, a step costs
    :meth:`~speclimits.control.profile.EngineProfile.step_ms` and the price refresh is replayed; ``fit`` comes
    priced with the profile. Per name: ``ms_per_token``, ``tokens_per_round``, ``mean_k``, ``wasted_draft_steps``.
    ``weigh(left, done, rounds)``: per live request of a round (its tokens left, emitted and rounds so far, arrays)
    a factor on the rule's λ (:meth:`RoundDriver.begin`), for a rule that reads one."""
    from speclimits.control.profile import EnginePricing

    out: dict[str, dict[str, float]] = {}
    for name in names:
        total_ms = tokens = rounds = ks_sum = wasted = 0.0
        for group in groups:
            pol = fit.make(name)
            if weigh is not None and not getattr(pol, "reads_prices", False):
                raise SpeclimitsError(f"{name}: only a rule that puts a value on tokens (the Delta rule) can be weighed")
            if getattr(pol, "uses_pass_prices", False):
                pol.pass_ms = profile.pass_prices(pol.k_max)
                pol.outside_ms = profile.other_ms / profile.batch
            driver, pricing = RoundDriver(pol), EnginePricing()
            pricing.profile = profile
            pricing.price(pol, fit.u_bar_mean)
            rids = [f"{slot}" for slot in range(len(group))]
            seq = np.asarray(group, dtype=np.int64)
            n = raw.n_tokens[seq].astype(np.int64)
            pos = np.zeros(len(group), dtype=np.int64)
            played = np.zeros(len(group), dtype=np.int64)  # rounds per request
            while (pos < n).any():
                live = np.flatnonzero(pos < n)
                rows = raw.offsets[seq[live]] + pos[live]
                lr = [rids[i] for i in live]
                w = None if weigh is None else list(map(float, weigh(n[live] - pos[live], pos[live], played[live])))
                keep, drafted = driver.run_round(lr, raw.draft_conf[rows], pol.k_max, w)
                played[live] += 1
                k = np.asarray(keep, dtype=np.int64)
                emitted = np.minimum(np.minimum(k, raw.accept_len[rows]) + 1, n[live] - pos[live])
                step = profile.step_ms(float((k + 1).sum()), drafted)
                if pricing.refreshes(pol, len(live)):
                    pricing.refresh(pol, keep, len(live), step)
                driver.verified(lr, k.tolist(), [step / len(live)] * len(live), pos[live].tolist())
                pos[live] += emitted
                total_ms += step
                tokens += float(emitted.sum())
                rounds += len(live)
                ks_sum += float(k.sum())
                wasted += float((drafted - k).sum())
        out[name] = {"ms_per_token": total_ms / tokens, "tokens_per_round": tokens / rounds, "mean_k": ks_sum / rounds,
                     "wasted_draft_steps": wasted / rounds}
    return out
