"""The book build executes notebooks two at a time, each after the pages it reads
(:func:`speclimits.book.build.dependencies`): no notebook is run here, ``_execute`` is replaced."""

from __future__ import annotations

import io
import os
import threading
import time

import pytest

from speclimits.book import build
from speclimits.errors import SpeclimitsError
from speclimits.paths import REPO_ROOT


TOC = build.toc_files()
NOTEBOOKS = [REPO_ROOT / f"{t}.py" for t in TOC]


def test_dependencies_of_the_book():
    deps = build.dependencies(NOTEBOOKS, TOC[0])
    # the Oracle, linguistic and control sections read section 3's cost model; the intro gathers all
    for page in ("06_oracle", "07_linguistic", "08_online_control"):
        assert deps[page] == {"03_final_model"}, page
    assert deps["09_beyond_batch"] == set()  # it fits its own batch cost model
    assert deps["03_final_model"] == set() and deps["01_tracing"] == set()
    assert deps["intro"] == {p.stem for p in NOTEBOOKS} - {"intro"}
    # --pages: a page not executed again is not waited for
    some = [p for p in NOTEBOOKS if p.stem in ("06_oracle", "intro")]
    assert build.dependencies(some, TOC[0]) == {"06_oracle": set(), "intro": {"06_oracle"}}


def test_two_at_a_time_each_after_what_it_reads(monkeypatch, tmp_path):
    log: list[tuple[str, str, float]] = []
    running, peak, guard, cwds = set(), [0], threading.Lock(), set()

    def fake_execute(src, stage, params, log_file, lock=None, chdir=True):
        with guard:
            cwds.add((os.getcwd(), chdir))
            running.add(src.stem)
            peak[0] = max(peak[0], len(running))
            log.append(("start", src.stem, time.perf_counter()))
        time.sleep(0.05 if src.stem != "03_final_model" else 0.15)
        with guard:
            running.discard(src.stem)
            log.append(("end", src.stem, time.perf_counter()))
        return 0.05

    monkeypatch.setattr(build, "_execute", fake_execute)
    here = os.getcwd()
    (tmp_path / "book").mkdir()
    times = build._execute_all(NOTEBOOKS, tmp_path, {}, io.StringIO(), jobs=2, root=TOC[0], progress=False)
    assert list(times) == [p.stem for p in NOTEBOOKS]
    at = {(kind, page): t for kind, page, t in log}
    assert peak[0] == 2
    for page in ("06_oracle", "07_linguistic", "08_online_control"):
        assert at[("start", page)] >= at[("end", "03_final_model")], page
    assert at[("start", "intro")] >= max(t for (kind, _), t in at.items() if kind == "end" and _ != "intro")
    # the page others wait for goes first, then (no earlier build) the later sections
    assert [x[1] for x in log if x[0] == "start"][:2] == ["03_final_model", "09_beyond_batch"]
    # every kernel starts in the executed copies' folder: set once for the threads (papermill's own
    # chdir is process-wide), and given back afterwards
    assert cwds == {(str(tmp_path / "book"), False)} and os.getcwd() == here
    # one at a time with jobs = 1
    log.clear(), running.clear(), cwds.clear()
    peak[0] = 0
    build._execute_all(NOTEBOOKS, tmp_path, {}, io.StringIO(), jobs=1, root=TOC[0], progress=False)
    assert peak[0] == 1 and cwds == {(here, True)}  # one at a time: papermill changes the folder itself


def test_a_failing_notebook_stops_the_build(monkeypatch):
    def fake_execute(src, stage, params, log_file, lock=None, chdir=True):
        if src.stem == "02_factors":
            raise SpeclimitsError("notebook book/02_factors.py failed in cell 3: ValueError: x")
        return 0.0

    monkeypatch.setattr(build, "_execute", fake_execute)
    with pytest.raises(SpeclimitsError, match="02_factors"):
        build._execute_all(NOTEBOOKS, REPO_ROOT, {}, io.StringIO(), jobs=2, root=TOC[0], progress=False)


def test_the_last_builds_times_order_the_pages(tmp_path, monkeypatch):
    log = tmp_path / "build.log"
    log.write_text("executed x\nexecution times (s): methods 2.5, 01_tracing 30.0, intro 1.9\n")
    assert build.previous_times(log) == {"methods": 2.5, "01_tracing": 30.0, "intro": 1.9}
    assert build.previous_times(tmp_path / "none.log") == {}
    started = []
    monkeypatch.setattr(build, "_execute", lambda src, *a, **k: started.append(src.stem) or 0.0)
    build._execute_all(NOTEBOOKS, tmp_path, {}, io.StringIO(), jobs=1, root=TOC[0], progress=False,
                       expected=build.previous_times(log))
    assert started[:2] == ["03_final_model", "01_tracing"] and started[-1] == "intro"


def test_a_build_leaves_papermills_folder_unset(monkeypatch, tmp_path):
    """papermill's process-wide write folder, restored per run, is left set by threads that end out of order: the
    build unsets it before and after executing, so a later build never changes into a staging folder that is gone."""
    from papermill.iorw import local_file_io_cwd, papermill_io

    entered = []

    def fake_execute(src, stage, params, log_file, lock=None, chdir=True):
        with local_file_io_cwd():  # what papermill.execute_notebook does around a run
            entered.append(src.stem)
            time.sleep(0.01 if len(entered) == 1 else 0.08)  # the later entrant ends last: the race
        return 0.0

    handler = papermill_io.get_handler("local")
    monkeypatch.setattr(build, "_execute", fake_execute)
    (tmp_path / "book").mkdir()
    try:
        for jobs in (2, 1):  # in threads (the race), and one at a time (each run restores what it found)
            handler.cwd(str(tmp_path / "gone"))  # left by an earlier build whose folder was deleted
            entered.clear()
            build._execute_all(NOTEBOOKS, tmp_path, {}, io.StringIO(), jobs=jobs, root=TOC[0], progress=False)
            assert handler.cwd(None) is None, jobs
    finally:
        handler.cwd(None)
