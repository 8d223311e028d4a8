"""Reader tables of section 6 (the Oracle), from the objects of :mod:`speclimits.oracle`. Functions that
return ``(shown, full)`` give the columns that fit the page and the complete frame for the download.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from speclimits import paper
from speclimits.arms import policy_label
from speclimits.book.present import Result, fmt_ci, fmt_num
from speclimits.oracle.report import policy_kind

#: The appendix reports no Oracle speedup, gain or best static K: what the "Paper" cell says.
NOT_IN_APPENDIX = "not in the appendix"
#: Rows beyond the paper (online rules): what the "Paper" cell says.
BEYOND_PAPER = "beyond the paper"
#: The policy table's share column: of the surrogate Oracle's gain, expected times (offline).
SURROGATE_SHARE = "Share of surrogate Oracle's gain (%)"

_COMPONENTS = {
    "draft": "draft, $T_D = a k + b$",
    "target_base": "target launch, $\\beta_0(k{+}1)$",
    "target_expert": "target experts, $\\alpha(k{+}1)\\,\\bar U$",
    "target_context": "target context, $c\\,L$",
}


def _third_party(key: str) -> str:
    tp = paper.THIRD_PARTY[key]
    return f"{tp['value']:g} ({tp['label']})"


def wrap(lines: str | Iterable[str], width: int = 76) -> str:
    """Printed lines wrapped to the page's code column (continuations indented): no scroll bar."""
    lines = [lines] if isinstance(lines, str) else list(lines)
    return "\n".join(textwrap.fill(line, width, subsequent_indent="  ", break_on_hyphens=False)
                     for text in lines for line in str(text).splitlines() or [""])


def relative_paths(lines: Iterable[str], cost_model: str | Path | None, trace: str | Path) -> list[str]:
    """``lines`` with the build machine's paths replaced by names a reader can resolve: the cost
    model as the site's ``_static/<file>`` (where the build copies it), the trace by its folder name."""
    swaps = [(str(cost_model), f"_static/{Path(cost_model).name}")] if cost_model else []
    swaps.append((str(trace), Path(trace).name))
    out = []
    for line in lines:
        for old, new in swaps:
            line = str(line).replace(old, new)
        out.append(line)
    return out


def _pct(x: Any, decimals: int = 1) -> str:
    return "–" if x is None or not np.isfinite(float(x)) else f"{100 * float(x):.{decimals}f}"


# -- the surrogate and the validation --------------------------------------------------------------


def calibration(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`speclimits.oracle.calibration.calibration_table` (index ``position``) for the page."""
    t = table.reset_index()
    return pd.DataFrame({
        "Draft step $i$": t["position"].astype(int),
        "States reaching it": t["states"].astype(int),
        "Mean $q$": t["mean_match_prob"],
        "Mean draft confidence": t["mean_draft_conf"],
        "Observed match rate": t["observed_match_rate"],
        "Brier score of $q$": t["brier"],
    })


def calibration_sentence(gap: tuple[float, float, float], used: str) -> str:
    g, lo, hi = gap
    return (f"observed match rate − mean q = {fmt_ci(g, lo, hi)} (95% interval over sequences); "
            f"the Oracle below uses {used}")


def validation(valid: pd.DataFrame, used: str) -> pd.DataFrame:
    """Relative error (%) of the static-K speedup per surrogate (``valid``:
    :func:`speclimits.oracle.validation.validation_by_surrogate`; ``used``, the Oracle's, first) beside the
    measured speedup; a last row gives each surrogate's largest absolute error and its K."""
    order = sorted(dict.fromkeys(valid["surrogate"]), key=lambda s: s != used)  # the used one first
    err = valid.pivot(index="K", columns="surrogate", values="rel_error")[order] * 100
    measured = valid.drop_duplicates("K").set_index("K")["measured_speedup"].reindex(err.index)
    out = pd.DataFrame({"K": [str(int(k)) for k in err.index], "Measured speedup": measured.to_numpy()})
    worst = {}
    for s in order:
        head = f"{s}{' (used)' if s == used else ''}: error (%)"
        out[head] = [f"{v:+.1f}" for v in err[s]]
        k = err[s].abs().idxmax()
        worst[head] = f"{abs(err.loc[k, s]):.1f} (K = {int(k)})"
    last = {"K": "largest abs. error", "Measured speedup": np.nan, **worst}
    return pd.concat([out, pd.DataFrame([last])], ignore_index=True)


def validation_sentence(valid: pd.DataFrame, used: str, tolerance: float = 0.05) -> str:
    """One line: the used surrogate's largest error against the tolerance."""
    err = valid.loc[valid["surrogate"] == used, "rel_error"].abs()
    worst = float(err.max())
    verdict = "within" if worst <= tolerance else "BEYOND"
    return (f"the surrogate used ({used}): largest |relative error| {worst:.1%} of the static-K speedups "
            f"({verdict} the {tolerance:.0%} tolerance)")


# -- the bound -------------------------------------------------------------------------------------


def by_kind(report) -> pd.DataFrame:
    """The bound by reference kind (:meth:`OracleReport.kind_table`)."""
    t = report.kind_table()
    return pd.DataFrame({
        "References": t["references"],
        "Sequences": t["sequences"].astype(int),
        "Oracle speedup (×)": t["oracle_speedup"].astype(float),
        "Best static K": t["best_static_k"].astype(int),
        "Best static speedup (×)": t["best_static_speedup"].astype(float),
        "Oracle gain over best static K (×)": t["gain_over_best_static"],
        "Accepted drafts per round": t["mean_accepted"],
    })


def _estimate(report, quantity: str, fallback: float | None) -> tuple:
    """``(estimate, lo, hi)`` of ``quantity`` from the report's bootstrap interval; ``(fallback, None, None)``
    without one."""
    iv = report.interval
    return (fallback, None, None) if iv is None else (iv.estimate.get(quantity), *iv.interval[quantity])


def _iv(report, quantity: str, fallback: float | None) -> str:
    est, lo, hi = _estimate(report, quantity, fallback)
    if report.interval is None:
        return fmt_ci(est, decimals=3)
    return "n/a" if est is None else fmt_ci(est, lo, hi)


def bound(report) -> pd.DataFrame:
    """The headline bound (greedy references where present) with its 95% cost-model bootstrap
    interval, beside the bound with plain autoregressive steps (k = 0) allowed, and the paper."""
    head = report.headline
    bd, k0 = head.bounds, report.with_k0
    kb = None if k0 is None else k0.bounds
    iv = report.interval

    def k0cell(value, decimals=3):
        return "n/a" if kb is None or value is None else fmt_num(value, decimals)

    best = str(bd.best_static_k)
    if iv is not None and np.isfinite(iv.best_static_k_share):
        best += f" ({iv.best_static_k_share:.0%} of replicates)"
    rows = [
        ("Oracle speedup over autoregressive (×)", _iv(report, "speedup", bd.speedup),
         k0cell(None if kb is None else kb.speedup), NOT_IN_APPENDIX),
        ("Oracle gain over the best static K (×)", _iv(report, "gain_over_best_static", bd.gain_over_best_static),
         k0cell(None if kb is None else kb.gain_over_best_static), NOT_IN_APPENDIX),
        ("Best static K (in hindsight)", best, "n/a" if kb is None else str(kb.best_static_k), NOT_IN_APPENDIX),
        ("Oracle time per token λ (ms)", _iv(report, "ms_per_token", head.ms_per_token),
         k0cell(None if k0 is None else k0.ms_per_token), "not reported"),
        ("Accepted drafts per round", fmt_num(bd.mean_accepted, 3),
         k0cell(None if kb is None else kb.mean_accepted), _third_party("mean_accepted_plateau")),
        ("States where the Oracle drafts nothing, $k^\\star = 0$ (%)", "0 (not allowed)",
         "n/a" if k0 is None else _pct((k0.k_star == 0).mean()), "–"),
    ]
    col = f"{report.headline_kind.capitalize()} references [95% CI]"
    return pd.DataFrame(rows, columns=["Quantity", col, "With $k = 0$ allowed", "Paper"])


def breakdown(bounds) -> pd.DataFrame:
    """Where the Oracle's expected time goes (``OracleBounds.breakdown_ms``)."""
    ms = pd.Series(bounds.breakdown_ms, dtype=float)
    return pd.DataFrame({"Component": [_COMPONENTS.get(k, k) for k in ms.index],
                         "Expected time (ms)": ms.to_numpy(),
                         "Share (%)": (100 * ms / ms.sum()).to_numpy()})


def k_star_shares(report) -> pd.DataFrame:
    """Share (%) of states at each k*, one column per reference kind."""
    shares = {kind: r.to_frame()["k_star"].value_counts(normalize=True) for kind, r in report.by_kind.items()}
    t = pd.DataFrame(shares).fillna(0.0).sort_index() * 100
    out = pd.DataFrame({"$k^\\star$": t.index.astype(int)})
    for kind in t.columns:
        out[f"{kind} (% of states)"] = t[kind].to_numpy()
    return out


def example_sequence(report) -> tuple[str, int]:
    """The greedy-headline sequence of median length (its id and N), the one the value chart shows."""
    per_seq = report.headline.per_sequence.sort_values(["n_tokens", "seq_id"], kind="stable")
    row = per_seq.iloc[len(per_seq) // 2]
    return str(row["seq_id"]), int(row["n_tokens"])


def k_max_sweep(sweeps: Mapping[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(shown, full)``: the bound as K_max grows (``sweep_k_max`` frames by reference kind); shown: the
    speedup, gain over the best static K and accepted drafts per round of each kind."""
    first = next(iter(sweeps.values()))
    shown = pd.DataFrame({"$K_{\\max}$": first["k_max"].astype(int).to_numpy()})
    full = []
    for kind, sw in sweeps.items():
        sw = sw.set_index("k_max").reindex(first["k_max"])
        shown[f"Speedup, {kind} (×)"] = sw["speedup"].astype(float).to_numpy()
        shown[f"Gain, {kind} (×)"] = sw["gain_over_best_static"].to_numpy()
        shown[f"Accepted, {kind}"] = sw["mean_accepted"].to_numpy()
        full.append(sw.reset_index().assign(references=kind))
    return shown, pd.concat(full, ignore_index=True)


# -- Delta Space -----------------------------------------------------------------------------------


def delta_line(line) -> pd.DataFrame:
    """The separating line of Delta Space (``DeltaLine``) against the prediction λ."""
    rows = [
        ("Points (state × extension $k \\to k{+}1$)", fmt_num(int(line.n_points)), ""),
        ("Share accepted by the Oracle (%)", _pct(line.n_accepted / line.n_points), ""),
        (f"Through-origin slope $s$ (ms/token) [95% CI, {line.n_boot} resamples]",
         fmt_ci(line.slope, *line.slope_ci), ""),
        ("Oracle time per token λ (ms)", fmt_num(line.lambda_, 3), "not reported"),
        ("Share separated correctly by $s$ (%)", _pct(line.accuracy),
         "rejected points form a strict linear boundary (no number given)"),
        ("Share separated correctly by λ (%)", _pct(line.accuracy_at_lambda), ""),
        ("… on the Oracle's boundary points, by $s$ (%)", _pct(line.boundary_accuracy), ""),
        ("… with the local value of a token (%)", _pct(line.local_accuracy), ""),
        ("Max-margin line: slope (ms/token)", fmt_num(line.svm_slope, 2), ""),
        ("Max-margin line: intercept (ms)", fmt_num(line.svm_intercept, 2), ""),
        ("Max-margin line: share correct (%)", _pct(line.svm_accuracy), ""),
    ]
    return pd.DataFrame(rows, columns=["Quantity", "Ours", "Paper"])


def delta_by_k(points: pd.DataFrame) -> pd.DataFrame:
    """Delta-Space points and the share the Oracle accepts, by extension k -> k+1."""
    g = points.groupby("k")["accepted"]
    t = pd.DataFrame({"points": g.size(), "share": g.mean()}).reset_index()
    return pd.DataFrame({"Extension": [f"{int(k)} → {int(k) + 1}" for k in t["k"]],
                         "Points": t["points"].astype(int), "Accepted by the Oracle (%)": 100 * t["share"]})


# -- the α = 0 ablation ----------------------------------------------------------------------------


def ablation(ab) -> pd.DataFrame:
    """Full Oracle against the α = 0 re-solve (``AlphaAblation``): times, lengths, shares."""
    f, z = ab.full.bounds, ab.zero.bounds
    changed = float((ab.full.k_star != ab.zero.k_star).mean())
    rows = [
        ("Oracle time, full cost (ms)", fmt_num(f.oracle_ms, 1)),
        ("Oracle time, α = 0 cost (ms)", fmt_num(z.oracle_ms, 1)),
        ("α = 0 policy priced at the full cost (ms)", fmt_num(ab.repriced_ms, 1)),
        ("Slowdown of the α = 0 policy (%)", _pct(ab.repriced_loss, 2)),
        ("Accepted drafts per round, full", fmt_num(f.mean_accepted, 3)),
        ("Accepted drafts per round, α = 0", fmt_num(z.mean_accepted, 3)),
        ("States whose $k^\\star$ changes (%)", _pct(changed)),
        ("States with $Q^0(k^\\star{+}1) - Q^0(k^\\star) < 0$ (%)", _pct(len(ab.cases) / ab.full.inputs.n_states, 2)),
    ]
    return pd.DataFrame(rows, columns=["Quantity", "Value"])


def moves(ab) -> pd.DataFrame:
    m = ab.moves
    return pd.DataFrame({"$k^\\star$ without α": m["direction"], "States": m["n_states"].astype(int),
                         "Share (%)": 100 * m["share"], "Mean change of $k^\\star$": m["mean_step"]})


def cases_by_boundary(ab) -> pd.DataFrame:
    """The cases where the expert term alone sets the boundary, by boundary k* -> k*+1."""
    s = ab.case_summary()
    return pd.DataFrame({
        "Boundary $k^\\star \\to k^\\star{+}1$": s["boundary"].str.replace("->", " → ", regex=False),
        "Cases": s["n_cases"].astype(int),
        "Share of states (%)": 100 * s["share_of_states"].astype(float),
        "Added-token match prob., median (min–max)": [
            f"{md:.3f} ({lo:.3f}–{hi:.3f})" for md, lo, hi in zip(s["match_prob_median"], s["match_prob_min"],
                                                                   s["match_prob_max"])],
        "Paper": np.where(s["boundary"].isin(paper.CASE_BOUNDARIES), "a C1–C4 boundary", ""),
    })


def cases_in_paper_range(ab) -> tuple[int, float]:
    """Number of cases and the share whose added-token match probability lies in the paper's range."""
    lo, hi = paper.CASE_MATCH_RANGE
    c = ab.cases
    return len(c), float(c["match_prob_added"].between(lo, hi).mean()) if len(c) else float("nan")


def top_cases(ab, n: int = 8) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``n`` cases with the highest added-token match probability: ``(shown, all cases)``."""
    c = ab.cases.sort_values("match_prob_added", ascending=False, kind="stable")
    top = c.head(n)
    shown = pd.DataFrame({
        "Sequence": top["seq_id"].astype(str), "Position $n$": top["pos"].astype(int),
        "$k^\\star$": top["k_star"].astype(int), "$k^\\star$ at α = 0": top["k_star_alpha0"].astype(int),
        "$Q^0(k^\\star{+}1) - Q^0(k^\\star)$ (ms)": top["q0_diff"].astype(float),
        "Added-token match prob.": top["match_prob_added"].astype(float),
    })
    return shown, c.reset_index(drop=True)


# -- online policies -------------------------------------------------------------------------------


def policy_setup(policies: Mapping[str, Any]) -> pd.DataFrame:
    """The train / held-out split and the tuned parameters, per reference kind."""
    return pd.DataFrame({
        "References": list(policies),
        "Sequences (train / held-out)": [f"{len(p.fit.train_seq_ids)} / {len(p.fit.test_seq_ids)}" for p in policies.values()],
        "Threshold τ": [fmt_num(p.fit.tau, sig=3) for p in policies.values()],
        "λ (ms/token)": [p.fit.lambda_ for p in policies.values()],
        "Best static K (train / held-out)": [f"{p.best_static_k_train} / {p.best_static_k_test}"
                                             for p in policies.values()],
    })


def policies(pc) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(shown, full)``: policies on the held-out sequences against the bound; shown: the best static K on
    the training half (what a deployment would pick) and in hindsight (the reference), every rule, the Oracle."""
    t = pc.table.copy()
    keep_static = {f"static K = {pc.best_static_k_train}", f"static K = {pc.best_static_k_test}"}
    kind = t["kind"] if "kind" in t.columns else t["policy"].map(policy_kind)
    t = t[(kind != "static") | t["policy"].isin(keep_static)]

    def name(p: str) -> str:
        marks = []
        if p == f"static K = {pc.best_static_k_train}":
            marks.append("best on training")
        if p == f"static K = {pc.best_static_k_test}":
            marks.append("best in hindsight")
        return p + (f" ({', '.join(marks)})" if marks else "")

    time = [f"{ms:.0f}" if se == 0 else f"{ms:.0f}\u00a0±\u00a0{se:.0f}" for ms, se in zip(t["time_ms"], t["time_se"])]
    shown = pd.DataFrame({
        "Policy": t["policy"].map(name), "Time (ms)": time,
        "Tokens per round": t["tokens_per_round"].astype(float),
        "Speedup (×)": t["speedup"].astype(float), "vs best static K (×)": t["vs_best_static"].astype(float),
        SURROGATE_SHARE: (100 * t["gain_captured"].astype(float)).round(1) + 0.0,  # no "-0.0"
    })
    return shown.reset_index(drop=True), pc.table


def shares(offline: pd.DataFrame) -> pd.DataFrame:
    """The two yardsticks side by side: section 8's offline table (:func:`speclimits.book.views.control.offline`)
    for the rules only, their replayed time and shares of the exact and surrogate Oracles' gains."""
    rules = offline[~offline["Policy"].astype(str).str.startswith("static K")]
    return rules.drop(columns=["Replay tokens per round", "Surrogate (ms/token)"]).reset_index(drop=True)


# -- key results -----------------------------------------------------------------------------------


def key_results(report, online: tuple[str, float] | None = None,
                exact: Mapping[str, Any] | None = None) -> list[Result]:
    """The section's headline rows: bound, gain, best static K, accepted drafts, and the best rule's share
    of each Oracle's gain held out: ``exact`` (:func:`speclimits.book.views.control.offline_best`, replayed)
    and ``online`` (:func:`speclimits.oracle.report.best_online`, under the surrogate), each row left out
    without its input."""
    bd, kind = report.headline.bounds, report.headline_kind
    sp = _estimate(report, "speedup", bd.speedup)
    rows = [
        Result.of(f"Oracle speedup over autoregressive ({kind})", *(sp if sp[0] is not None else ("n/a",)),
                  paper=NOT_IN_APPENDIX, ref="tbl-oracle-bound"),
        Result.of(f"Oracle gain over the best static K ({kind})",
                  *_estimate(report, "gain_over_best_static", bd.gain_over_best_static), paper=NOT_IN_APPENDIX,
                  ref="tbl-oracle-bound"),
        Result.of("best static K (in hindsight)", str(bd.best_static_k), paper=NOT_IN_APPENDIX,
                  ref="tbl-oracle-bound"),
        Result.of("Oracle's accepted drafts per round", bd.mean_accepted, decimals=2,
                  paper=_third_party("mean_accepted_plateau"), ref="tbl-oracle-bound"),
    ]
    if exact is not None:
        rows.append(Result.of(f"share of the exact Oracle's gain over the best static K, offline, replayed, held-out "
                              f"({policy_label(exact['policy'])})", exact["share"], exact["share_lo"],
                              exact["share_hi"], decimals=2, paper=BEYOND_PAPER, ref="tbl-oracle-shares"))
    if online is not None:
        name, gain = online
        rows.append(Result.of(f"share of the surrogate Oracle's gain over the best static K, offline, expected under "
                              f"the surrogate, held-out ({name})", gain, decimals=2, paper=BEYOND_PAPER,
                              ref="tbl-oracle-policies"))
    return rows
