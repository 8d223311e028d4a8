"""Turn the worker extension's step records into trace rows (pure Python; no vLLM needed).

Conventions of the rows built here (documented once, used by :mod:`speclimits.tracing.sweep`):

* A **round** is one engine step of a request: the target forward (prefill or verification
  of the drafts proposed in the previous step), rejection sampling, and the drafter call
  that proposes the next drafts. ``t_draft_ms`` is that drafter call (so the prefill row
  carries the draft's own prefill, and decode rows the K-step proposal after verifying).
* ``m`` is the rows of the pass (prompt rows on prefill rounds, 1 + drafts verified on
  decode rounds); ``n_draft`` the drafts verified; ``n_accepted`` = tokens sampled − 1
  when drafts were verified (vLLM's own count); ``n_emitted`` = tokens the request gained,
  after vLLM's stop checks (the last round can emit fewer than it sampled).
* ``u_bar`` / ``e_max``: mean / max over MoE layers of the unique experts routed over the
  request's rows of the pass, junk rows of rejected drafts included.
* Token rows use the **producing-row** convention: ``experts`` of token ``pos`` is the
  routing of the forward row that produced it (whose input is the previous token; the last
  prompt token for ``pos`` 0). The round that emitted ``e`` tokens produced them from its
  rows ``0..e-1``, so a fully accepted round's Ū is exactly Ū over its tokens. The routing
  of token ``pos`` *as an input* is the ``experts`` of ``pos + 1``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from speclimits.errors import SpeclimitsError
from speclimits.tracing.capture import new_experts
from speclimits.tracing.extension import _external


def request_steps(records: Sequence[dict[str, Any]], external_id: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(step record, request entry) pairs of one request, in step order."""
    out = []
    for rec in records:
        for r in rec["reqs"]:
            if _external(r["req_id"]) == external_id:
                out.append((rec, r))
    return out


def generation_tables(
    steps: list[tuple[dict[str, Any], dict[str, Any]]],
    *,
    output_ids: Sequence[int],
    generation_id: int,
    prompt_id: str,
    K: int,
    category: str | None = None,
    top_k: int,
    decode: Any = None,
    with_tokens: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame | None, dict[str, Any]]:
    """Rounds (and token) rows of one finished generation, plus a check summary.

    Parameters
    ----------
    steps : :func:`request_steps` of the generation's request.
    output_ids : the token ids vLLM returned for the generation.
    decode : ``callable(token_id) -> str`` for the ``text`` column (``""`` when None).

    Returns
    -------
    (rounds, tokens or None, check) where ``check`` holds ``drafted``, ``accepted``,
    ``emitted`` totals and ``tokens_match`` (the sampled ids, cut at the output length,
    equal vLLM's output).
    """
    if not steps:
        raise SpeclimitsError(f"generation {generation_id} (prompt {prompt_id}): the tracer saw no step "
                              "(was the extension installed?)")
    n_out = len(output_ids)
    emitted_raw = np.array([r["n_sampled"] for _, r in steps], dtype=np.int64)
    cum = np.cumsum(emitted_raw)
    emitted = np.clip(np.minimum(cum, n_out) - np.concatenate([[0], np.minimum(cum, n_out)[:-1]]), 0, None)
    if cum[-1] < n_out:
        raise SpeclimitsError(f"generation {generation_id} (prompt {prompt_id}): the tracer saw {cum[-1]} sampled "
                              f"tokens but vLLM returned {n_out}")
    rows: dict[str, list[Any]] = {c: [] for c in (
        "generation_id", "prompt_id", "K", "m", "round", "phase", "t_target_ms", "t_draft_ms", "u_bar", "e_max",
        "context_len", "kv_usage", "graph_bucket", "n_draft", "n_accepted", "n_emitted", "n_sampled", "prompt_len",
        "step", "n_drafted_next")}
    sampled_all: list[int] = []
    tok: dict[str, list[Any]] = {c: [] for c in ("seq_id", "pos", "token_id", "text", "new_experts", "experts",
                                                 "generation_id", "K", "round", "row", "context_len")}
    prev_experts: np.ndarray | None = None
    pos = 0
    for i, (rec, r) in enumerate(steps):
        prefill = r["n_out_before"] == 0
        u = np.asarray(r["u_layers"], dtype=float)
        rows["generation_id"].append(generation_id)
        rows["prompt_id"].append(prompt_id)
        rows["K"].append(K)
        rows["m"].append(int(r["n_sched"]))
        rows["round"].append(i)
        rows["phase"].append("prefill" if prefill else "decode")
        rows["t_target_ms"].append(float(rec["t_target_ms"]))
        rows["t_draft_ms"].append(float(rec["t_draft_ms"]) if K > 0 else 0.0)
        rows["u_bar"].append(float(u.mean()) if u.size else float(top_k))
        rows["e_max"].append(float(u.max()) if u.size else float(top_k))
        rows["context_len"].append(int(r["context_len"]))
        rows["kv_usage"].append(float(rec["kv_usage"]))
        rows["graph_bucket"].append(int(rec["graph_bucket"]))
        rows["n_draft"].append(int(r["n_spec"]))
        n_acc = int(r["n_sampled"]) - 1 if (r["n_spec"] > 0 and r["n_sampled"] > 0) else 0
        rows["n_accepted"].append(n_acc)
        rows["n_emitted"].append(int(emitted[i]))
        rows["n_sampled"].append(int(r["n_sampled"]))
        rows["prompt_len"].append(int(r["n_prompt"]))
        rows["step"].append(int(rec["step"]))
        rows["n_drafted_next"].append(int(r.get("n_drafted", 0)) if K > 0 else 0)
        sampled_all.extend(int(t) for t in r["sampled"])
        if not with_tokens or emitted[i] == 0:
            continue
        routing = np.asarray(r["routing"])
        start = int(r["routing_from"])
        n_rows = int(r["n_sched"])
        # row of the pass that produced emitted token j: j on decode rounds, the last row on prefill
        produce_rows = [n_rows - 1] if prefill else list(range(int(emitted[i])))
        if prefill and prev_experts is None and n_rows - 2 >= start:
            prev_experts = routing[n_rows - 2 - start]
        for j, row in enumerate(produce_rows[: int(emitted[i])]):
            cur = routing[row - start]
            token_id = int(r["sampled"][j])
            tok["seq_id"].append(prompt_id)
            tok["pos"].append(pos)
            tok["token_id"].append(token_id)
            tok["text"].append(decode(token_id) if decode is not None else "")
            tok["new_experts"].append(float(top_k) if prev_experts is None else new_experts(prev_experts, cur))
            tok["experts"].append(cur.reshape(-1).astype(np.int16))
            tok["generation_id"].append(generation_id)
            tok["K"].append(K)
            tok["round"].append(i)
            tok["row"].append(row)
            tok["context_len"].append(int(r["n_prompt"]) + pos)
            prev_experts = cur
            pos += 1
    rounds = pd.DataFrame(rows)
    for col in ("generation_id", "K", "m", "round", "context_len", "graph_bucket", "n_draft", "n_accepted",
                "n_emitted", "n_sampled", "prompt_len", "step", "n_drafted_next"):
        rounds[col] = rounds[col].astype(np.int64)
    if category is not None:
        rounds["category"] = category
    tokens = None
    if with_tokens:
        tokens = pd.DataFrame(tok)
        for col in ("pos", "token_id", "generation_id", "K", "round", "row", "context_len"):
            tokens[col] = tokens[col].astype(np.int64)
        if category is not None:
            tokens["category"] = category
    check = {
        "drafted": int(rounds["n_draft"].sum()),
        "accepted": int(rounds["n_accepted"].sum()),
        "emitted": int(rounds["n_emitted"].sum()),
        "output_len": n_out,
        "tokens_match": sampled_all[:n_out] == [int(t) for t in output_ids],
    }
    return rounds, tokens, check
