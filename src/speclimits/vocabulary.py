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
#: the target's own greedy output (the paper's setting) and held-out text, teacher-forced.
REFERENCE_KINDS = ("greedy", "teacher-forced")
GREEDY, TEACHER_FORCED = REFERENCE_KINDS
#: The reference kind every headline (the Oracle's bound, the linguistic study) is quoted on.
HEADLINE_KIND = GREEDY

#: Surrogate choices for the Oracle's transition probabilities; ``auto`` resolves to one of the
#: other three (:mod:`speclimits.oracle.prepare`).
SURROGATES = ("auto", "raw", "calibrated", "exact")
AUTO, RAW, CALIBRATED, EXACT = SURROGATES
