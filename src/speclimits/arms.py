"""The arms' vocabulary: every way the package names a way of choosing K, and what each name means.

An arm's **key** is what commands, result files and tables store; :func:`arm` reads it into an
:class:`Arm` (``kind``, ``k``, ``label``):

=============  ========  ====================================================================
key            kind      what runs
=============  ========  ====================================================================
``plain``      plain     plain decoding (no drafter; k = 0)
``stock:K``    stock     stock vLLM with ``num_speculative_tokens = K`` (no extension)
``static:K``   static    static K inside the control extension; offline, the only static K
policy key     policy    a rule of :mod:`speclimits.control.rules` (:data:`POLICY_NAMES`, Delta variants)
=============  ========  ====================================================================

Offline, stock K and the extension's static K are one policy (``static:K``, :func:`offline_key`); tables label
a static K ``static K = K`` (:func:`static_label`; :func:`label_kind` reads it back). Imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The policies by name (what :meth:`PolicyFit.make` understands besides ``static:K`` and ``random:SEED``)
#: and the short label every table and figure gives them.
POLICY_LABELS = {"threshold": "confidence threshold", "delta": "Delta rule, running λ",
                 "delta-fixed": "Delta rule, fixed λ", "ema": "SGLang-style EMA", "cascade": "Cascade-style",
                 "throughput": "SGLang-style throughput-aware"}
POLICY_NAMES = tuple(POLICY_LABELS)
#: The variants of the Delta rules (``delta:MOD``, ``delta-fixed:MOD``, modifiers combined in any order, e.g.
#: ``delta:previous-u:raw-confidence``) and what each adds to the label. ``alone``: each request priced alone at
#: batch > 1 (the default decides once for the batch); the others are section 6's offline variants.
DELTA_VARIANTS = {"alone": "each request alone", "greedy-stop": "greedy stop",
                  "previous-u": "Ū of previous round", "raw-confidence": "raw confidence", "zero-k": "k = 0 allowed",
                  "acceptance": "acceptance model"}
#: The variants of the throughput-aware rule (``throughput:zero-k``): a round may plan k = 0, and when every request
#: of the batch does, the engine skips the drafter (:class:`~speclimits.control.rules.ThroughputAware`).
THROUGHPUT_VARIANTS = {"zero-k": "k = 0 skips the drafter"}
#: Variants the engine cannot run: it does not count the experts a round touched, so it has no previous Ū.
OFFLINE_ONLY = frozenset({"previous-u"})
#: Section 6's offline comparison: every policy and Delta variant it shows, after the static arms.
OFFLINE_POLICY_NAMES = ("threshold", "delta-fixed", "delta-fixed:greedy-stop", "delta", "delta:previous-u",
                        "delta:raw-confidence", "ema", "cascade", "throughput")


def parse_policy_name(name: str) -> tuple[str, tuple[str, ...]] | None:
    """``(base, modifiers)`` of a policy's key (``delta-fixed:greedy-stop`` -> ``("delta-fixed",
    ("greedy-stop",))``), None when it is not one (static arms, unknown names)."""
    base, *mods = str(name).split(":")
    if base not in POLICY_LABELS:
        return None
    known = DELTA_VARIANTS if base in ("delta", "delta-fixed") else THROUGHPUT_VARIANTS if base == "throughput" else {}
    if mods and (len(set(mods)) != len(mods) or any(m not in known for m in mods)):
        return None
    return base, tuple(mods)


def is_policy_name(name: str) -> bool:
    """A policy's key (one of :data:`POLICY_NAMES`, or a Delta rule with :data:`DELTA_VARIANTS`), not a static arm."""
    return parse_policy_name(name) is not None


def policy_label(name: str) -> str:
    """The short label of an arm's key (:attr:`Arm.label`; the key itself when it is none). Every table and
    figure, offline (sections 6 and 8) and measured, labels an arm with it."""
    return arm(name).label


PLAIN = "plain"
STOCK_PREFIX = "stock:"
STATIC_PREFIX = "static:"
#: how every table labels a static K (offline and in the extension)
STATIC_LABEL_PREFIX = "static K = "
ARM_KINDS = ("plain", "stock", "static", "policy")


@dataclass(frozen=True)
class Arm:
    """One arm: its ``key``, ``kind`` (one of :data:`ARM_KINDS`, or ``unknown``), ``k`` (plain: 0; stock
    and static: K; None for a policy) and ``label`` (tables and figures)."""

    key: str
    kind: str
    k: int | None
    label: str

    @property
    def offline(self) -> str | None:
        """The offline policy that predicts the arm (:func:`offline_key`)."""
        return offline_key(self.key)


def static_key(k: int) -> str:
    return f"{STATIC_PREFIX}{int(k)}"


def stock_key(k: int) -> str:
    return f"{STOCK_PREFIX}{int(k)}"


def static_label(k: int | str) -> str:
    return f"{STATIC_LABEL_PREFIX}{k}"


def arm(key: str) -> Arm:
    """The :class:`Arm` of a key; an unknown key is kind ``unknown`` and labelled by itself."""
    key = str(key)
    if key == PLAIN:
        return Arm(key, "plain", 0, "plain decoding")
    for prefix, kind in ((STOCK_PREFIX, "stock"), (STATIC_PREFIX, "static")):
        if key.startswith(prefix):
            k = key[len(prefix):]
            try:
                kk: int | None = int(k)
            except ValueError:
                kk = None
            return Arm(key, kind, kk, f"stock vLLM, K = {k}" if kind == "stock" else static_label(k))
    parsed = parse_policy_name(key)
    if parsed is None:
        return Arm(key, "unknown", None, key)
    base, mods = parsed
    labels = THROUGHPUT_VARIANTS if base == "throughput" else DELTA_VARIANTS
    return Arm(key, "policy", None, ", ".join([POLICY_LABELS[base], *(labels[m] for m in mods)]))


def offline_key(key: str) -> str | None:
    """The offline policy that predicts an arm: ``static:K`` for stock K and the extension's static K (one
    policy offline), the key itself for a policy, None for plain decoding."""
    a = arm(key)
    if a.kind == "plain":
        return None
    return static_key(a.k) if a.kind == "stock" and a.k is not None else a.key


def is_reference(key: str) -> bool:
    """Plain decoding or stock vLLM: the arms the paired ratios compare with (no extension)."""
    return arm(key).kind in ("plain", "stock")


def label_kind(label: str) -> str:
    """``static`` for a table's label of a static K, else ``online`` (the Oracle's row is the caller's)."""
    return "static" if str(label).startswith(STATIC_LABEL_PREFIX) else "online"
