"""Turn the worker extension's step records into trace rows (numpy, vectorised per generation; no vLLM needed).

Conventions of the rows built here (documented once, used by :mod:`speclimits.tracing.sweep`; the
Arrow types they are written with: :mod:`speclimits.trace.schema`):

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
* **Steps** (batch traces, :func:`step_columns`): one row per engine step, all its requests
  together: ``n_tokens`` rows = the sum of the requests' ``m``; ``u_bar`` / ``e_max`` over
  *all* rows of the step (the extension counts them from its routing snapshot,
  ``u_layers_step``); ``context_total`` the sum of the requests' ``context_len``; the
  step's times, which each request's round rows repeat.
* Token rows put the routing on the **reading row** (the data contract of
  :mod:`speclimits.trace.reference_tokens`): ``experts`` of token ``pos`` is the routing of the
  forward row whose *input* is that token, i.e. the row that produced token ``pos + 1``;
  ``new_experts`` counts its experts absent from the row that read token ``pos − 1``. These are
  the rows a verification window's Ū is made of. A generation's last token has none (the row
  that reads it produced no emitted token): ``new_experts`` NaN, ``experts`` null. ``round`` and
  ``row`` name the pass that *produced* the token: the round that emitted ``e`` tokens produced
  them from its rows ``0..e-1`` (the last row on prefill rounds). ``reference_kind`` is
  ``"greedy"``: a sweep generation is the target's own output.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from speclimits.errors import SpeclimitsError
from speclimits.trace.schema import STRING_COLUMNS
from speclimits.tracing.capture import unique_per_layer
from speclimits.tracing.extension import external_request_id
from speclimits.vocabulary import GREEDY


def steps_by_request(records: Sequence[dict[str, Any]]) -> dict[str, list[tuple[dict[str, Any], dict[str, Any]]]]:
    """(step record, request entry) pairs of each request in ``records``, in step order, by external id."""
    out: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for rec in records:
        for r in rec["reqs"]:
            out.setdefault(external_request_id(r["req_id"]), []).append((rec, r))
    return out


#: Step columns built by :func:`step_columns`, in order (the ``steps`` table of a batch trace).
STEP_COLUMNS = ("batch_id", "b", "K", "step", "n_reqs", "n_decode", "n_tokens", "m_max", "u_bar", "e_max",
                "context_total", "t_target_ms", "t_draft_ms", "graph_bucket", "kv_usage", "phase", "n_drafted_next")


def step_columns(records: Sequence[dict[str, Any]], *, batch_id: int, b: int, K: int,
                 top_k: int) -> dict[str, np.ndarray]:
    """The :data:`STEP_COLUMNS` of one batch, one row per step record. ``u_bar`` / ``e_max`` from
    ``u_layers_step`` (``top_k`` without routing); ``phase`` ``prefill`` when no request had an output
    token before the step, ``decode`` when all had, else ``mixed``."""
    n = len(records)
    reqs = [rec["reqs"] for rec in records]
    n_reqs = _ints((len(rs) for rs in reqs), n)
    n_decode = _ints((sum(1 for r in rs if r["n_out_before"] >= 1) for rs in reqs), n)
    u_bar, e_max = _mean_max([rec.get("u_layers_step") for rec in records], top_k)
    cols = _record_columns(records, K) | {
        "batch_id": np.full(n, batch_id, dtype=np.int64),
        "b": np.full(n, b, dtype=np.int64),
        "K": np.full(n, K, dtype=np.int64),
        "n_reqs": n_reqs,
        "n_decode": n_decode,
        "n_tokens": _ints((sum(int(r["n_sched"]) for r in rs) for rs in reqs), n),
        "m_max": _ints((max((int(r["n_sched"]) for r in rs), default=0) for rs in reqs), n),
        "u_bar": u_bar,
        "e_max": e_max,
        "context_total": _ints((sum(int(r["context_len"]) for r in rs) for rs in reqs), n),
        "phase": np.where(n_decode == 0, "prefill", np.where(n_decode == n_reqs, "decode", "mixed")).astype(object),
        "n_drafted_next": _drafted((sum(int(r.get("n_drafted", 0)) for r in rs) for rs in reqs), n, K),
    }
    return {c: cols[c] for c in STEP_COLUMNS}


#: Round columns built here, in order (``category`` is added by the caller when known).
ROUND_COLUMNS = ("generation_id", "prompt_id", "K", "m", "round", "phase", "t_target_ms", "t_draft_ms", "u_bar",
                 "e_max", "context_len", "kv_usage", "graph_bucket", "n_draft", "n_accepted", "n_emitted",
                 "n_sampled", "prompt_len", "step", "n_drafted_next")
#: Token columns built here, in order. ``experts`` is a 2-D int16 array [tokens, n_layers * top_k]
#: (a row of -1: routing not recorded, written as null by :func:`speclimits.trace.io.columns_table`).
TOKEN_COLUMNS = ("seq_id", "pos", "token_id", "text", "new_experts", "experts", "generation_id", "K", "round", "row",
                 "context_len", "reference_kind")


def generation_columns(steps: list[tuple[dict[str, Any], dict[str, Any]]], *, output_ids: Sequence[int],
                       generation_id: int, prompt_id: str, K: int, top_k: int, decode: Any = None,
                       with_tokens: bool = True
                       ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None, dict[str, Any]]:
    """Round (and token) columns (:data:`ROUND_COLUMNS`, :data:`TOKEN_COLUMNS`) of one finished generation as
    numpy arrays, and a check summary: ``drafted``, ``accepted``, ``emitted``, ``output_len`` and
    ``tokens_match`` (the sampled ids, cut at the output length, equal vLLM's output).

    ``steps``: the generation's (step record, request entry) pairs (:func:`steps_by_request`); ``output_ids``:
    what vLLM returned; ``decode``: ``callable(token_id) -> str`` for ``text`` (``""`` when None).
    """
    if not steps:
        raise SpeclimitsError(f"generation {generation_id} (prompt {prompt_id}): the tracer saw no step "
                              "(was the extension installed?)")
    reqs = [r for _, r in steps]
    recs = [rec for rec, _ in steps]
    where = f"generation {generation_id} (prompt {prompt_id})"
    n_sampled, cum, emitted = _emitted_per_round(reqs, len(output_ids), where)
    prefill = _ints((r["n_out_before"] for r in reqs), len(reqs)) == 0
    u_bar, e_max = _experts_per_round(reqs, top_k)
    rounds = _round_columns(reqs, recs, n_sampled=n_sampled, emitted=emitted, prefill=prefill, u_bar=u_bar,
                            e_max=e_max, generation_id=generation_id, prompt_id=prompt_id, K=K)
    sampled = np.fromiter((t for r in reqs for t in r["sampled"]), dtype=np.int64, count=int(cum[-1]))
    check = _check_summary(rounds, sampled, output_ids)
    tokens = _token_columns(reqs, emitted, prefill, sampled, cum, generation_id=generation_id, prompt_id=prompt_id,
                            K=K, top_k=top_k, decode=decode) if with_tokens else None
    return rounds, tokens, check


def _ints(values: Any, n: int) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64, count=n)


def _floats(values: Any, n: int) -> np.ndarray:
    return np.fromiter(values, dtype=np.float64, count=n)


def _drafted(values: Any, n: int, K: int) -> np.ndarray:
    """``n_drafted_next`` (0 at K = 0)."""
    return _ints(values, n) if K > 0 else np.zeros(n, dtype=np.int64)


def _record_columns(recs: Sequence[dict[str, Any]], K: int) -> dict[str, np.ndarray]:
    """The columns a step record gives each of its rows (a step, or a request's round); ``t_draft_ms`` 0 at K = 0."""
    n = len(recs)
    return {
        "step": _ints((rec["step"] for rec in recs), n),
        "t_target_ms": _floats((rec["t_target_ms"] for rec in recs), n),
        "t_draft_ms": _floats((rec["t_draft_ms"] for rec in recs), n) if K > 0 else np.zeros(n),
        "graph_bucket": _ints((rec["graph_bucket"] for rec in recs), n),
        "kv_usage": _floats((rec["kv_usage"] for rec in recs), n),
    }


def _mean_max(counts: Sequence[Any], top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(u_bar, e_max): mean / max over layers of each pass's unique experts (``top_k`` without routing)."""
    u_bar = np.full(len(counts), float(top_k))
    e_max = np.full(len(counts), float(top_k))
    for i, u in enumerate(counts):
        if u is not None and len(u):
            u_bar[i] = float(np.mean(u))
            e_max[i] = float(np.max(u))
    return u_bar, e_max


def _emitted_per_round(reqs: list[dict[str, Any]], n_out: int, where: str
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n_sampled, cumulative sampled, emitted): a round emits what it sampled until vLLM's output length."""
    n_sampled = _ints((r["n_sampled"] for r in reqs), len(reqs))
    cum = np.cumsum(n_sampled)
    if cum[-1] < n_out:
        raise SpeclimitsError(f"{where}: the tracer saw {cum[-1]} sampled tokens but vLLM returned {n_out}")
    capped = np.minimum(cum, n_out)
    emitted = np.clip(capped - np.concatenate([[0], capped[:-1]]), 0, None).astype(np.int64)
    return n_sampled, cum, emitted


def _experts_per_round(reqs: list[dict[str, Any]], top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(u_bar, e_max) per round: from the worker's ``u_layers`` where it counted them (prefill rounds),
    else counted here, in one scatter, from the kept ``routing`` rows (decode rounds keep every row)."""
    counts = [r.get("u_layers") for r in reqs]
    missing = [i for i, r in enumerate(reqs) if "u_layers" not in r and len(r["routing"])]
    if missing:
        rows = np.concatenate([np.asarray(reqs[i]["routing"]) for i in missing])
        group = np.repeat(np.arange(len(missing)), [len(reqs[i]["routing"]) for i in missing])
        for i, u in zip(missing, unique_per_layer(rows, groups=group, n_groups=len(missing))):
            counts[i] = u
    return _mean_max(counts, top_k)


def _round_columns(reqs: list[dict[str, Any]], recs: list[dict[str, Any]], *, n_sampled: np.ndarray,
                   emitted: np.ndarray, prefill: np.ndarray, u_bar: np.ndarray, e_max: np.ndarray,
                   generation_id: int, prompt_id: str, K: int) -> dict[str, np.ndarray]:
    n = len(reqs)
    n_spec = _ints((r["n_spec"] for r in reqs), n)
    cols = _record_columns(recs, K) | {
        "generation_id": np.full(n, generation_id, dtype=np.int64),
        "prompt_id": np.full(n, prompt_id, dtype=object),
        "K": np.full(n, K, dtype=np.int64),
        "m": _ints((r["n_sched"] for r in reqs), n),
        "round": np.arange(n, dtype=np.int64),
        "phase": np.where(prefill, "prefill", "decode").astype(object),
        "u_bar": u_bar,
        "e_max": e_max,
        "context_len": _ints((r["context_len"] for r in reqs), n),
        "n_draft": n_spec,
        "n_accepted": np.where((n_spec > 0) & (n_sampled > 0), n_sampled - 1, 0),
        "n_emitted": emitted,
        "n_sampled": n_sampled,
        "prompt_len": _ints((r["n_prompt"] for r in reqs), n),
        "n_drafted_next": _drafted((r.get("n_drafted", 0) for r in reqs), n, K),
    }
    return {c: cols[c] for c in ROUND_COLUMNS}


def _check_summary(rounds: dict[str, np.ndarray], sampled: np.ndarray, output_ids: Sequence[int]) -> dict[str, Any]:
    n_out = len(output_ids)
    return {
        "drafted": int(rounds["n_draft"].sum()),
        "accepted": int(rounds["n_accepted"].sum()),
        "emitted": int(rounds["n_emitted"].sum()),
        "output_len": n_out,
        "tokens_match": bool(np.array_equal(sampled[:n_out], np.asarray(output_ids, dtype=np.int64))),
    }


def _token_columns(reqs: list[dict[str, Any]], emitted: np.ndarray, prefill: np.ndarray, sampled: np.ndarray,
                   cum: np.ndarray, *, generation_id: int, prompt_id: str, K: int, top_k: int,
                   decode: Any) -> dict[str, np.ndarray]:
    """Token columns (routing on the reading rows: the module docstring)."""
    produced: list[np.ndarray] = []
    round_idx: list[np.ndarray] = []
    row_idx: list[np.ndarray] = []
    token_at: list[np.ndarray] = []
    starts = np.concatenate([[0], cum[:-1]])
    for i, r in enumerate(reqs):
        e = int(emitted[i])
        if e == 0:
            continue
        routing = np.asarray(r["routing"])
        start = int(r["routing_from"])
        n_rows = int(r["n_sched"])
        # row of the pass that produced emitted token j: j on decode rounds, the last row on prefill
        rows = np.array([n_rows - 1]) if prefill[i] else np.arange(e)
        rows = rows[:e]
        produced.append(routing[rows - start])
        round_idx.append(np.full(len(rows), i, dtype=np.int64))
        row_idx.append(rows.astype(np.int64))
        token_at.append(starts[i] + np.arange(len(rows)))
    if not produced:
        return {c: np.zeros(0, dtype=object if c in STRING_COLUMNS else np.int64)
                for c in TOKEN_COLUMNS} | {"new_experts": np.zeros(0), "experts": np.zeros((0, 0), dtype=np.int16)}
    prod = np.concatenate(produced).astype(np.int16)  # [T, n_layers, top_k]: routing of each token's producing row
    t = len(prod)
    token_ids = sampled[np.concatenate(token_at)]
    # the row that reads token r produced token r + 1; the last token's reading row produced nothing emitted
    reading = np.concatenate([prod[1:], np.full((1, *prod.shape[1:]), -1, dtype=np.int16)])
    fresh = np.full(t, np.nan)
    # ids of token r's reading row (token r + 1's producing row) absent from token r - 1's reading row (token
    # r's producing row; for r = 0 the prefill's last row, which reads the last prompt token), averaged over layers
    cur, prev = prod[1:], prod[:-1]
    fresh[:-1] = (cur[:, :, :, None] != prev[:, :, None, :]).all(axis=3).sum(axis=2).mean(axis=1)
    pos = np.arange(t, dtype=np.int64)
    n_prompt = int(reqs[0]["n_prompt"])
    return {
        "seq_id": np.full(t, prompt_id, dtype=object),
        "pos": pos,
        "token_id": token_ids,
        "text": np.array([decode(int(x)) for x in token_ids] if decode is not None else [""] * t, dtype=object),
        "new_experts": fresh,
        "experts": reading.reshape(t, -1),
        "generation_id": np.full(t, generation_id, dtype=np.int64),
        "K": np.full(t, K, dtype=np.int64),
        "round": np.concatenate(round_idx),
        "row": np.concatenate(row_idx),
        "context_len": n_prompt + pos,
        "reference_kind": np.full(t, GREEDY, dtype=object),
    }
