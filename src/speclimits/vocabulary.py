"""The linguistic vocabulary shared by the simulator (which plants contexts) and the labeller
(which reads them back from token text): modes, context labels, fine labels.

The methods page of the book defines each label; :mod:`speclimits.linguistic.labels` gives the
rules that assign them.
"""

from __future__ import annotations

#: Text modes. Tuples indexed by mode (e.g. a prompt category's mode weights) use this order.
MODES = ("code", "prose", "markup")

#: Context labels, in the order tables list them, with the mode each belongs to (None: a
#: transition label that belongs to no single mode).
CONTEXT_MODES: dict[str, str | None] = {
    "code_format": "code",
    "code_structure": "code",
    "code_vocab": "code",
    "prose_vocab": "prose",
    "prose_boundary": "prose",
    "markup": "markup",
    "mode_change": None,
    "script_change": None,
}
CONTEXTS = tuple(CONTEXT_MODES)

#: Finer labels inside code and prose (``""`` = none).
FINE_LABELS = ("function_start", "control_flow", "comment", "word_continuation")

#: Labels that mark a linguistic boundary.
BOUNDARY_LABELS = ("prose_boundary", "mode_change", "script_change")

#: Scripts a token's letters can be in (``none``: no letters).
SCRIPTS = ("latin", "cyrillic", "none")
