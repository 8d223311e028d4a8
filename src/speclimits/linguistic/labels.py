"""A rule-based labeller of local text context, from token strings alone (methods page of the book).

Every continuation token gets one **context** label, the appendix's groups:

============== ==============================================================================
``code_format``    code: whitespace, indentation, brackets, operators, punctuation (no letters/digits)
``code_structure`` code: a keyword (``def``, ``return``, ``if``, ``for``, ``class``, ``import``, ...)
``code_vocab``     code: identifiers, literals, numbers, comment words
``prose_vocab``    prose: words (and word pieces)
``prose_boundary`` prose: sentence / clause punctuation, line and paragraph breaks, a capitalised
                   sentence start (after a boundary, or a common sentence-initial word)
``markup``         markup and formulas: LaTeX (``$``, ``\\frac``, ``^``, braces), HTML tags,
                   Markdown emphasis and code fences
``mode_change``    the first token of a new mode (code / prose / markup) in the response
``script_change``  the first token with letters whose script (Latin / Cyrillic) differs from the
                   script of the last token with letters before it
============== ==============================================================================

and one **fine** label or ``""`` (:func:`fine_labels`): ``function_start``, ``control_flow``,
``comment``, ``word_continuation``.

The mode (code, prose, markup) comes from per-token evidence (:func:`token_evidence`), Markdown
delimiters that override it (:func:`_forced_modes`) and a Viterbi pass with a cost per change
(:func:`segment_modes`), so that one odd token does not flip the mode; a change lands on the first
token that shows the new mode, or on the start of the word it continues. Precedence of the context
label: script change, then mode change, then the label within the mode; the first token of a
response is neither change. The labels describe the observed fragment and only compare groups.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from speclimits.errors import Problem, TraceFormatError
from speclimits import vocabulary as v
from speclimits.linguistic.align import token_table
from speclimits.vocabulary import CONTEXTS, MODES

#: The labeller's order of the modes (:data:`speclimits.vocabulary.MODES`) in its evidence
#: columns. It is also the tie-break priority of the segmentation (prose before code before
#: markup: a response with no evidence at all is prose), which is why it is not MODES' order.
EVIDENCE_MODES = (v.PROSE, v.CODE, v.MARKUP)
assert sorted(EVIDENCE_MODES) == sorted(MODES)

DEFINITION_KEYWORDS = frozenset({"def", "class", "function", "fn", "func", "struct", "lambda", "sub", "procedure",
                                 "interface", "enum", "trait", "impl", "typedef"})
CONTROL_KEYWORDS = frozenset({"if", "elif", "else", "for", "while", "do", "switch", "case", "break", "continue",
                              "return", "try", "except", "catch", "finally", "goto", "yield", "raise", "throw",
                              "with", "match", "default", "then", "fi", "done", "esac", "loop", "until", "unless"})
#: Keywords that are not English words: strong code evidence.
CODE_ONLY_KEYWORDS = frozenset({
    "def", "elif", "lambda", "self", "none", "true", "false", "nullptr", "null", "void", "int", "char", "const",
    "struct", "typedef", "printf", "fprintf", "sizeof", "malloc", "println", "func", "fn", "async", "await",
    "namespace", "std", "bool", "float", "double", "unsigned", "static", "extern", "nonlocal", "isinstance",
    "len", "str", "dict", "args", "kwargs", "init", "endif", "ifdef", "ifndef", "elseif", "esac", "fi", "var",
    "const", "enum", "impl", "pub", "usize", "println!", "typeof", "instanceof", "foreach", "def", "cls",
})
#: Keywords that are also ordinary English words, mostly seen as code: evidence for code and (less) for prose.
SHARED_KEYWORDS = frozenset({
    "if", "else", "for", "while", "return", "class", "import", "break", "continue", "try", "except", "catch",
    "finally", "switch", "function", "raise", "yield", "throw", "goto", "print", "pass", "include", "define",
})
#: Keywords that are first of all English words: as much evidence for prose as for code.
ENGLISH_KEYWORDS = frozenset({
    "in", "is", "and", "or", "not", "as", "with", "from", "this", "new", "do", "case", "match", "default",
    "select", "where", "let", "global", "public", "private", "protected", "then", "done", "until", "use",
})
STRUCTURE_KEYWORDS = CONTROL_KEYWORDS | DEFINITION_KEYWORDS | {
    "import", "from", "in", "not", "and", "or", "is", "as", "pass", "global", "nonlocal", "assert", "del",
    "include", "define", "public", "private", "protected", "static", "const", "var", "let", "new", "async", "await",
    "select", "where", "use", "export", "module", "package",
}
#: English and Russian function words: prose evidence.
PROSE_WORDS = frozenset({
    "the", "a", "an", "of", "to", "that", "this", "these", "those", "are", "was", "were", "be", "been", "by", "on",
    "it", "its", "which", "who", "we", "you", "they", "can", "will", "would", "should", "has", "have", "had",
    "at", "but", "than", "then", "also", "there", "their", "our", "your", "such", "more", "most", "very", "into",
    "about", "between", "each", "other", "some", "any", "all", "many", "may", "must", "one", "two", "when",
    "what", "how", "why", "because", "so", "only", "both", "same", "here", "does", "did", "not", "no", "yes",
    "и", "в", "на", "что", "это", "не", "с", "по", "для", "как", "из", "к", "а", "но", "или", "от", "у", "же",
})
#: Capitalised words that usually open a sentence.
SENTENCE_STARTERS = frozenset({
    "The", "A", "An", "In", "This", "These", "That", "It", "However", "Therefore", "Thus", "Moreover", "Also",
    "First", "Second", "Finally", "Then", "Note", "For", "If", "When", "We", "You", "Here", "There", "To", "As",
    "Однако", "Поэтому", "Также", "Итак", "Если", "Это", "В", "На", "Для", "Когда", "Кроме", "Сначала",
})
BOUNDARY_PUNCT = set(".,;:!?…—–()\"'«»")
COMMENT_MARKERS = ("#", "//", "/*")

_CYR = re.compile(r"[\u0400-\u04FF]")
_LAT = re.compile(r"[A-Za-z\u00C0-\u024F]")
_IDENT_MARK = re.compile(r"(^_|_[A-Za-z0-9]|[a-z][A-Z]|[A-Za-z]\d|\w\.\w|\w\(|\(\)|::|->)")
_OPERATOR = re.compile(r"(==|!=|<=|>=|\+=|-=|\*=|/=|=>|->|&&|\|\||::|\+\+|--|<<|>>|[=;{}\[\]|&%~@])")
_LATEX = re.compile(r"(\\[A-Za-z]+|\$|\^|_\{)")
_HTML = re.compile(r"(</?[A-Za-z][A-Za-z0-9]*|/>|&[a-z]+;)")


def script_of(text: str) -> str:
    """``"cyrillic"``, ``"latin"`` (the script with more letters in ``text``) or ``"none"`` (no letters)."""
    n_cyr, n_lat = len(_CYR.findall(text)), len(_LAT.findall(text))
    if n_cyr == 0 and n_lat == 0:
        return v.NO_SCRIPT
    return v.CYRILLIC if n_cyr >= n_lat else v.LATIN


def _word(text: str) -> str:
    return text.strip().strip(".,;:!?()[]{}\"'`")


def token_evidence(text: str) -> tuple[float, float, float]:
    """Evidence ``(prose, code, markup)`` for one token from its own string: identifiers with ``_`` or
    camelCase, operators, brackets and indentation point to code; English function words, capitalised
    and Cyrillic words to prose; ``$``, LaTeX commands, HTML tags and ``**`` to markup; words shared by
    code and prose (``if``, ``for``) score for both.

    Scores: 3 strong, 2 clear, 1 weak, 0 none. Bare whitespace, newlines, digits and the
    punctuation shared by code and prose (``, . :``) are neutral (0, 0, 0).
    """
    s = text.strip()
    word = _word(text)
    low = word.lower()
    if "```" in text or "~~~" in text:
        return (0.0, 0.0, 6.0)
    if s == "":
        # indentation (two or more spaces or a tab after a newline, or alone) is code layout
        if "\t" in text or re.search(r"(^|\n) {2,}$", text):
            return (0.0, 3.0, 0.0)
        return (0.0, 0.0, 0.0)
    if _HTML.search(s) or s.startswith("**") or s.endswith("**"):
        return (0.0, 0.0, 3.0)
    if _LATEX.search(s):
        return (0.0, 0.5, 3.0)
    if s in ("{", "}", "{}", "}{"):
        return (0.0, 1.0, 1.0)
    if _CYR.search(s):
        return (3.0, 0.0, 0.0)
    if low in CODE_ONLY_KEYWORDS and word == word.strip():
        return (0.0, 3.0, 0.0)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", word or "-") and _IDENT_MARK.search(word):
        return (0.0, 3.0, 0.0)
    if _IDENT_MARK.search(s) and not s.endswith(".") and any(c.isalnum() for c in s):
        return (0.0, 3.0, 0.0)
    if _OPERATOR.search(s) and not any(c.isalpha() for c in s):
        return (0.0, 3.0, 0.0) if re.search(r"(==|!=|=>|->|&&|\|\||::|\+\+|[=;\[\]])", s) else (0.0, 1.0, 0.0)
    if s in ("(", ")", "()", "):", "),", "(),", "'", '"'):
        return (0.0, 1.0, 0.0)
    if low in SHARED_KEYWORDS:
        return (1.0, 2.0, 0.0)
    if low in ENGLISH_KEYWORDS:
        return (1.5, 1.5, 0.0)
    if low in PROSE_WORDS:
        return (2.0, 0.0, 0.0)
    if word[:1].isupper() and word[1:].islower() and word.isalpha():
        return (2.0, 0.0, 0.0)
    if word.isalpha():  # a plain word: an identifier or prose, prose slightly more often
        return (1.25, 0.75, 0.0)
    return (0.0, 0.0, 0.0)


def segment_modes(evidence: np.ndarray, switch_cost: float = 2.5, forced: np.ndarray | None = None) -> np.ndarray:
    """Viterbi segmentation into modes.

    Parameters
    ----------
    evidence : (T, 3) scores per token for :data:`EVIDENCE_MODES` (prose, code, markup).
    switch_cost : penalty per mode change.
    forced : (T,) ints, -1 for free tokens or a mode index the token must take.

    Returns (T,) mode indices maximising ``sum evidence[t, mode[t]] - switch_cost * changes``;
    among equally good sequences, each change comes as late as possible; a response with no
    evidence at all is prose.
    """
    ev = np.asarray(evidence, dtype=float)
    n = len(ev)
    if n == 0:
        return np.zeros(0, np.int64)
    if forced is not None:
        big = 1e6
        f = np.asarray(forced)
        mask = f >= 0
        ev = ev.copy()
        ev[mask] -= big
        ev[mask, f[mask]] += big
    n_modes = ev.shape[1]
    score = ev[0].copy()
    back = np.zeros((n, n_modes), np.int64)
    for t in range(1, n):
        new = np.empty(n_modes)
        for s in range(n_modes):
            best, arg = score[s], s
            for r in range(n_modes):
                # ties go to the switch, so that a change comes as late as the evidence allows
                if r != s and score[r] - switch_cost >= best:
                    best, arg = score[r] - switch_cost, r
            new[s] = best + ev[t, s]
            back[t, s] = arg
        score = new
    out = np.empty(n, np.int64)
    out[-1] = int(np.argmax(score))  # first maximum: prose before code before markup
    for t in range(n - 1, 0, -1):
        out[t - 1] = back[t, out[t]]
    return out


def _forced_modes(texts: Sequence[str], max_inline: int = 40) -> np.ndarray:
    """(T,) forced modes from Markdown delimiters, -1 where the evidence decides.

    Fenced blocks (three backticks or tildes): the fence tokens are markup, the tokens strictly
    inside are code. Outside fences, inline math between ``$`` signs is markup (the ``$`` tokens
    included) and inline code between single backticks is code; an inline span also ends at a
    line break, at a prose word (evidence for prose >= 2) or after ``max_inline`` tokens, so an
    unpaired delimiter cannot take over the text.
    """
    markup, code = EVIDENCE_MODES.index(v.MARKUP), EVIDENCE_MODES.index(v.CODE)
    forced = np.full(len(texts), -1, np.int64)
    fenced = False
    span, span_len = None, 0  # None, "math" or "code"
    for i, t in enumerate(texts):
        if "```" in t or "~~~" in t:
            forced[i] = markup
            fenced, span = not fenced, None
            continue
        if fenced:
            forced[i] = code
            continue
        if "\n" in t or span_len >= max_inline or (span is not None and token_evidence(t)[0] >= 2):
            span, span_len = None, 0  # a line break, a long span or a prose word ends an inline span
        n_dollar, n_tick = t.count("$") - t.count("\\$"), t.count("`")
        if span is not None:
            forced[i] = markup if span == "math" else code
            span_len += 1
            if (span == "math" and n_dollar % 2) or (span == "code" and n_tick % 2):
                span, span_len = None, 0
        elif n_dollar % 2:
            forced[i], span, span_len = markup, "math", 0
        elif n_tick % 2:
            forced[i], span, span_len = code, "code", 0
        elif n_dollar:
            forced[i] = markup  # "$$" or a closed "$x$" inside one token
    return forced


def _is_boundary_text(text: str) -> bool:
    s = text.strip()
    if "\n" in text:
        return True
    return s != "" and all(c in BOUNDARY_PUNCT for c in s)


def _glued(prev: str, cur: str) -> bool:
    """True when ``cur`` continues the word ``prev`` ends with (no space between)."""
    if not prev or not cur:
        return False
    a, b = prev[-1], cur[0]
    return (a.isalnum() or a == "_") and (b.isalnum() or b == "_")


def token_modes(texts: Sequence[str], switch_cost: float = 2.5) -> np.ndarray:
    """(T,) mode name of each token of one response: token evidence, Markdown delimiters and the
    Viterbi segmentation (:func:`segment_modes`); a change inside a glued word moves back to the
    word's start, so a word is never split across modes."""
    n = len(texts)
    ev = np.array([token_evidence(t) for t in texts], dtype=float).reshape(n, 3)
    modes = segment_modes(ev, switch_cost=switch_cost, forced=_forced_modes(texts))
    for t in range(1, n):
        if modes[t] != modes[t - 1] and _glued(texts[t - 1], texts[t]):
            j = t - 1
            while j > 0 and _glued(texts[j - 1], texts[j]):
                j -= 1
            modes[j:t] = modes[t]
    return np.array(EVIDENCE_MODES, dtype=object)[modes] if n else np.zeros(0, object)


def _within_mode_context(text: str, mode: str, first: bool, prev_visible: str) -> str:
    """The context label of a token that starts no transition: by its mode and its own string."""
    s = text.strip()
    word = _word(text)
    if mode == v.MARKUP:
        return v.MARKUP_CONTEXT
    if mode == v.CODE:
        if word.lower() in STRUCTURE_KEYWORDS and word == s.strip(".,:;()"):
            return v.CODE_STRUCTURE
        return v.CODE_FORMAT if not any(c.isalnum() for c in text) else v.CODE_VOCAB
    starts_sentence = word[:1].isupper() and (word in SENTENCE_STARTERS or first or _is_boundary_text(prev_visible))
    return v.PROSE_BOUNDARY if (_is_boundary_text(text) or starts_sentence) else v.PROSE_VOCAB


def context_labels(texts: Sequence[str], modes: Sequence[str], scripts: Sequence[str]) -> list[str]:
    """(T,) context label of each token, in order of precedence: **script change** (the first
    token with letters whose script differs from the last token with letters), **mode change**
    (the first token of a new mode), then the label within the mode."""
    labels: list[str] = []
    last_script = None
    prev_visible = ""  # the last token that is not pure spaces
    for i, text in enumerate(texts):
        script = scripts[i]
        if i > 0 and script != v.NO_SCRIPT and last_script is not None and script != last_script:
            labels.append(v.SCRIPT_CHANGE)
        elif i > 0 and modes[i] != modes[i - 1]:
            labels.append(v.MODE_CHANGE)
        else:
            labels.append(_within_mode_context(text, modes[i], i == 0, prev_visible))
        if script != v.NO_SCRIPT:
            last_script = script
        if text.strip(" ") != "":
            prev_visible = text
    return labels


def fine_labels(texts: Sequence[str], modes: Sequence[str]) -> list[str]:
    """(T,) fine label of each token (one of :data:`~speclimits.vocabulary.FINE_LABELS` or ``""``).

    A comment runs from its marker to the end of the line (``/*`` to ``*/``); a definition
    keyword and the identifier after it start a function; control keywords are control flow;
    a token glued to the previous one continues a word.
    """
    out: list[str] = []
    comment = None  # None, "line" or "block"
    after_definition = False
    for i, text in enumerate(texts):
        mode, s = modes[i], text.strip()
        word = _word(text)
        low = word.lower()
        if comment == "line" and "\n" in text:
            comment = None
        if mode != v.CODE:
            comment = None
        elif comment is None and s.startswith(COMMENT_MARKERS) and not s.startswith(("#include", "#define", "#if")):
            comment = "block" if s.startswith("/*") else "line"
        if comment is not None:
            f = v.COMMENT
        elif mode == v.CODE and low in DEFINITION_KEYWORDS:
            f = v.FUNCTION_START
        elif mode == v.CODE and after_definition and re.fullmatch(r"[A-Za-z_]\w*", s or "-"):
            f = v.FUNCTION_START
        elif mode == v.CODE and low in CONTROL_KEYWORDS and word == s.strip(".,:;()"):
            f = v.CONTROL_FLOW
        elif i > 0 and _glued(texts[i - 1], text):
            f = v.WORD_CONTINUATION
        else:
            f = ""
        out.append(f)
        if comment == "block" and "*/" in text:
            comment = None
        if s:
            after_definition = mode == v.CODE and low in DEFINITION_KEYWORDS
    return out


def label_tokens(texts: Sequence[str], switch_cost: float = 2.5) -> pd.DataFrame:
    """Label the tokens of ONE response, in order.

    Parameters
    ----------
    texts : the decoded token strings (leading spaces kept; ``None`` is read as ``""``).
    switch_cost : the Viterbi penalty per mode change (:func:`segment_modes`).

    Returns one row per token: ``text``, ``script``, ``mode``, ``context`` and ``fine``.
    """
    texts = [unicodedata.normalize("NFC", "" if t is None else str(t)) for t in texts]
    modes = token_modes(texts, switch_cost)
    scripts = [script_of(t) for t in texts]
    return pd.DataFrame({"text": texts, "script": scripts, "mode": list(modes),
                         "context": context_labels(texts, modes, scripts), "fine": fine_labels(texts, modes)})


def label_trace_tokens(tokens: pd.DataFrame, switch_cost: float = 2.5, origin: str = "tokens.parquet") -> pd.DataFrame:
    """Label every response of a trace's ``tokens`` table (needs ``seq_id``, ``pos``, ``text``).

    Returns the table sorted by ``seq_id``, ``pos`` with four columns added: ``label`` (the
    context), ``label_mode``, ``label_fine`` and ``label_script``. Planted columns of a simulated
    trace (``context``, ``script``) are kept as they are, for :func:`label_agreement`.
    """
    df = token_table(tokens, ("seq_id", "pos", "text"), origin, "the linguistic labeller works from the token text",
                     sort=True)
    parts = []
    for _, g in df.groupby("seq_id", sort=False):
        lab = label_tokens(g["text"].tolist(), switch_cost=switch_cost)
        lab.index = g.index
        parts.append(lab)
    lab = pd.concat(parts) if parts else pd.DataFrame(columns=["mode", "context", "fine", "script"])
    df["label"] = pd.Categorical(lab["context"], categories=CONTEXTS)
    df["label_mode"] = lab["mode"].astype(str)
    df["label_fine"] = lab["fine"].astype(str)
    df["label_script"] = lab["script"].astype(str)
    return df


@dataclass(frozen=True)
class LabelAgreement:
    """Rule-based labels against planted ones (simulated traces).

    Attributes
    ----------
    n_tokens : tokens compared.
    accuracy : share with the same label.
    kappa : Cohen's kappa (chance-corrected agreement).
    confusion : DataFrame, planted contexts (rows) x rule labels (columns), token counts.
    by_context : per planted context: ``n_planted``, ``n_labelled``, ``precision``, ``recall``, ``f1``.
    script_accuracy : share of tokens with letters whose script matches the planted ``script``.
    """

    n_tokens: int
    accuracy: float
    kappa: float
    confusion: pd.DataFrame
    by_context: pd.DataFrame
    script_accuracy: float | None


def label_agreement(labelled: pd.DataFrame, planted: str = "context", ours: str = "label") -> LabelAgreement:
    """Compare :func:`label_trace_tokens` output with the planted labels of a simulated trace."""
    from sklearn.metrics import cohen_kappa_score, confusion_matrix, precision_recall_fscore_support

    if planted not in labelled.columns:
        raise TraceFormatError("tokens.parquet", [Problem("tokens.parquet", planted, "no planted labels to compare "
                                                          "with (only simulated traces carry them)")])
    y_true = labelled[planted].astype(str).to_numpy()
    y_pred = labelled[ours].astype(str).to_numpy()
    labels = list(CONTEXTS)
    cm = confusion_matrix(y_true, y_pred, labels=labels)
    p, r, f, _ = precision_recall_fscore_support(y_true, y_pred, labels=labels, zero_division=0)
    confusion = pd.DataFrame(cm, index=pd.Index(labels, name="planted"), columns=pd.Index(labels, name="labelled"))
    by = pd.DataFrame({"context": labels, "n_planted": cm.sum(axis=1), "n_labelled": cm.sum(axis=0),
                       "precision": p, "recall": r, "f1": f})
    script_acc = None
    if "script" in labelled.columns and "label_script" in labelled.columns:
        has = labelled["label_script"].to_numpy() != v.NO_SCRIPT
        if has.any():
            script_acc = float((labelled["label_script"].to_numpy()[has]
                                == labelled["script"].astype(str).to_numpy()[has]).mean())
    return LabelAgreement(int(len(y_true)), float((y_true == y_pred).mean()),
                          float(cohen_kappa_score(y_true, y_pred, labels=labels)), confusion, by, script_acc)
