"""How the book shows numbers: captioned, numbered figures and tables (:class:`Page`, whose captions end
with the trace's data label, measured or SIMULATED), and key-results boxes (:class:`KeyResults`, also written
as JSON for the intro). Numbers with an interval are one cell, ``0.156 [0.120; 0.192]``, with the decimals
the interval supports (:func:`fmt_ci`).
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

#: Output-metadata key the build reads to turn an output into a numbered figure.
FIGURE_KEY = "speclimits"

#: Label shapes: figures ``fig-…``, tables ``tbl-…`` (lower case, digits, dashes).
_LABEL = re.compile(r"^(fig|tbl)-[a-z0-9][a-z0-9-]*$")


def finite(x: Any) -> bool:
    """``x`` reads as a finite float (None, NaN and words do not)."""
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def decimals_for(width: float, sig: int = 2) -> int:
    """Decimals that show ``sig`` significant digits of ``width`` (an interval's half-width)."""
    if not finite(width) or width <= 0:
        return 3
    return int(min(6, max(0, sig - 1 - math.floor(math.log10(abs(width))))))


def fmt_num(x: Any, decimals: int | None = None, sig: int = 3) -> str:
    """One number: ``decimals`` fixed, else ``sig`` significant digits (thousands keep their digits)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}".replace(",", "\u2009")
    if not finite(x):
        return str(x)
    x = float(x)
    if decimals is None:
        if x == 0:
            return "0"
        decimals = decimals_for(abs(x), sig)
    return f"{x:.{decimals}f}"


def fmt_fixed(x: Any, decimals: int, missing: str = "–") -> str:
    """``x`` with ``decimals`` fixed decimals, or ``missing`` where it is no finite number."""
    return f"{float(x):.{decimals}f}" if finite(x) else missing


def fmt_paper(x: Any, unit: str = "") -> str:
    """A value as the paper prints it (``:g``, then ``unit``), its text as it is, "–" for none."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return x if isinstance(x, str) else f"{x:g}" + (f" {unit}" if unit else "")


def fmt_ci(est: Any, lo: Any = None, hi: Any = None, decimals: int | None = None, unit: str = "") -> str:
    """``"0.156 [0.120; 0.192]"``: without ``decimals``, two significant digits of the interval's
    half-width (three significant digits of the estimate without an interval)."""
    if not finite(est):
        return "–"
    has_ci = finite(lo) and finite(hi)
    if decimals is None and has_ci:
        decimals = decimals_for((float(hi) - float(lo)) / 2)
    text = fmt_num(float(est), decimals)
    if has_ci:
        text += f" [{fmt_num(float(lo), decimals)}; {fmt_num(float(hi), decimals)}]"
    return text + (f" {unit}" if unit else "")


def fmt_se(est: Any, se: Any) -> str:
    """``"0.705 (0.003)"``: an estimate with its standard error, as the paper prints them."""
    try:
        est, se = float(est), float(se)
    except (TypeError, ValueError):
        return "–"
    if not (math.isfinite(est) and math.isfinite(se)):
        return fmt_num(est)
    d = decimals_for(se, sig=1) + 1
    return f"{est:.{d}f} ({se:.{d}f})"


def fmt_p(p: Any) -> str:
    """A p-value as a reader scans it: ``0.39``, ``2.1e-06``, or ``< 1e-300`` below double precision."""
    if not finite(p):
        return "–"
    p = float(p)
    if p <= 0:
        return "< 1e-300"
    return f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}"


def ci_cells(est: Iterable, lo: Iterable, hi: Iterable, decimals: int | None = None,
             scale: float = 1.0) -> list[str]:
    """:func:`fmt_ci` over three columns (each value multiplied by ``scale``, e.g. 1e3 for per-1k units)."""
    return [fmt_ci(*(x * scale if finite(x) else x for x in row), decimals) for row in zip(est, lo, hi)]


def ci_column(frame: pd.DataFrame, col: str, decimals: int | None = None) -> list[str]:
    """:func:`ci_cells` of columns ``col``, ``col_lo`` and ``col_hi`` (a missing column reads as NaN, "–")."""
    nan = pd.Series(np.nan, index=frame.index)
    return ci_cells(*(frame.get(c, nan) for c in (col, f"{col}_lo", f"{col}_hi")), decimals)


def se_ci(est: Any, se: Any, scale: float = 1.0) -> str:
    """:func:`fmt_ci` of ``est`` with the normal 95% interval ``est ± 1.96 se``, all times ``scale``."""
    return fmt_ci(scale * est, scale * (est - 1.96 * se), scale * (est + 1.96 * se))


def half_cells(est: Iterable, half: Iterable, decimals: int | None = None) -> list[str]:
    """Interval cells from estimates and symmetric half-widths (``est ± half``)."""
    est, half = np.asarray(est, dtype=float), np.asarray(half, dtype=float)
    return ci_cells(est, est - half, est + half, decimals)


def with_ci(frame: pd.DataFrame, est: str, lo: str, hi: str, label: str | None = None,
            decimals: int | None = None, scale: float = 1.0) -> pd.DataFrame:
    """Replace columns ``est``, ``lo``, ``hi`` by one text column ``label`` (default ``est``) in place of ``est``."""
    out = frame.copy()
    cells = ci_cells(out[est], out[lo], out[hi], decimals, scale)
    at = list(out.columns).index(est)
    out = out.drop(columns=[est, lo, hi])
    out.insert(at, label or est, cells)
    return out


def data_label_for(trace: Any) -> str:
    """The sentence every caption of a page on ``trace`` ends with (measured, or SIMULATED)."""
    name = Path(str(trace.path)).name
    if trace.simulated:
        return f"Data: **SIMULATED** trace `{name}` (planted truth, not a measurement)."
    return f"Data: measured trace `{name}`."


def _caption(caption: str, data_label: str | None = None) -> str:
    caption = caption.strip()
    if not caption:
        raise ValueError("a figure or table needs a caption that says what it shows")
    return f"{caption} {data_label}" if data_label and "Data:" not in caption else caption


def _check_label(name: str, kind: str) -> None:
    if not _LABEL.match(name) or not name.startswith(kind + "-"):
        raise ValueError(f"label {name!r}: use '{kind}-' followed by lower-case words joined by dashes")


def _bundle(obj: Any) -> tuple[dict, dict]:
    rep = obj._repr_mimebundle_() if hasattr(obj, "_repr_mimebundle_") else None
    if rep is None:
        raise TypeError(f"cannot display {type(obj).__name__} as a figure")
    if isinstance(rep, tuple):
        data, meta = rep
        return dict(data), dict(meta or {})
    return dict(rep), {}


def _cell(x: Any, decimals: int | None) -> str:
    if isinstance(x, str):
        text = x
    elif isinstance(x, (float, np.floating)):
        text = fmt_num(x, decimals)
    elif x is None or (not isinstance(x, (list, tuple, dict, np.ndarray)) and pd.isna(x)):
        text = "–"
    else:
        text = fmt_num(x) if isinstance(x, (int, np.integer, bool, np.bool_)) else str(x)
    # an interval "[a; b]", "a → b" and "a / b" never break inside (a break may still fall before them)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text.replace("; ", ";\u00a0").replace(" → ", "\u00a0→\u00a0").replace(" / ", "\u00a0/\u00a0")


#: A cell that is a number written as text: "0.156 [0.120; 0.192]", "-0.19", "2.66 → 3.12", "25 %".
_NUMBER_TEXT = re.compile(r"^[-+−≈<>≤≥]?\s?\d")


def _numeric_column(col: pd.Series) -> bool:
    """Numbers, or text whose every filled cell starts like a number (intervals): right-aligned."""
    if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
        return True
    cells = [str(v) for v in col if isinstance(v, str) and v.strip() not in ("", "–", "-")]
    return bool(cells) and all(_NUMBER_TEXT.match(v.strip()) for v in cells)


def markdown_table(frame: pd.DataFrame, decimals: dict[str, int] | int | None = None,
                   align: dict[str, str] | None = None) -> str:
    """A pipe table (no index): text cells as they are, numbers rounded by column; numbers (also when
    written as text, like interval cells) right-aligned, words left, unless ``align`` says otherwise."""
    cols = list(frame.columns)
    if isinstance(decimals, int) or decimals is None:
        decimals = {c: decimals for c in cols}
    align = align or {}
    header = "| " + " | ".join(str(c).replace("|", "\\|") for c in cols) + " |"
    rule = "|" + "|".join(
        {"left": ":---", "right": "---:", "center": ":---:"}.get(
            align.get(c, "right" if _numeric_column(frame[c]) else "left"), "---")
        for c in cols) + "|"
    rows = ["| " + " | ".join(_cell(v, decimals.get(c)) for c, v in zip(cols, row)) + " |"
            for row in frame.itertuples(index=False, name=None)]
    return "\n".join([header, rule, *rows])


def table_markdown(frame: pd.DataFrame, name: str, caption: str, decimals: dict[str, int] | int | None = None,
                   download: str | None = None, align: dict[str, str] | None = None,
                   data_label: str | None = None) -> str:
    """The MyST ``{table}`` directive for ``frame`` (what :meth:`Page.table` displays)."""
    _check_label(name, "tbl")
    cap = _caption(caption, data_label)
    if download:
        cap = cap + f" Full table: {{download}}`{Path(download).name} <{download}>`."
    body = markdown_table(frame, decimals, align)
    return f":::{{table}} {cap}\n:name: {name}\n:align: center\n\n{body}\n:::\n"


class _Markdown:
    """A ``text/markdown`` output (rendered as MyST by myst-nb) with a plain-text fallback."""

    def __init__(self, text: str, plain: str) -> None:
        self.text, self.plain = text, plain

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return {"text/markdown": self.text, "text/plain": self.plain}


#: A key result the trace cannot give (the page says why, in a :meth:`Page.cannot_show` note).
NOT_IDENTIFIED = "not identified on this trace"
#: The class of a "cannot show" note: the build puts the labels of what a page could not show on it
#: (:func:`speclimits.book.build.link_missing_labels`), and :mod:`speclimits.sphinx_numref` links there.
NOT_SHOWN_CLASS = "not-shown"


def cannot_show_markdown(what: str, why: str) -> str:
    """A MyST note, ``"This trace cannot show <what>: <why>."`` (``why``: what the table needs and what
    this trace has, e.g. :meth:`speclimits.stats.FinalModelResults.why_missing`)."""
    what, why = what.strip(), why.strip().rstrip(".")
    if not what or not why:
        raise ValueError("a 'cannot show' note needs what is not shown and why")
    text = _literal_dashes(f"This trace cannot show {what}: {why}.")
    return f":::{{admonition}} Not shown on this trace\n:class: note {NOT_SHOWN_CLASS}\n\n{text}\n:::\n"


_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)")


def _literal_dashes(text: str) -> str:
    """A command-line flag outside code spans (``--oracle``) put in a code span: Sphinx's smart quotes
    turn ``--`` in text into an en dash, even escaped (``-\\-``), but leave code alone."""
    parts = text.split("`")
    return "`".join(_FLAG.sub(r"`\1`", p) if i % 2 == 0 else p for i, p in enumerate(parts))


@dataclass
class Result:
    """One headline number: ours (with its interval) beside the paper's, if the paper has one."""

    quantity: str
    ours: str
    paper: str = "–"
    ref: str | None = None  # a label on the page where it is computed (fig-… / tbl-… / sec-…)

    @classmethod
    def of(cls, quantity: str, est: Any, lo: Any = None, hi: Any = None, paper: Any = None, unit: str = "",
           decimals: int | None = None, ref: str | None = None) -> "Result":
        ours = fmt_ci(est, lo, hi, decimals, unit) if not isinstance(est, str) else est
        return cls(quantity, ours, fmt_paper(paper, unit), ref)


def _quantity(r: Result) -> str:
    """The quantity with a link to where it is computed (``{ref}`` for a section, else ``{numref}``)."""
    if not r.ref:
        return r.quantity
    return f"{r.quantity} ({{{'ref' if r.ref.startswith('sec-') else 'numref'}}}`{r.ref}`)"


def _results_frame(rows: Sequence[Result], contrast: "Contrast | None" = None,
                   section: str | None = None) -> pd.DataFrame:
    frame = pd.DataFrame({
        "Quantity": [_quantity(r) for r in rows],
        "Ours": [r.ours for r in rows],
        "Paper": [r.paper for r in rows],
    })
    if contrast is not None and section is not None:
        frame.insert(2, contrast.column, contrast.values(section, rows))
    return frame


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _row_key(quantity: str) -> str:
    """A key results row's quantity without its numbers (``"α at K = 8 ... (% of OLS α = 0.138)"`` and the
    same row of another trace then match)."""
    return _NUMBER.sub("#", quantity).strip()


@dataclass
class Contrast:
    """The key results of the book built on the *other* regime's trace, shown beside this build's.

    ``folder``: a ``<section>.json`` per section (as :class:`KeyResults` writes them) and ``contrast.json``
    (``trace``, ``column`` header, ``applies_to``: the trace folder names whose pages show it)."""

    folder: Path
    column: str
    trace: str

    @classmethod
    def load(cls, folder: str | Path | None, current_trace: str | Path | None = None) -> "Contrast | None":
        """The contrast in ``folder`` for a page on ``current_trace``; None where there is none for it."""
        if not folder or current_trace is None:
            return None
        folder = Path(folder)
        info_path = folder / "contrast.json"
        if not info_path.exists():
            return None
        info = json.loads(info_path.read_text())
        if Path(str(current_trace)).name not in info.get("applies_to", []):
            return None
        return cls(folder, info["column"], info["trace"])

    def values(self, section: str, rows: Sequence[Result]) -> list[str]:
        """The other build's value of each of ``rows``, "–" where it has none (quantities equal but for
        their numbers match in order: the i-th row of a quantity takes the other build's i-th)."""
        path = self.folder / f"{section}.json"
        other: dict[str, list[str]] = {}
        if path.exists():
            for r in json.loads(path.read_text())["rows"]:
                other.setdefault(_row_key(r["quantity"]), []).append(r["ours"])
        out = []
        for r in rows:
            values = other.get(_row_key(r.quantity), [])
            out.append(values.pop(0) if values else "–")
        return out


class KeyResults:
    """A section's key-results box (a numbered table in a tip admonition): shown as a placeholder where
    the page opens (``page.key_results(...)``), filled by ``box.fill([...])``, which also writes the rows
    to ``<results_dir>/<section>.json`` for the intro (nothing without ``results_dir``)."""

    def __init__(self, section: str, title: str, results_dir: str | Path | None = None,
                 contrast: Contrast | None = None) -> None:
        from IPython.display import DisplayHandle

        self.section, self.title = section, title
        self.results_dir = Path(results_dir) if results_dir else None
        self.contrast = contrast
        self._handle = DisplayHandle(f"key-results-{uuid.uuid4().hex[:8]}")
        self._handle.display(_Markdown(
            "```{note}\nKey results: computed further down this page (run the whole notebook).\n```\n",
            "key results: pending"))

    def markdown(self, rows: Sequence[Result]) -> str:
        name = f"tbl-{self.section.removeprefix('sec-')}-key-results"
        other = ""
        align = {"Ours": "right", "Paper": "right"}
        if self.contrast is not None:
            other = (f" The column *{self.contrast.column}* gives the same quantity on "
                     f"`{Path(self.contrast.trace).name}`, the other regime ({{ref}}`sec-regimes`).")
            align[self.contrast.column] = "right"
        inner = table_markdown(_results_frame(rows, self.contrast, self.section), name,
                               f"Key results of this section ({self.title}) beside the paper's. Brackets: the "
                               f"95% interval, unless the quantity names another range.{other}",
                               align=align)
        return f"::::{{admonition}} Key results\n:class: tip\n\n{inner}::::\n"

    def fill(self, rows: Iterable[Result]) -> None:
        rows = list(rows)
        if not rows:
            raise ValueError(f"{self.section}: a key-results box needs at least one row")
        md = self.markdown(rows)
        self._handle.update(_Markdown(md, _results_frame(rows, self.contrast, self.section).to_string(index=False)))
        out = self.results_dir
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{self.section}.json").write_text(json.dumps(
                {"section": self.section, "title": self.title, "rows": [asdict(r) for r in rows]}, indent=1))


@dataclass
class Page:
    """One notebook's presentation context: where its key results go and the sentence its captions
    end with (``book_support.setup(results)`` makes it; :meth:`load` or :meth:`use` sets the sentence)."""

    results_dir: Path | None = None
    data_label: str | None = None
    #: the other regime's key results (:class:`Contrast`), set by :meth:`use` from ``contrast_dir``
    contrast_dir: Path | None = None
    contrast: Contrast | None = None
    _boxes: list = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.results_dir = Path(self.results_dir) if self.results_dir else None

    def use(self, trace: Any) -> Any:
        """Captions from here on name ``trace``; key-results boxes show the other regime's values beside
        this trace's (:class:`Contrast`). Returns ``trace``."""
        self.data_label = data_label_for(trace)
        self.contrast = Contrast.load(self.contrast_dir, getattr(trace, "path", None))
        for box in self._boxes:  # boxes open before the trace is loaded; they fill later
            box.contrast = self.contrast
        return trace

    def load(self, trace: str | Path | None) -> Any:
        """Open the notebook's trace parameter (``None`` -> the bundled default trace) and :meth:`use` it."""
        from speclimits.paths import default_trace
        from speclimits.trace import read_trace

        return self.use(read_trace(trace if trace else default_trace()))

    def figure(self, chart: Any, name: str, caption: str) -> None:
        """Show ``chart`` as numbered figure ``name``, alone in its cell (the build wraps the cell's rich
        output); the caption ends with the page's data label unless it names its data itself."""
        from IPython.display import display

        _check_label(name, "fig")
        data, meta = _bundle(chart)
        meta[FIGURE_KEY] = {"figure": {"name": name, "caption": _caption(caption, self.data_label)}}
        display(data, raw=True, metadata=meta)

    def table(self, frame: pd.DataFrame, name: str, caption: str, *, decimals: dict[str, int] | int | None = None,
              full: pd.DataFrame | None = None, align: dict[str, str] | None = None) -> None:
        """Show ``frame`` as numbered table ``name`` (index dropped); ``full``: a wider or longer version
        written as ``tables/<name>.csv`` beside the page and linked from the caption."""
        from IPython.display import display

        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"table {name}: expected a DataFrame, got {type(frame).__name__}")
        download = None
        if full is not None:
            path = Path("tables") / f"{name}.csv"
            path.parent.mkdir(exist_ok=True)
            full.to_csv(path, index=False)
            download = path.as_posix()
        md = table_markdown(frame, name, caption, decimals, download, align, self.data_label)
        display(_Markdown(md, frame.to_string(index=False)))

    def cannot_show(self, what: str, why: str) -> None:
        """One visible sentence (:func:`cannot_show_markdown`) in place of what this trace cannot give."""
        from IPython.display import display

        md = cannot_show_markdown(what, why)
        display(_Markdown(md, md.splitlines()[3]))

    def shows(self, what: str, why: str | None) -> bool:
        """True when ``why`` is None; else shows the :meth:`cannot_show` note for ``what`` and returns False."""
        if why is not None:
            self.cannot_show(what, why)
        return why is None

    def key_results(self, section: str, title: str) -> KeyResults:
        """The section's :class:`KeyResults` box, writing to this page's results folder."""
        box = KeyResults(section, title, results_dir=self.results_dir, contrast=self.contrast)
        self._boxes.append(box)
        return box


def gathered_results(results_dir: str | Path | None, sections: Sequence[str],
                     contrast: Contrast | None = None) -> pd.DataFrame | None:
    """The key results of ``sections`` (in that order) as one frame for the intro, or ``None``."""
    if not results_dir:
        return None
    frames = []
    for sec in sections:
        path = Path(results_dir) / f"{sec}.json"
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        rows = [Result(**r) for r in doc["rows"]]
        frame = _results_frame(rows, contrast, sec)
        frame.insert(0, "Section", [f"{{ref}}`{sec}`"] + [""] * (len(rows) - 1))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else None
