"""The vocabularies that more than one layer speaks, defined once.

* The linguistic vocabulary shared by the simulator (which plants contexts) and the labeller
  (which reads them back from token text): modes, context labels, fine labels, scripts. The
  methods page of the book defines each label; :mod:`speclimits.linguistic.labels` gives the
  rules that assign them.
* The Oracle's vocabulary shared by the trace schema, the Oracle, the command line and the book:
  reference kinds (and the one the headline is on) and surrogate choices.

This module imports nothing, so the command line can read it without paying for the analysis stack.
"""

from __future__ import annotations

from collections.abc import Iterable

# --- linguistic vocabulary -----------------------------------------------------------------------

#: Text modes. Tuples indexed by mode (e.g. a prompt category's mode weights) use this order.
MODES = ("code", "prose", "markup")
CODE, PROSE, MARKUP = MODES

#: Context labels, in the order tables list them.
CONTEXTS = ("code_format", "code_structure", "code_vocab", "prose_vocab", "prose_boundary", "markup",
            "mode_change", "script_change")
(CODE_FORMAT, CODE_STRUCTURE, CODE_VOCAB, PROSE_VOCAB, PROSE_BOUNDARY, MARKUP_CONTEXT, MODE_CHANGE,
 SCRIPT_CHANGE) = CONTEXTS
#: The mode each context label belongs to (None: a transition label that belongs to no single mode).
CONTEXT_MODES: dict[str, str | None] = {
    CODE_FORMAT: CODE, CODE_STRUCTURE: CODE, CODE_VOCAB: CODE, PROSE_VOCAB: PROSE, PROSE_BOUNDARY: PROSE,
    MARKUP_CONTEXT: MARKUP, MODE_CHANGE: None, SCRIPT_CHANGE: None,
}

#: Finer labels inside code and prose (``""`` = none).
FINE_LABELS = ("function_start", "control_flow", "comment", "word_continuation")
FUNCTION_START, CONTROL_FLOW, COMMENT, WORD_CONTINUATION = FINE_LABELS

#: Labels that mark a linguistic boundary.
BOUNDARY_LABELS = (PROSE_BOUNDARY, MODE_CHANGE, SCRIPT_CHANGE)

#: Scripts a token's letters can be in (``none``: no letters).
SCRIPTS = ("latin", "cyrillic", "none")
LATIN, CYRILLIC, NO_SCRIPT = SCRIPTS

# --- the Oracle's vocabulary ----------------------------------------------------------------------

#: Kinds of reference sequence an Oracle walks (``oracle.parquet``'s optional ``reference_kind``):
#: the target's own greedy output (the paper's setting), held-out text, teacher-forced, and sampled
#: continuations of the target (traces at temperature > 0, ``speclimits trace --temperature``).
REFERENCE_KINDS = ("greedy", "teacher-forced", "sampled")
GREEDY, TEACHER_FORCED, SAMPLED = REFERENCE_KINDS
#: The reference kind every headline (the Oracle's bound, the linguistic study) is quoted on.
HEADLINE_KIND = GREEDY
#: The kinds a headline may be quoted on, in order of preference: the target's own continuation, greedy
#: (the paper's setting) or, in a sampled trace, sampled; teacher-forced held-out text only where a trace
#: has nothing else.
HEADLINE_ORDER = (GREEDY, SAMPLED, TEACHER_FORCED)


def headline_kind(present: Iterable[str]) -> str:
    """The first kind of :data:`HEADLINE_ORDER` among ``present`` (the reference kinds a trace holds)."""
    have = set(present)
    return next(k for k in HEADLINE_ORDER if k in have)

#: Surrogate choices for the Oracle's transition probabilities; ``auto`` resolves to one of the
#: other three (:mod:`speclimits.oracle.prepare`).
SURROGATES = ("auto", "raw", "calibrated", "exact")
AUTO, RAW, CALIBRATED, EXACT = SURROGATES

# --- what every engine command runs in, and what the fit needs ------------------------------------

#: The model dtype of every command that builds an engine (``speclimits trace --dtype``,
#: ``speclimits control bench``): float32, so that references traced with the defaults are the
#: greedy outputs a benchmark with its defaults reproduces (vLLM's CPU build serves ``auto`` as
#: bfloat16, which parts from a float32 run's greedy output within tens of tokens).
DEFAULT_DTYPE = "float32"

#: The sparse-cell rule of the cost-model fit (:func:`speclimits.stats.costfit.pool_sparse_m`): an m
#: with fewer decode rounds, or rounds from fewer generations, than these is pooled with its neighbour.
MIN_CELL_ROUNDS = 20
MIN_CELL_GENERATIONS = 3

#: What ``speclimits fit`` needs of a sweep, in words (``fit --help``, the README, the methods page);
#: each table's own requirement is :data:`speclimits.stats.requirements.REQUIREMENTS`.
MINIMUM_SWEEP = (
    "The cost model (written by --out first, whatever else fails): Eq. 4 per m present needs rounds at some "
    "m >= 2 whose Ū varies; K = 0 rounds add m = 1, the plain-decoding cost (without them the Oracle reports no "
    f"autoregressive baseline); an m with fewer than {MIN_CELL_ROUNDS} rounds or rounds from fewer than "
    f"{MIN_CELL_GENERATIONS} generations (an n-gram or draft-model trace's larger m) is pooled with its "
    "neighbour, sharing one beta0 and alpha, and named in the output; an m missing between two present ones "
    "(a K grid with gaps) is interpolated linearly; the draft line needs >= 2 values of K > 0 (with one, "
    "it is taken through the origin). Each comparison table runs only where the trace identifies it and is "
    "otherwise skipped with one line saying why: per-K cross-validation needs >= 5 generations per K; the pooled "
    "model with γ·K, the comparison table and MAPE by K need >= 2 values of K > 0; leave-one-K-out and the "
    "linear and log-m forms need >= 3; the quadratic form >= 4; the hinge after m = 4 needs >= 2 values of "
    "K <= 2 and >= 2 of K >= 4; interpolation within a regime needs three consecutive K. The whole section, as "
    "in the paper, needs a contiguous sweep K = 1..5 or wider (the paper: 1..10) with >= 5 generations per K."
)
