"""The data contract of a trace directory, written down once.

A trace is a directory holding ``meta.json`` and Parquet tables:

``rounds.parquet``  one row per speculative round (prefill rounds included, marked by ``phase``)
``oracle.parquet``  one row per (reference sequence, position) for the Oracle (optional)
``tokens.parquet``  one row per reference token, for routing / linguistic studies (optional)
``steps.parquet``   one row per engine step of a batch trace (``speclimits trace --batch``; optional)

Each table may be a single Parquet file or a directory of Parquet part files with that
name (the tracing harness writes parts as it goes, so an interrupted sweep stays readable).
Files whose name starts with ``.`` or ``_`` inside such a directory are never read: half-written
temporary files are invisible to every reader.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 1

#: Values allowed in meta.json's ``source``.
SOURCES = ("vllm", "simulator")


@dataclass(frozen=True)
class Column:
    """One column of a table.

    ``kind`` is one of ``int``, ``float``, ``str``, ``list_float``, ``list_int``. A ``float``
    column with ``missing_ok`` may hold NaN (a value not measured), never an infinity.
    """

    name: str
    kind: str
    description: str
    required: bool = True
    missing_ok: bool = False


ROUNDS_COLUMNS: tuple[Column, ...] = (
    Column("generation_id", "int", "one generation (prompt x K configuration); cluster for SEs and CV"),
    Column("prompt_id", "str", "the prompt / question this generation answers"),
    Column("K", "int", "speculation budget of the run (draft tokens proposed per round)"),
    Column("m", "int", "rows in the verification pass: m = n_draft + 1 on decode rounds (= K + 1 when all K drafts are proposed)"),
    Column("round", "int", "0-based index of the round within its generation"),
    Column("phase", "str", "'prefill' or 'decode'"),
    Column("t_target_ms", "float", "target forward time T_T in ms"),
    Column("t_draft_ms", "float", "draft time T_D in ms (all K draft steps of the round)"),
    Column("u_bar", "float", "unique experts touched by the pass, averaged over MoE layers (Ū_r)"),
    Column("e_max", "float", "largest per-layer unique-expert count in the pass (E_max)"),
    Column("context_len", "int", "context length L (tokens already in the KV cache) at the round"),
    Column("kv_usage", "float", "KV-cache occupancy in [0, 1]"),
    Column("graph_bucket", "int", "graph bucket: padded token count of the pass"),
    Column("n_draft", "int", "draft tokens verified this round"),
    Column("n_accepted", "int", "draft tokens accepted"),
    Column("n_emitted", "int", "tokens emitted (accepted + bonus, fewer at the end)"),
    Column("category", "str", "prompt category, when the prompt set has one", required=False),
    Column("b", "int", "batch size of the run (batch traces only: requests submitted together)", required=False),
    Column("batch_id", "int", "the batch: generation id of its first generation (batch traces only)",
           required=False),
)

ORACLE_COLUMNS: tuple[Column, ...] = (
    Column("seq_id", "str", "reference sequence id"),
    Column("pos", "int", "state n: reference tokens already emitted, 0..N-1"),
    Column("context_len", "int", "context length L_n = P + n"),
    Column("match_prob", "list_float", "K_max floats: P(draft token i matches y_{n+i} | chain matched so far)"),
    Column("draft_conf", "list_float", "K_max floats: the draft's own top-1 probability at step i"),
    Column("accept_len", "int", "observed greedy match length of the draft chain, 0..K_max"),
    Column("u_bar_window", "list_float", "K_max+1 floats: Ū over the window [y_n, d_1..d_k], m = 1..K_max+1"),
    Column("category", "str", "prompt category, when known", required=False),
    Column("reference_kind", "str", "'greedy' (the target's own output), 'teacher-forced' (held-out text) or "
                                    "'sampled' (a sampled continuation of the target: traces at temperature > 0)",
           required=False),
    Column("accept_prob", "list_float",
           "K_max floats, sampled traces only (meta.json 'sampling', temperature T > 0), absent otherwise: the "
           "probability that vLLM's rejection sampler accepts draft token i given drafts 1..i-1 were accepted, "
           "p_target(d_i | prefix, d_1..d_{i-1}) at temperature T (top-p renormalised); 0 past the end of the "
           "reference", required=False),
    Column("prompt_id", "str", "the prompt whose reference this is (sampled traces: several references per prompt)",
           required=False),
    Column("sample", "int", "which sampled reference of the prompt (0: its sweep generation; sampled traces only)",
           required=False),
    Column("draft_conf2", "list_float", "K_max floats: the draft's second-highest probability at chain step i (traces "
                                        "made after issue 57's feature study; absent before)", required=False),
    Column("draft_entropy", "list_float", "K_max floats: the entropy in nats of the draft's distribution at chain "
                                          "step i (same traces)", required=False),
    Column("target_conf", "float", "the target's top-1 probability at the state's last verified position: the "
                                   "distribution its step emitting y_{n} was taken from, before the reference token "
                                   "was written in (same traces)", required=False),
)

TOKENS_COLUMNS: tuple[Column, ...] = (
    Column("seq_id", "str", "reference sequence id (matches oracle.parquet)"),
    Column("pos", "int", "position in the reference sequence"),
    Column("token_id", "int", "token id"),
    Column("text", "str", "decoded token text"),
    Column("new_experts", "float", "experts per layer of the pass that reads this token, absent from the pass that "
                                   "reads the previous one (NaN where not recorded: a generation's last token, a "
                                   "teacher-forced reference)",
           missing_ok=True),
    Column("reference_kind", "str", "'greedy' (the target's own output), 'teacher-forced' (held-out text) or "
                                    "'sampled' (a sampled continuation of the target)",
           required=False),
)

#: Phases of an engine step of a batch trace: every request prefilling, every one decoding, or both kinds.
STEP_PHASES = ("prefill", "decode", "mixed")

STEPS_COLUMNS: tuple[Column, ...] = (
    Column("batch_id", "int", "the batch (generation id of its first generation; rounds.batch_id)"),
    Column("b", "int", "batch size of the run"),
    Column("K", "int", "speculation budget of the run"),
    Column("step", "int", "engine step number (rounds.step); (batch_id, step) is unique"),
    Column("n_reqs", "int", "requests in the step"),
    Column("n_decode", "int", "requests verifying drafts or decoding (at least one output token before the step)"),
    Column("n_tokens", "int", "rows of the target forward: the sum of the requests' m"),
    Column("m_max", "int", "rows of the widest request of the step (prompt rows count for prefill requests)"),
    Column("u_bar", "float", "unique experts per MoE layer over ALL rows of the step, averaged over layers"),
    Column("e_max", "float", "largest per-layer unique-expert count over the step's rows"),
    Column("context_total", "int", "sum of the requests' context_len"),
    Column("t_target_ms", "float", "target forward time of the step in ms (shared by its requests)"),
    Column("t_draft_ms", "float", "drafter time of the step in ms (all requests' proposals)"),
    Column("graph_bucket", "int", "padded token count of the forward"),
    Column("kv_usage", "float", "KV-cache occupancy in [0, 1]"),
    Column("phase", "str", "'prefill' (all requests prefilling), 'decode' (all decoding) or 'mixed'"),
    Column("n_drafted_next", "int", "drafts proposed in the step, all requests"),
)

TABLES: dict[str, tuple[Column, ...]] = {
    "rounds": ROUNDS_COLUMNS,
    "oracle": ORACLE_COLUMNS,
    "tokens": TOKENS_COLUMNS,
    "steps": STEPS_COLUMNS,
}

#: Keys every meta.json must have.
META_REQUIRED = ("schema_version", "source", "models", "method", "hardware", "dtype", "k_values", "seed", "created")


_KINDS = {c.name: c.kind for columns in TABLES.values() for c in columns}
#: The harness writes these columns (any table) as ``large_string``, these as float64 and every other
#: one as int64 (:func:`speclimits.trace.io.columns_table`).
STRING_COLUMNS = tuple(name for name, kind in _KINDS.items() if kind == "str")
FLOAT_COLUMNS = tuple(name for name, kind in _KINDS.items() if kind == "float")
