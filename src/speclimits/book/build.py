"""Build the book: jupytext sources -> executed notebooks (papermill) -> static site (Jupyter Book 1).

Stages ``_config.yml``, ``_toc.yml``, the pages and ``_static`` (the site's CSS and a Vega bundle made by
``vl-convert``) under ``<out>/source``; executes each page with ``trace``, ``smoke``, ``seed`` and
``results`` injected (``cost_model`` where the parameters cell declares it: section 3 writes it, later
sections read it; the intro runs last and gathers every section's key results); runs ``jupyter-book
build -W`` with execution off, copies MathJax 3 (Python package ``django-static-mathjax``) into the site
and checks that no page references a CDN.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from tqdm.auto import tqdm

from speclimits.errors import SpeclimitsError
from speclimits.paths import BOOK_CONFIG, BOOK_DIR, BOOK_TOC, BUILD_DIR, REPO_ROOT, default_trace
from speclimits.trace import validate_trace

#: The Python distribution that ships MathJax 3's files, and the version pinned by the book extra.
MATHJAX_DIST = "django-static-mathjax"
MATHJAX_DIST_VERSION = "3.2.2.1"
#: Parts of MathJax's es5 folder the site needs (tex-chtml and what it loads lazily).
MATHJAX_PARTS = ("tex-chtml.js", "a11y", "ui", "input", "output", "adaptors")
#: Strings that must not appear in the built HTML (the site must read offline).
CDN_PATTERNS = ("cdn.jsdelivr.net", "unpkg.com", "cdnjs.cloudflare.com", "cdn.mathjax.org",
                "fonts.googleapis.com", "requirejs")
VENDOR_DIR = BUILD_DIR / "vendor"


def toc_files(toc_path: Path = BOOK_TOC) -> list[str]:
    """Page paths (without suffix) in ``_toc.yml`` order, root first."""
    def walk(entry: dict):
        if "file" in entry:
            yield entry["file"]
        for key in ("sections", "chapters", "parts"):
            for child in entry.get(key) or []:
                yield from walk(child)

    toc = yaml.safe_load(toc_path.read_text())
    return [toc["root"], *walk(toc)]


def mathjax_es5() -> Path:
    """MathJax 3's es5 folder in the installed ``django-static-mathjax`` (a plain wheel of its files)."""
    try:
        files = metadata.files(MATHJAX_DIST) or []
        version = metadata.version(MATHJAX_DIST)
    except metadata.PackageNotFoundError:
        raise SpeclimitsError(f"the book serves MathJax locally from the Python package '{MATHJAX_DIST}', which "
                              f"is not installed: pip install '{MATHJAX_DIST}=={MATHJAX_DIST_VERSION}' (or run "
                              "scripts/setup.sh)") from None
    entry = next((f for f in files if str(f).endswith("es5/tex-chtml.js")), None)
    if entry is None:
        raise SpeclimitsError(f"{MATHJAX_DIST} {version} has no es5/tex-chtml.js; install "
                              f"{MATHJAX_DIST}=={MATHJAX_DIST_VERSION}")
    return Path(entry.locate()).parent


def vega_bundle() -> Path:
    """One self-contained script defining ``vegaEmbed``, ``vegaLite`` and ``vega`` on ``window``."""
    import altair as alt
    import vl_convert

    target = VENDOR_DIR / f"vega-offline-{alt.VEGALITE_VERSION}.js"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        major_minor = "v" + ".".join(alt.VEGALITE_VERSION.split(".")[:2])
        try:
            code = vl_convert.javascript_bundle(vl_version=major_minor)
        except ValueError:
            code = vl_convert.javascript_bundle()
        partial = target.with_name(f"{target.name}.tmp{os.getpid()}")
        partial.write_text("(function(){\n" + code + "\n})();\n")
        os.replace(partial, target)  # atomic: a concurrent build reads the whole file or none
    return target


def _stage(stage: Path, pages: list[str], keep: bool = False) -> list[Path]:
    """Staging tree (fresh unless ``keep``); returns the jupytext notebooks of ``pages`` (toc order)."""
    if not keep:
        shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True, exist_ok=True)
    shutil.copy2(BOOK_CONFIG, stage / "_config.yml")
    shutil.copy2(BOOK_TOC, stage / "_toc.yml")
    static = stage / "_static"
    # MathJax goes into the built site after Sphinx ran: Jupyter Book adds every .js file under _static
    # to every page, and MathJax's lazily loaded parts would all load at once and clash
    shutil.rmtree(static / "mathjax", ignore_errors=True)
    if (BOOK_DIR / "_static").is_dir():
        shutil.copytree(BOOK_DIR / "_static", static, dirs_exist_ok=True)
    static.mkdir(exist_ok=True)
    mathjax_es5()  # fail early, before any notebook runs, if the MathJax package is missing
    shutil.copy2(vega_bundle(), static / "vega-offline.js")
    notebooks = [REPO_ROOT / f"{page}.py" for page in pages]
    for page, src in zip(pages, notebooks):
        if not src.exists():
            raise SpeclimitsError(f"_toc.yml lists '{page}', but {page}.py does not exist")
        (stage / page).parent.mkdir(parents=True, exist_ok=True)
    return notebooks


def declared_parameters(nb) -> set[str]:
    """Names assigned in the notebook's cell tagged ``parameters``."""
    names: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.Assign):
                    names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


#: Injected into every notebook; the others only into notebooks whose parameters cell declares them.
COMMON_PARAMETERS = ("trace", "smoke", "seed")


def promote_figures(nb, page: str = "notebook") -> int:
    """Turn outputs that :meth:`speclimits.book.present.Page.figure` marked (output metadata
    ``speclimits.figure``: name, caption) into the cell's ``mystnb.figure`` options, which myst-nb
    applies to the cell's rich outputs: a figure cell shows nothing else. Returns the count."""
    from speclimits.book.present import FIGURE_KEY

    count = 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        rich = [o for o in cell.get("outputs", []) if o.get("output_type") in ("display_data", "execute_result")]
        marks = [o["metadata"][FIGURE_KEY]["figure"] for o in rich
                 if FIGURE_KEY in o.get("metadata", {}) and "figure" in o["metadata"][FIGURE_KEY]]
        if not marks:
            continue
        if len(rich) != 1:
            raise SpeclimitsError(f"{page}, cell {index}: a figure cell must show exactly one output "
                                  f"(it shows {len(rich)}); put figure '{marks[0]['name']}' in a cell of its own")
        cell.metadata.setdefault("mystnb", {})["figure"] = dict(marks[0])
        count += 1
    return count


#: A table or figure label written literally in a cell's code (``page.table(..., "tbl-final-smooth", ...)``).
_CODE_LABEL = re.compile(r"""["']((?:tbl|fig)-[a-z0-9][a-z0-9-]*)["']""")
#: A label a notebook defines: a MyST ``:name:`` (tables) in a markdown cell or output.
_NAME_OPTION = re.compile(r"^:name:\s*((?:tbl|fig)-[a-z0-9-]+)\s*$", re.M)


def link_missing_labels(nb) -> dict[str, str]:
    """Put the labels of the tables and figures a page could not show on its "cannot show" note.

    A label written literally in a code cell and defined nowhere in the executed notebook becomes a MyST
    target on the nearest note at or before that cell, so the prose's ``{numref}`` resolves
    (:mod:`speclimits.sphinx_numref`); with no note before it, it stays undefined and fails the build.
    Returns ``{label: cell index of its note}``."""
    from speclimits.book.present import FIGURE_KEY, NOT_SHOWN_CLASS

    defined: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            defined.update(_NAME_OPTION.findall(cell.source))
            continue
        for out in cell.get("outputs", []):
            defined.update(_NAME_OPTION.findall("".join(out.get("data", {}).get("text/markdown", ""))))
            mark = out.get("metadata", {}).get(FIGURE_KEY, {}).get("figure")
            if mark:
                defined.add(mark["name"])
    placed: dict[str, str] = {}
    note: tuple[int, dict] | None = None
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        notes = [o for o in cell.get("outputs", [])
                 if NOT_SHOWN_CLASS in "".join(o.get("data", {}).get("text/markdown", ""))]
        if notes:
            note = (index, notes[-1])
        missing = [x for x in dict.fromkeys(_CODE_LABEL.findall(cell.source)) if x not in defined and x not in placed]
        if not missing or note is None:
            continue
        at, out = note
        text = "".join(out["data"]["text/markdown"])
        at_start = text.index(":::")  # after the targets already there, in page order
        out["data"]["text/markdown"] = (text[:at_start] + "".join(f"({label})=\n" for label in missing)
                                        + text[at_start:])
        placed.update({label: str(at) for label in missing})
    return placed


def page_kernel_manager() -> type:
    """jupyter_client's kernel manager without the SIGINT it sends before every shutdown (which an idle
    kernel logs as "KeyboardInterrupt caught in kernel"), on IPC sockets in a private folder."""
    import tempfile

    from jupyter_client.manager import AsyncKernelManager

    class PageKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.transport = "ipc"
            self.ip = str(Path(tempfile.mkdtemp(prefix="speclimits-kernel-")) / "k")

        async def _async_interrupt_kernel(self) -> None:
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

        async def _async_cleanup_resources(self, restart: bool = False) -> None:
            await super()._async_cleanup_resources(restart=restart)
            if not restart:
                shutil.rmtree(Path(self.ip).parent, ignore_errors=True)

    return PageKernelManager


def _execute(src: Path, stage: Path, parameters: dict, log, lock: Any = None, chdir: bool = True) -> float:
    import jupytext
    import nbformat
    import papermill

    page = src.relative_to(REPO_ROOT).with_suffix("")
    raw = stage / f"{page}.raw.ipynb"
    out = stage / f"{page}.ipynb"
    nb = jupytext.read(src)
    declared = declared_parameters(nb)
    parameters = {k: v for k, v in parameters.items() if k in COMMON_PARAMETERS or k in declared}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, raw)
    t0 = time.perf_counter()
    try:
        # papermill's cwd= changes this whole process's folder (threads: the caller sets it once); the
        # kernel's folder is also named to nbclient, so downloads land beside the executed copy
        papermill.execute_notebook(str(raw), str(out), parameters=parameters, kernel_name="python3",
                                   cwd=str(out.parent) if chdir else None, progress_bar=False, log_output=False,
                                   resources={"metadata": {"path": str(out.parent)}},
                                   kernel_manager_class=page_kernel_manager())
    except papermill.PapermillExecutionError as exc:
        raise SpeclimitsError(
            f"notebook {src.relative_to(REPO_ROOT)} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}\n"
            f"(executed copy with the traceback: {out})") from None
    finally:
        raw.unlink(missing_ok=True)
    dt = time.perf_counter() - t0
    # the injected parameters are listed on the intro page; hide the cell in each section
    executed = nbformat.read(out, as_version=4)
    for cell in executed.cells:
        tags = cell.metadata.setdefault("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")
    promote_figures(executed, str(src.relative_to(REPO_ROOT)))
    link_missing_labels(executed)
    nbformat.write(executed, out)
    with lock if lock is not None else contextlib.nullcontext():
        log.write(f"executed {src.name} in {dt:.1f} s\n")
    return dt


def _select(notebooks: list[Path], pages: list[str], stage: Path, site: bool = True) -> list[Path]:
    """The notebooks named in ``pages``. For a site, every other page must have been executed by an
    earlier build; without one, the pages they depend on (:func:`dependencies`) are added instead."""
    by_name = {p.stem: p for p in notebooks}
    unknown = [p for p in pages if Path(p).stem not in by_name]
    if unknown:
        raise SpeclimitsError(f"--pages: {', '.join(unknown)} not in _toc.yml (pages: {', '.join(by_name)})")
    wanted = {Path(p).stem for p in pages}
    if not site:
        deps = dependencies(notebooks, "")
        wanted |= {d for w in wanted for d in deps[w]}
        return [p for p in notebooks if p.stem in wanted]
    missing = [p.name for p in notebooks if p.stem not in wanted
               and not (stage / p.relative_to(REPO_ROOT)).with_suffix(".ipynb").exists()]
    if missing:
        raise SpeclimitsError(f"--pages reuses the other pages from the last build in {stage.parent}, but "
                              f"{', '.join(missing)} were never executed there: build the whole book once first")
    return [p for p in notebooks if p.stem in wanted]


def default_jobs() -> int:
    """Notebooks executed at once by default: one per core, at most 2."""
    return max(1, min(2, os.cpu_count() or 1))


#: The page that writes the build's cost-model JSON (the ``cost_model`` parameter); every other page
#: that declares ``cost_model`` reads it and runs after it.
COST_MODEL_WRITER = "03_final_model"


def dependencies(notebooks: list[Path], root: str) -> dict[str, set[str]]:
    """Per page (file stem), the pages that must finish first: readers of the cost model wait for
    :data:`COST_MODEL_WRITER`, the root page (the intro) for all others; only pages in ``notebooks``."""
    import jupytext

    stems = {p.stem for p in notebooks}
    root_stem = Path(root).stem
    deps: dict[str, set[str]] = {}
    for p in notebooks:
        d: set[str] = set()
        if p.stem == root_stem:
            d = stems - {root_stem}
        elif p.stem != COST_MODEL_WRITER and "cost_model" in declared_parameters(jupytext.read(p)):
            d = {COST_MODEL_WRITER} & stems
        deps[p.stem] = d
    return deps


def previous_times(log_path: Path) -> dict[str, float]:
    """Seconds per page of the last build in the same output folder (its ``build.log``), if any."""
    try:
        lines = [x for x in log_path.read_text().splitlines() if x.startswith("execution times (s): ")]
    except OSError:
        return {}
    out = {}
    for item in lines[-1].split(": ", 1)[1].split(", ") if lines else []:
        name, _, sec = item.rpartition(" ")
        try:
            out[name] = float(sec)
        except ValueError:
            continue
    return out


def _execute_all(notebooks: list[Path], stage: Path, params: dict, log, *, jobs: int, root: str,
                 progress: bool, expected: dict[str, float] | None = None) -> dict[str, float]:
    """Execute the notebooks, up to ``jobs`` at once (threads, a kernel each), each after the pages it
    depends on. Ready pages others wait for go first, then the longest (``expected`` seconds per page,
    from the last build; else later sections first). Returns seconds per page."""
    deps = dependencies(notebooks, root)
    waiting_on_me = {s: sum(s in d for d in deps.values()) for s in deps}
    order = {p.stem: i for i, p in enumerate(notebooks)}
    expected = expected or {}
    todo = sorted(notebooks, key=lambda p: (-waiting_on_me[p.stem], -expected.get(p.stem, 0.0), -order[p.stem]))
    lock = threading.Lock()

    # a kernel starts in its executed copy's folder (its downloads go there); papermill sets it by changing
    # the process's folder, which threads share: set once here, pages in different folders one at a time
    folders = {(stage / p.relative_to(REPO_ROOT)).parent for p in notebooks}
    if len(folders) != 1:
        jobs = 1
    shared = jobs > 1

    def run(src: Path) -> float:
        dt = _execute(src, stage, params, log, lock, chdir=not shared)
        if progress:
            tqdm.write(f"  {src.name}: {dt:.1f} s")
        return dt

    cwd = os.getcwd()
    _unset_papermill_folder()
    if shared:
        os.chdir(next(iter(folders)))
    done: set[str] = set()
    times: dict[str, float] = {}
    bar = tqdm(total=len(notebooks), desc="notebooks", unit="nb", disable=not progress)
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            running: dict[Any, Path] = {}
            while todo or running:
                ready = [p for p in todo if deps[p.stem] <= done]
                for src in ready[: max(1, jobs) - len(running)]:
                    todo.remove(src)
                    running[pool.submit(run, src)] = src
                if not running:  # nothing ready and nothing running: a dependency is missing
                    raise SpeclimitsError(f"book: pages {[p.name for p in todo]} wait for pages that are not built")
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    src = running.pop(fut)
                    times[src.stem] = fut.result()  # a failed notebook raises here, naming itself
                    done.add(src.stem)
                    bar.update(1)
                    bar.set_postfix_str(src.name)
        bar.close()
        return {p.stem: times[p.stem] for p in notebooks}
    finally:
        os.chdir(cwd)
        _unset_papermill_folder()


def _unset_papermill_folder() -> None:
    """Unset the folder papermill's file writes change into: it is process-wide and each run restores what
    it found, so runs in threads can leave a (later deleted) staging folder set. Every path here is absolute."""
    from papermill.iorw import papermill_io

    papermill_io.get_handler("local").cwd(None)


def build_book(trace: str | Path | None = None, smoke: bool = False, out: str | Path | None = None,
               seed: int = 0, progress: bool = True, pages: list[str] | None = None,
               jobs: int | None = None, site: bool = True) -> Path:
    """Execute every notebook in ``_toc.yml`` on ``trace`` and build the site; returns its ``index.html``.

    ``pages`` (e.g. ``03_final_model``): execute only these and reuse the others from the last build in
    ``out``. ``jobs``: notebooks at once (default :func:`default_jobs`). ``site=False``: execute only
    ``pages`` and what they depend on, in a fresh folder, and return ``<out>/source`` (no site)."""
    jobs = default_jobs() if jobs is None else int(jobs)
    trace_path = Path(trace) if trace else default_trace()
    if not trace_path.exists():
        hint = " (generate it with `speclimits simulate --preset default --out data/traces/sim-default`)" \
            if trace is None else ""
        raise SpeclimitsError(f"trace {trace_path} does not exist{hint}")
    validate_trace(trace_path)
    out_dir = (Path(out) if out else BUILD_DIR / "book").resolve()  # notebooks run in other folders
    stage = out_dir / "source"
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "build.log"
    expected = previous_times(log_path)
    toc = toc_files()
    with log_path.open("w") as log:
        notebooks = _stage(stage, toc, keep=bool(pages) and site)
        if pages:
            notebooks = _select(notebooks, pages, stage, site)
        notebooks.sort(key=lambda p: p.relative_to(REPO_ROOT).with_suffix("").as_posix() == toc[0])
        params = {"trace": str(trace_path.resolve()), "smoke": bool(smoke), "seed": int(seed),
                  "cost_model": str((stage / "_static" / "cost_model.json").resolve()),
                  "results": str((out_dir / "results").resolve())}
        # kernels inherit the environment: no progress bars on the pages (they render as stderr noise)
        os.environ["TQDM_DISABLE"] = "1"
        log.write(f"parameters: {params}\n")
        times = _execute_all(notebooks, stage, params, log, jobs=jobs, root=toc[0], progress=progress,
                             expected=expected)
        log.write("execution times (s): " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()) + "\n")
        if not site:
            return stage
        jb = Path(sys.executable).with_name("jupyter-book")
        cmd = [str(jb) if jb.exists() else "jupyter-book", "build", str(stage), "--path-output", str(out_dir),
               "-W", "--keep-going"]
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        if progress:
            print("building the site with jupyter-book ...", file=sys.stderr)
        env = dict(os.environ, PYTHONWARNINGS="ignore::DeprecationWarning")
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-30:])
        raise SpeclimitsError(f"jupyter-book build failed (full log: {log_path}):\n{tail}")
    html = out_dir / "_build" / "html"
    es5, mathjax = mathjax_es5(), html / "_static" / "mathjax"
    shutil.rmtree(mathjax, ignore_errors=True)
    mathjax.mkdir()
    for part in MATHJAX_PARTS:
        (shutil.copytree if (es5 / part).is_dir() else shutil.copy2)(es5 / part, mathjax / part)
    offenders = []
    for page in html.rglob("*.html"):
        text = page.read_text(errors="replace")
        offenders += [f"{page.relative_to(html)} ({pat})" for pat in CDN_PATTERNS if pat in text]
    if offenders:
        raise SpeclimitsError("built pages still reference a CDN, so the site would not read offline: "
                              + ", ".join(offenders[:10]))
    return html / "index.html"
