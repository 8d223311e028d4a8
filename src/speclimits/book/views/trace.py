"""Reader tables of the tracing section (1), from :func:`speclimits.describe.per_k_summary` and
:func:`speclimits.describe.per_k_rates`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from speclimits.book.present import Result, fmt_ci, fmt_num

def per_k_table(summary: pd.DataFrame, rates: pd.DataFrame) -> pd.DataFrame:
    """Rounds, generations and the per-round token counts by K (intervals in one cell)."""
    s = summary.reset_index()
    r = rates.set_index("K").reindex(s["K"])

    def cell(name: str) -> list[str]:
        # a degenerate interval (K = 0: nothing drafted, one token emitted) is shown as the number alone
        return [fmt_ci(e) if lo == hi else fmt_ci(e, lo, hi)
                for e, lo, hi in zip(r[name], r[f"{name}_lo"], r[f"{name}_hi"])]

    return pd.DataFrame({
        "K": s["K"].astype(int),
        "Generations": s["generations"].astype(int),
        "Decode rounds": s["rounds"].astype(int),
        "Accepted / round": cell("accepted_per_round"),
        "Acceptance rate": cell("acceptance"),
        "Tokens/s (T+D)": s["tokens_per_s"].astype(float),
    })


def timing_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Mean target time, draft time, unique experts and context by K (plain means)."""
    s = summary.reset_index()
    return pd.DataFrame({
        "K": s["K"].astype(int),
        "$T_T$ (ms)": s["t_target_ms"].astype(float),
        "$T_D$ (ms)": s["t_draft_ms"].astype(float),
        "$\\bar U_r$ (experts/layer)": s["u_bar"].astype(float),
        "$L$ (tokens)": s["context_len"].astype(float),
    })


def key_results(rounds: pd.DataFrame, summary: pd.DataFrame, rates: pd.DataFrame) -> list[Result]:
    """The section's headline rows: what was traced, and what a round yields at the ends of the K range (the
    appendix quotes no per-K acceptance: no paper column; third-party figures are not the paper's)."""
    rk, gens = rates.set_index("K"), fmt_num(int(summary["generations"].sum()))
    drafted = [k for k in rk.index if k > 0 and np.isfinite(rk.loc[k, "acceptance"])]
    rows = [
        Result.of("decode rounds used by the fits", fmt_num(int(summary["rounds"].sum())), ref="tbl-tracing-per-k"),
        Result.of("generations", f"{gens} ({fmt_num(int(rounds['prompt_id'].nunique()))} prompts)"
                  if "prompt_id" in rounds else gens, ref="tbl-tracing-per-k"),
        Result.of("draft budgets K", f"{int(min(summary.index))}–{int(max(summary.index))}", ref="tbl-tracing-per-k"),
    ]
    if drafted:
        k1, kmax = min(drafted), max(drafted)
        rows += [
            Result.of(f"acceptance rate at K = {k1}", *rk.loc[k1, ["acceptance", "acceptance_lo", "acceptance_hi"]],
                      ref="fig-tracing-acceptance"),
            Result.of(f"mean accepted tokens per round at K = {kmax}",
                      *rk.loc[kmax, ["accepted_per_round", "accepted_per_round_lo", "accepted_per_round_hi"]],
                      ref="tbl-tracing-per-k"),
        ]
    return rows
