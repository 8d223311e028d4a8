"""Reader tables of the linguistic section (7), from :mod:`speclimits.linguistic`, with the paper's
values in their own column.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from speclimits import paper
from speclimits import vocabulary as v
from speclimits.book.present import Result, ci_cells, fmt_ci, fmt_num

#: How a context label reads in a table (the charts keep the short names).
CONTEXT_NAMES = {
    v.CODE_FORMAT: "code: formatting", v.CODE_STRUCTURE: "code: structure", v.CODE_VOCAB: "code: vocabulary",
    v.PROSE_VOCAB: "prose: vocabulary", v.PROSE_BOUNDARY: "prose: boundary", v.MARKUP_CONTEXT: "markup",
    v.MODE_CHANGE: "mode change (code↔text)", v.SCRIPT_CHANGE: "script change",
    v.FUNCTION_START: "function start", v.CONTROL_FLOW: "control flow", v.COMMENT: "comment",
    v.WORD_CONTINUATION: "word continuation", "": "–",
}

#: How a routing contrast reads in a table.
CONTRAST_NAMES = {
    v.SCRIPT_CHANGE: "script change",
    "first_mismatch_reference": "first mismatch, reference",
    "first_mismatch_window": "first mismatch, window",
}

#: Keys of :func:`speclimits.linguistic.paper_comparison`'s rows, in its order (see ``_COMPARED``).
COMPARED_KEYS = ("long_code_format", "long_prose_vocab", "long_script_change", "k1_script_change",
                 "long_mode_change", "routing_script_change", "routing_first_mismatch")


def context_name(label: Any) -> str:
    return CONTEXT_NAMES.get(str(label), str(label).replace("_", " "))


def _ci(row: Any, est: str, lo: str, hi: str, decimals: int | None = None) -> str:
    return fmt_ci(row.get(est), row.get(lo), row.get(hi), decimals)


def _count(n: Any, m: Any) -> str:
    """``"1 427 (24)"``: decisions or events, with the responses they come from."""
    if n is None or (isinstance(n, float) and np.isnan(n)):
        return "–"
    return f"{fmt_num(int(n))} ({fmt_num(int(m))})" if m is not None and not pd.isna(m) else fmt_num(int(n))


def label_counts(labelled: pd.DataFrame) -> pd.DataFrame:
    """Tokens per context label, with their share of all tokens."""
    counts = labelled["label"].value_counts()
    return pd.DataFrame({"Context label": [context_name(c) for c in counts.index],
                         "Tokens": counts.to_numpy().astype(int),
                         "Share of tokens": counts.to_numpy() / counts.sum()})


def alignment(check: pd.DataFrame) -> pd.DataFrame:
    """The join check: share of matched first drafts equal to token row ``pos + 1`` and ``pos``."""
    return pd.DataFrame({
        "References": check["reference_kind"].to_numpy(),
        "States checked": check["n_states"].to_numpy().astype(int),
        "Row pos + 1 (convention)": check["share_row_pos_plus_1"].to_numpy(),
        "Row pos (other rule)": check["share_row_pos"].to_numpy(),
    })


def agreement(by_context: pd.DataFrame) -> pd.DataFrame:
    """The labeller against the planted contexts, per context."""
    return pd.DataFrame({
        "Planted context": [context_name(c) for c in by_context["context"]],
        "Planted": by_context["n_planted"].to_numpy().astype(int),
        "Labelled": by_context["n_labelled"].to_numpy().astype(int),
        "Precision": by_context["precision"].to_numpy(),
        "Recall": by_context["recall"].to_numpy(),
        "$F_1$": by_context["f1"].to_numpy(),
    })


def k_by_context(table: pd.DataFrame, first: str = "Context") -> pd.DataFrame:
    """Share of $k^\\star \\ge 4$ (ours [95% CI] beside the paper's) and of $k^\\star = 1$ per context of
    ``table`` (:func:`speclimits.linguistic.k_by_context` or a study's ``k_by_fine_label``)."""
    rows = []
    for r in table.to_dict("records"):
        ctx = str(r["context"])
        rows.append({
            first: context_name(ctx),
            "Decisions (responses)": _count(r["n_decisions"], r["n_responses"]),
            "$k^\\star \\ge 4$ [95% CI]": _ci(r, "share_long", "long_lo", "long_hi"),
            # as the appendix prints them: three decimals ("–" where it quotes none)
            "Paper $k^\\star \\ge 4$": _ci(paper.K_BY_CONTEXT.get(ctx, {}), "share_long", "long_lo", "long_hi", 3),
            "$k^\\star = 1$ [95% CI]": _ci(r, "share_k1", "k1_lo", "k1_hi"),
        })
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    if all(v == "–" for v in out["Paper $k^\\star \\ge 4$"]):  # finer labels: the paper has none
        out = out.drop(columns=["Paper $k^\\star \\ge 4$"])
    return out


def routing(rtab: pd.DataFrame, planted: Sequence[float] | None = None) -> pd.DataFrame:
    """New experts per layer before and at each event, the difference [95% CI] beside the paper's (the
    step-adjusted window contrast a row of its own); ``planted``: the planted difference per contrast."""
    rows = []
    for i, r in enumerate(rtab.to_dict("records")):
        name = CONTRAST_NAMES.get(r["contrast"], str(r["contrast"]))
        has = r["n_events"] and not pd.isna(r.get("before"))
        base = {
            "Contrast": name,
            "Events (responses)": _count(r["n_events"], r["n_responses"]),
            "Before → at": f"{r['before']:.2f} → {r['at']:.2f}" if has else "–",
            "Difference [95% CI]": _ci(r, "diff", "diff_lo", "diff_hi", 2 if has else None),
            "Paper: before → at, difference [95% CI]": (
                f"{r['paper_before']:.2f} → {r['paper_at']:.2f}" + ", "
                + _ci(r, "paper_diff", "paper_diff_lo", "paper_diff_hi", 2)
                if not pd.isna(r.get("paper_before", np.nan)) else "–"),
        }
        if planted is not None:
            p = planted[i] if i < len(planted) else np.nan
            base["Planted"] = "–" if pd.isna(p) else f"{p:+.2f}"
        rows.append(base)
        if not pd.isna(r.get("adjusted", np.nan)):
            adj = dict(base)
            adj.update({"Contrast": name + " (step-adjusted)", "Before → at": "–",
                        "Difference [95% CI]": _ci(r, "adjusted", "adjusted_lo", "adjusted_hi", 2)})
            if planted is not None:
                adj["Planted"] = "–"
            rows.append(adj)
    return pd.DataFrame(rows)


def _paper_decimals(quantity: str) -> int:
    """The appendix prints shares with three decimals, new experts with two."""
    return 2 if str(quantity).startswith("new experts") else 3


def comparison(cmp: pd.DataFrame) -> pd.DataFrame:
    """:func:`speclimits.linguistic.paper_comparison`: the appendix's quantities beside ours."""
    return pd.DataFrame({
        "Quantity": cmp["quantity"].str.replace(">=", "≥").str.replace("<->", "↔").to_numpy(),
        "Ours [95% CI]": ci_cells(cmp["ours"], cmp["lo"], cmp["hi"]),
        "Paper [95% CI]": [fmt_ci(e, lo, hi, _paper_decimals(q))
                           for q, e, lo, hi in zip(cmp["quantity"], cmp["paper"], cmp["paper_lo"], cmp["paper_hi"])],
        "n (responses)": [_count(n, m) if n else "–" for n, m in zip(cmp["n_decisions"], cmp["n_responses"])],
        "Verdict": cmp["verdict"].to_numpy(),
    })


def differing(cmp: pd.DataFrame) -> list[str]:
    """The quantities of a comparison whose interval does not overlap the paper's."""
    return cmp.loc[cmp["verdict"] == "differs", "quantity"].tolist()


def ablation_cases(cases: pd.DataFrame) -> pd.DataFrame:
    """The $\\alpha = 0$ cases: where zeroing the expert term moves $k^\\star$."""
    return pd.DataFrame({
        "Response": cases["seq_id"].astype(str).to_numpy(),
        "Position": cases["pos"].to_numpy().astype(int),
        "Boundary": cases["boundary"].astype(str).str.replace("->", "→").to_numpy(),
        "$k^\\star$ (α = 0)": [f"{int(a)} ({int(b)})" for a, b in zip(cases["k_star"], cases["k_star_alpha0"])],
        "Match prob. of added token": cases["match_prob_added"].to_numpy(),
        "$\\Delta Q^0$": cases["q0_diff"].to_numpy(),
        "$\\Delta Q$": cases["q_diff"].to_numpy(),
    })


def gallery(gal: pd.DataFrame) -> pd.DataFrame:
    """The stratified gallery: one row per decision."""
    fine = gal["label_fine"].fillna("").astype(str)
    label = [context_name(a) + (f" / {context_name(b)}" if b else "") for a, b in zip(gal["label"], fine)]
    return pd.DataFrame({
        "Group": gal["group"].astype(str).to_numpy(),
        "Case": [context_name(s) if s in CONTEXT_NAMES else s for s in gal["subtype"].astype(str)],
        "Response @ position": [f"{s} @ {int(p)}" for s, p in zip(gal["seq_id"], gal["pos"])],
        "Context label": label,
        "$k^\\star$ / $a_{\\mathrm{mode}}$ / accepted": [f"{int(k)} / {int(a)} / {int(n)}" for k, a, n in
                                                        zip(gal["k_star"], gal["a_mode"], gal["accept_len"])],
        "$p_1$": gal["match_prob_1"].to_numpy(),
    })


def key_rows(cmp: pd.DataFrame, refs: dict[str, str] | None = None) -> list[Result]:
    """The section's headline numbers beside the paper's (both with their 95% intervals), from
    :func:`speclimits.linguistic.paper_comparison` on the headline references."""
    refs = refs or {}
    if len(cmp) != len(COMPARED_KEYS):
        raise ValueError(f"expected the {len(COMPARED_KEYS)} rows of paper_comparison, got {len(cmp)}")
    by = dict(zip(COMPARED_KEYS, cmp.to_dict("records")))
    picks = (("long_code_format", "share of $k^\\star \\ge 4$ in code formatting", "k"),
             ("long_script_change", "share of $k^\\star \\ge 4$ at script changes", "k"),
             ("k1_script_change", "share of $k^\\star = 1$ at script changes", "k"),
             ("routing_script_change", "new experts per layer: script change − step before", "r"))
    rows = []
    for key, quantity, kind in picks:
        r = by[key]
        rows.append(Result.of(quantity, r["ours"], r["lo"], r["hi"],
                              paper=fmt_ci(r["paper"], r["paper_lo"], r["paper_hi"], _paper_decimals(r["quantity"])),
                              ref=refs.get(kind)))
    return rows
