"""Where the Oracle's gain goes: the gap between the exact Oracle and the engine, rung by rung (issue 57).

:func:`gap_decomposition` sets each rung of knowledge beside the best static K in hindsight, on the held-out
references of :func:`~speclimits.control.offline.offline_table`: the exact Oracle, the surrogate Oracle, the
engine's rule fed the *true* match probabilities (λ in hindsight, then as fitted), the rule reading the
acceptance model, reading the calibrated confidence (what the engine runs), and the engine (a ``speclimits
control bench`` result). The rule is the one of :mod:`speclimits.control.rules`: the true probabilities reach
it as the inputs' ``draft_conf`` with calibration off (``:raw-confidence``), the acceptance model through its
``:acceptance`` variant, so no second copy of the rule is written.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from speclimits.arms import parse_policy_name
from speclimits.bootstrap import draw_counts, percentile_interval
from speclimits.control.acceptance import acceptance_frame, fit_acceptance
from speclimits.control.fit import LAMBDA_GRID
from speclimits.control.offline import (batch_replay, draw_accept_lengths, gain_share, rollout, select,
                                        surrogate_evaluations)
from speclimits.control.rules import AcceptanceModel, PolicyFit
from speclimits.errors import SpeclimitsError
from speclimits.oracle import OracleSetup, evaluate_policy, solve
from speclimits.oracle.inputs import CostTable, OracleInputs

#: What each rung knows, and the loss named between it and the rung above (in the table's order).
RUNGS = (
    ("exact Oracle", "which drafts match (hindsight), plans across rounds", ""),
    ("surrogate Oracle", "each position's match probability, plans across rounds", "information"),
    ("best causal rule, true probabilities", "the true match probability of each drafted position, this round "
     "only; λ chosen in hindsight on these references", "planning horizon"),
    ("rule, true probabilities", "the true match probability of each drafted position, this round only; λ as "
     "fitted", "tuning of λ"),
    ("rule, acceptance model", "the acceptance model's match probability of each drafted position (the draft's "
     "confidence and what else the engine knows; fitted on the train references); λ as fitted",
     "prediction (acceptance model)"),
    ("rule, calibrated confidence", "the draft's calibrated confidence of each drafted position (what the engine "
     "runs)", "features (confidence only)"),
    ("engine", "as the rule above, in vLLM (measured)", "engine overhead"),
)
WORLDS = ("replay", "surrogate")


def true_probabilities(inputs: OracleInputs, sur: OracleInputs) -> OracleInputs:
    """``inputs`` with each state's draft confidences replaced by the surrogate's match probabilities."""
    return replace(inputs, draft_conf=sur.match_prob.astype(inputs.draft_conf.dtype))


def _batch1_times(fit: PolicyFit, setup: OracleSetup, raw: OracleInputs, sur: OracleInputs, rule: str,
                  lambdas: np.ndarray, n_rollouts: int, seed: int, acc_model: AcceptanceModel) -> dict[str, Any]:
    """Per world the per-sequence times (S,) of the Oracles, static K, the true-probability rule at every λ, the
    acceptance-model rule and the calibrated rule; the surrogate world's exact Oracle is the mean hindsight
    Oracle over ``n_rollouts`` seeded draws (the draws rules with memory are rolled out on)."""
    k_max, model, det = fit.k_max, fit.cost_model, setup.deterministic
    static = [f"static:{k}" for k in range(1, k_max + 1)]
    truth_name = rule + ":raw-confidence"
    t_raw = CostTable.build(raw, model, k_max)
    replay_accept = raw.accept_len[None, :].astype(np.int16)
    truth_raw, truth_sur = true_probabilities(raw, sur), true_probabilities(sur, sur)
    o_exact = solve(raw, model, k_max=k_max, deterministic=True)
    o_sur = solve(sur, model, k_max=k_max, deterministic=det)
    rep = {n: rollout(fit.make(n).bind(raw, t_raw), replay_accept)["time_ms"].to_numpy() for n in static + [rule]}
    rep["exact"] = o_exact.per_sequence["value_ms"].to_numpy()
    rep["surrogate"] = evaluate_policy(raw, model, actions=o_sur.k_star, k_max=k_max,
                                       deterministic=True)["time_ms"].to_numpy()
    exp = {n: ev["time_ms"].to_numpy() for n, (ev, _) in
           surrogate_evaluations(fit, static + [rule], sur, det, n_rollouts, seed).items()}
    exp["surrogate"] = o_sur.per_sequence["value_ms"].to_numpy()
    draws = sur.accept_len[None, :] if det else draw_accept_lengths(sur, k_max, n_rollouts, seed=seed)
    hind = np.array([solve(replace(sur, accept_len=d.astype(sur.accept_len.dtype)), model, k_max=k_max,
                           deterministic=True).per_sequence["value_ms"].to_numpy() for d in draws])
    exp["exact"] = hind.mean(axis=0)
    se = {"exact": float(hind.sum(axis=1).std(ddof=1) / np.sqrt(len(hind))) if len(hind) > 1 else 0.0}
    rep_truth, exp_truth, how = [], [], "exact"
    t_truth = CostTable.build(truth_raw, model, k_max)
    for lam in lambdas:
        f = replace(fit, lambda_=float(lam))
        rep_truth.append(rollout(f.make(truth_name).bind(truth_raw, t_truth), replay_accept)["time_ms"].to_numpy())
        ev, how = surrogate_evaluations(f, [truth_name], truth_sur, det, n_rollouts, seed)[truth_name]
        exp_truth.append(ev["time_ms"].to_numpy())
        if how == "rollouts":
            se.setdefault("lambda", []).append(float(np.sqrt((ev["time_se"] ** 2).sum())))
    acc_fit, acc_name = replace(fit, acceptance=acc_model), rule + ":acceptance"
    rep["acceptance"] = rollout(acc_fit.make(acc_name).bind(raw, t_raw), replay_accept)["time_ms"].to_numpy()
    ev, how_acc = surrogate_evaluations(acc_fit, [acc_name], sur, det, n_rollouts, seed)[acc_name]
    exp["acceptance"] = ev["time_ms"].to_numpy()
    se["acceptance"] = float(np.sqrt((ev["time_se"] ** 2).sum())) if how_acc == "rollouts" else 0.0
    return {"replay": (rep, np.array(rep_truth)), "surrogate": (exp, np.array(exp_truth)), "se": se, "how": how,
            "static": static}


def _engine_row(bench: dict[str, Any], rule: str) -> dict[str, Any]:
    """The engine's figures of arm ``rule`` in a benchmark result: the pooled ms/token, the paired speed ratio
    to the best stock static K (``vs_best_stock``, 95% interval over blocks)."""
    summary = pd.DataFrame(bench["summary"]).set_index("arm")
    if rule not in summary.index:
        raise SpeclimitsError(f"benchmark result (batch {bench['config']['batch']}) has no arm {rule!r}; arms: "
                              f"{', '.join(summary.index)}")
    r = summary.loc[rule]
    ms = r.get("ms_per_token_pooled", r["ms_per_token"])
    return {"ms": float(ms), "speed": float(r["vs_best_stock"]), "lo": float(r["vs_best_stock_lo"]),
            "hi": float(r["vs_best_stock_hi"]), "best_stock": bench["choice"]["best_stock"]}


def gap_decomposition(fit: PolicyFit, setup: OracleSetup, seq_ids: list[str] | None = None, rule: str = "delta-fixed",
                      bench: dict[str, Any] | None = None, n_states: int | None = None,
                      lambda_grid: Any = None, n_rollouts: int = 64, seed: int = 0, n_boot: int = 999,
                      acceptance: AcceptanceModel | None = None) -> pd.DataFrame:
    """The gap between the exact Oracle and the engine, one row per rung, on held-out greedy references.

    ``setup``: the greedy Oracle setup of the fit's trace, or of a trace of the benchmark's prompts (a benchmark
    on prompts the policy never saw). ``seq_ids``: default ``fit.test_seq_ids``, or with a benchmark its own
    prompts where they are others (at batch > 1 the benchmark's blocks). ``rule``: the Delta rule's key the engine ran. ``bench``: a ``speclimits control
    bench`` result for the engine's row; its batch sets the table's (none: batch 1, no engine row). ``n_states``:
    truncate each reference. ``lambda_grid``: the λ searched for the best causal rule (default the fit's λ and
    :data:`~speclimits.control.fit.LAMBDA_GRID` times ``lambda_oracle``). ``n_rollouts``, ``seed``: Monte Carlo
    draws of the match lengths under the surrogate; ``n_boot``: bootstrap replicates over references.
    ``acceptance``: default the fit's, else fitted here on its train references.

    The best causal rule is the look-ahead Delta rule fed each position's true match probability, over its one
    parameter λ chosen in hindsight per world. **Worlds**: ``replay`` (the recorded greedy outcomes, priced by
    the cost model) and ``surrogate`` (expected time when match lengths follow the surrogate; the exact Oracle
    there is the mean hindsight bound over ``n_rollouts`` draws, s.e. in ``ms_per_token_surrogate_se``). At
    batch > 1 the rules are batch-replayed with the run's profiled costs
    (:func:`~speclimits.control.offline.batch_replay`; no surrogate world) and the Oracles are per request.

    Returns one row per rung (:data:`RUNGS`): ``rung``, ``name``, ``knows``, ``loss``, ``batch``,
    ``lambda_W``, and per world W ``ms_per_token_W``, ``speed_W`` (best static K's time over the rung's),
    ``share_W`` (of the exact Oracle's gain, :func:`~speclimits.control.offline.gain_share`), their 95%
    bootstrap ``_lo`` / ``_hi``, ``share_lost_W``, ``best_static_k_W``, ``references``. The engine's row: the
    measured pooled ms/token, ``vs_best_stock`` as speed, share ``(1 - 1/r) / (1 - 1/G)`` (G the exact Oracle's
    gain on its references). ``attrs``: the world shown, references, surrogate, Oracle gains, acceptance model.
    """
    base, mods = parse_policy_name(rule) or (None, ())
    if base not in ("delta", "delta-fixed") or "raw-confidence" in mods or "acceptance" in mods:
        raise SpeclimitsError(f"gap_decomposition: rule must be a Delta rule reading the calibrated confidence "
                              f"(delta, delta-fixed and their variants), got {rule!r}")
    batch = 1 if bench is None else int(bench["config"]["batch"])
    acc_from = "the policy's"
    if acceptance is None and fit.acceptance is None:
        acceptance, acc_from = fit_acceptance(acceptance_frame(select(setup, list(fit.train_seq_ids))[0], fit.k_max),
                                              fit.k_max), "fitted here on the policy's train references"
    elif acceptance is None:
        acceptance = fit.acceptance
    else:
        acc_from = "given"
    lambdas = np.unique(np.concatenate([[fit.lambda_], fit.lambda_oracle * LAMBDA_GRID])) if lambda_grid is None \
        else np.unique(np.concatenate([[fit.lambda_], np.asarray(lambda_grid, dtype=float)]))
    if batch == 1:
        out = _batch1(fit, setup, _batch1_references(fit, bench) if seq_ids is None else list(seq_ids), rule, bench,
                      n_states, lambdas, n_rollouts, seed, n_boot, acceptance)
    else:
        out = _batch_b(fit, setup, rule, bench, lambdas, seed, n_boot, acceptance)
    out.attrs["acceptance"] = {"from": acc_from, **acceptance.to_dict()}
    return out


def bench_references(bench: dict[str, Any]) -> list[str]:
    """The references a benchmark ran whole (a prompt run on a part of its reference has none to replay)."""
    return [str(i) for i in bench["prompt_ids"] if bench.get("reference_parts_at", {}).get(i) is None]


def bench_blocks(bench: dict[str, Any], seq_ids: Any) -> tuple[list[list[int]], list[list[str]]]:
    """The blocks a benchmark measured, in block order, as indices into ``seq_ids`` (the replay's references) and
    as prompt ids; a block with a prompt outside ``seq_ids`` (run on part of its reference) is left out."""
    index = {str(s): i for i, s in enumerate(seq_ids)}
    blocks = {int(r["block"]): r["prompts"] for r in bench["blocks"]}  # the prompts each measured block ran
    names = [[str(bench["prompt_ids"][i]) for i in blocks[b]] for b in sorted(blocks)]
    names = [g for g in names if all(x in index for x in g)]
    return [[index[x] for x in g] for g in names], names


def _batch1_references(fit: PolicyFit, bench: dict[str, Any] | None) -> list[str]:
    """Batch 1's references: the policy's held-out split, or the benchmark's own prompts where it ran others (the
    benchmark on prompts the policy never saw, with a trace of them: the rungs then price what the engine ran)."""
    test = [str(s) for s in fit.test_seq_ids]
    if bench is None:
        return test
    ran = bench_references(bench)
    return test if set(ran) == set(test) else ran


def _frame(rows: list[dict[str, Any]], batch: int) -> pd.DataFrame:
    out = pd.DataFrame(rows)
    out.insert(0, "rung", np.arange(1, len(out) + 1))
    out.insert(1, "name", [r[0] for r in RUNGS])
    out.insert(2, "knows", [r[1] for r in RUNGS])
    out.insert(3, "loss", [r[2] for r in RUNGS])
    out.insert(4, "batch", batch)
    for w in WORLDS:
        if f"share_{w}" in out:
            out[f"share_lost_{w}"] = -out[f"share_{w}"].diff()
    return out


def _stats(t: np.ndarray, t_static: np.ndarray, t_exact: np.ndarray, w: np.ndarray, n_tok: float, world: str
           ) -> dict[str, float]:
    """ms/token, speed over the best static K and share of the exact Oracle's gain with their bootstrap intervals."""
    out = {f"ms_per_token_{world}": t.sum() / n_tok, f"speed_{world}": t_static.sum() / t.sum(),
           f"share_{world}": float(gain_share(t.sum(), t_static.sum(), t_exact.sum()))}
    bt, bs, be = w @ t, w @ t_static, w @ t_exact
    out[f"speed_{world}_lo"], out[f"speed_{world}_hi"] = percentile_interval(bs / bt)
    out[f"share_{world}_lo"], out[f"share_{world}_hi"] = percentile_interval(gain_share(bt, bs, be))
    return out


def _batch1(fit, setup, seq_ids, rule, bench, n_states, lambdas, n_rollouts, seed, n_boot, acc_model
            ) -> pd.DataFrame:
    raw, sur = select(setup, seq_ids, n_states)
    got = _batch1_times(fit, setup, raw, sur, rule, lambdas, n_rollouts, seed, acc_model)
    n_tok, w = float(raw.n_tokens.sum()), draw_counts(raw.n_sequences, n_boot, seed)
    refs = f"{raw.n_sequences} held-out references, {raw.n_states} states"
    rows = [{"references": refs} for _ in RUNGS]
    attrs: dict[str, Any] = {"shown": "replay", "references": [str(s) for s in raw.seq_ids],
                             "surrogate": setup.surrogate_label, "k_max": fit.k_max, "rule": rule,
                             "lambda_fitted": fit.lambda_, "lambda_grid": [float(x) for x in lambdas]}
    for world in WORLDS:
        times, truth = got[world]
        best = min(got["static"], key=lambda n: times[n].sum())
        t_static, t_exact = times[best], times["exact"]
        i_best = int(np.argmin(truth.sum(axis=1)))
        i_fit = int(np.flatnonzero(lambdas == fit.lambda_)[0])
        per_rung = [t_exact, times["surrogate"], truth[i_best], truth[i_fit], times["acceptance"], times[rule]]
        lam = [np.nan, np.nan, lambdas[i_best], fit.lambda_, fit.lambda_, fit.lambda_]
        for row, t, lm in zip(rows, per_rung, lam):
            row.update(_stats(t, t_static, t_exact, w, n_tok, world))
            row[f"lambda_{world}"] = lm
            row[f"best_static_k_{world}"] = int(best.split(":")[1])
        attrs[f"oracle_exact_gain_{world}"] = float(t_static.sum() / t_exact.sum())
        attrs[f"best_static_k_{world}"] = int(best.split(":")[1])
    se = got["se"]
    for i, row in enumerate(rows):
        row["ms_per_token_surrogate_se"] = se["exact"] / n_tok if i == 0 else \
            (se["lambda"][0] / n_tok if got["how"] == "rollouts" and i in (2, 3) else
             se["acceptance"] / n_tok if i == 4 else 0.0)
    attrs["surrogate_rule_evaluation"] = got["how"]
    rows[-1] = _engine(fit, setup, rule, bench)
    out = _frame(rows, 1)
    out.attrs = attrs
    return out


def _engine(fit: PolicyFit, setup: OracleSetup, rule: str, bench: dict[str, Any] | None, gain: float | None = None
            ) -> dict[str, Any]:
    """The engine's row: NaN without a benchmark; else its measured figures, its share against the exact
    Oracle's gain ``gain`` (default: the exact Oracle on the benchmark's references, priced as this table)."""
    if bench is None:
        return {"references": "no benchmark result given"}
    out: dict[str, Any] = {}
    e = _engine_row(bench, rule)
    if gain is None:  # the exact Oracle and the best static K replayed on the benchmark's own references
        raw, _ = select(setup, bench_references(bench), int(bench["config"]["max_tokens"]) - 1)
        o = solve(raw, fit.cost_model, k_max=fit.k_max, deterministic=True)
        gain = o.bounds.gain_over_best_static
    out.update({"ms_per_token_replay": e["ms"], "speed_replay": e["speed"], "speed_replay_lo": e["lo"],
                "speed_replay_hi": e["hi"]})
    for suffix, r in (("", e["speed"]), ("_lo", e["lo"]), ("_hi", e["hi"])):
        out[f"share_replay{suffix}"] = float(gain_share(1.0, r, r / gain))
    out["references"] = (f"measured: {len(bench['prompt_ids'])} held-out prompts x {bench['config']['max_tokens']} "
                         f"tokens, {bench['config']['blocks']} blocks, batch {bench['config']['batch']}; speed: "
                         f"vs_best_stock (paired, vs {e['best_stock']}, interval over blocks); share against the "
                         f"exact Oracle's gain {gain:.3f}x on those references")
    out["engine_oracle_exact_gain"] = float(gain)
    return out


def _batch_b(fit, setup, rule, bench, lambdas, seed, n_boot, acc_model) -> pd.DataFrame:
    """Batch > 1: the benchmark's blocks (the prompts each block ran, from its ``blocks`` records) replayed
    through the round driver, priced with its profiled costs."""
    from speclimits.control.profile import EngineProfile

    prof = EngineProfile.from_dict(bench["profile"])
    priced = prof.priced(fit)
    model = priced.cost_model
    raw, sur = select(setup, bench_references(bench), int(bench["config"]["max_tokens"]) - 1)
    groups = bench_blocks(bench, raw.seq_ids)[0]
    truth_raw = true_probabilities(raw, sur)
    static = [f"static:{k}" for k in range(1, fit.k_max + 1)]
    scale = priced.lambda_ / fit.lambda_  # λ in the profiled units, the grid scaled as the fit's λ is

    def per_group(f: PolicyFit, inputs: OracleInputs, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(G,) ms and tokens of each block replayed alone (a fresh policy per block, as batch_replay runs them)."""
        ms, tok = [], []
        for g in groups:
            r = batch_replay(f, inputs, [g], [name], prof)[name]
            n = float(raw.n_tokens[g].sum())
            ms.append(r["ms_per_token"] * n)
            tok.append(n)
        return np.array(ms), np.array(tok)

    rep = {n: per_group(priced, raw, n) for n in static + [rule]}
    acc = per_group(replace(priced, acceptance=acc_model), raw, rule + ":acceptance")
    truth = [per_group(replace(priced, lambda_=float(lam) * scale), truth_raw, rule + ":raw-confidence")
             for lam in lambdas]
    tok = rep[rule][1]
    best = min(static, key=lambda n: rep[n][0].sum())
    t_static = rep[best][0]
    o_exact = solve(raw, model, k_max=fit.k_max, deterministic=True)
    o_sur = solve(sur, model, k_max=fit.k_max, deterministic=setup.deterministic)
    g_exact = o_exact.bounds.gain_over_best_static
    g_sur_replay = o_exact.bounds.best_static_ms / float(evaluate_policy(
        raw, model, actions=o_sur.k_star, k_max=fit.k_max, deterministic=True)["time_ms"].sum())
    w = draw_counts(len(groups), n_boot, seed)
    i_best = int(np.argmin([t[0].sum() for t in truth]))
    i_fit = int(np.flatnonzero(lambdas == fit.lambda_)[0])
    refs_rule = (f"batch replay of the benchmark's {len(groups)} blocks of {prof.batch} ({raw.n_sequences} held-out "
                 f"references, {int(raw.n_tokens.max())} states each at most), profiled prices")
    refs_oracle = (f"per request, {raw.n_sequences} held-out references, profiled prices (the benchmark's oracle "
                   "bound; no batch Oracle here)")
    rows = []
    n_tok = float(raw.n_tokens.sum())
    for g, name in ((g_exact, "exact"), (g_sur_replay, "surrogate")):
        share = float(gain_share(1.0 / g, 1.0, 1.0 / g_exact))
        rows.append({"references": refs_oracle, "ms_per_token_replay": o_exact.bounds.best_static_ms / g / n_tok,
                     "speed_replay": g,
                     "share_replay": 1.0 if name == "exact" else share})
    for t, lm in ((truth[i_best][0], lambdas[i_best]), (truth[i_fit][0], fit.lambda_), (acc[0], fit.lambda_),
                  (rep[rule][0], fit.lambda_)):
        r = {"references": refs_rule, "ms_per_token_replay": t.sum() / tok.sum(), "speed_replay": t_static.sum() / t.sum(),
             "share_replay": float(gain_share(t.sum(), t_static.sum(), t_static.sum() / g_exact)),
             "lambda_replay": lm, "best_static_k_replay": int(best.split(":")[1])}
        bt, bs = w @ t, w @ t_static
        r["speed_replay_lo"], r["speed_replay_hi"] = percentile_interval(bs / bt)
        r["share_replay_lo"], r["share_replay_hi"] = percentile_interval(gain_share(bt, bs, bs / g_exact))
        rows.append(r)
    rows.append(_engine(fit, setup, rule, bench, gain=g_exact))
    out = _frame(rows, prof.batch)
    out.attrs = {"shown": "replay", "references": [str(s) for s in raw.seq_ids], "blocks": len(groups),
                 "surrogate": setup.surrogate_label, "k_max": fit.k_max, "rule": rule,
                 "lambda_fitted_profiled": priced.lambda_, "lambda_grid": [float(x) for x in lambdas],
                 "oracle_exact_gain_replay": float(g_exact), "best_static_k_replay": int(best.split(":")[1])}
    return out
