"""benchmarks/run_all.py and benchmarks/_figures.py without running a benchmark: the ratio rule, the
table from figure files, the selection, the commands, and that every benchmark script takes --json."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))

import run_all  # noqa: E402
from _figures import Figure, read_figures, write_figures  # noqa: E402


def test_ratio_lower_is_better():
    assert Figure("solve", 0.5, "s", 1.0).ratio == 0.5 and Figure("solve", 0.5, "s", 1.0).met
    late = Figure("solve", 2.0, "s", 1.0)
    assert late.ratio == 2.0 and late.met is False
    assert Figure("at target", 45.0, "s", 45.0).met  # <= 1 is met
    assert Figure("slowdown", -1.0, "%", 2.0).met  # faster than untraced: met
    assert Figure("zero target", 0.0, "s", 0.0).ratio == 0.0
    assert Figure("zero target", 1.0, "s", 0.0).ratio == math.inf


def test_ratio_higher_is_better():
    fast = Figure("speed-up", 200.0, "x", 100.0, better="higher")
    assert fast.ratio == 0.5 and fast.met
    slow = Figure("speed-up", 50.0, "x", 100.0, better="higher")
    assert slow.ratio == 2.0 and slow.met is False
    assert Figure("speed-up", 0.0, "x", 100.0, better="higher").ratio == math.inf


def test_no_target_no_ratio_and_bad_direction():
    f = Figure("size", 12.0, "MiB")
    assert f.ratio is None and f.met is None
    assert Figure("coverage", float("nan"), "", 0.95).value is None  # NaN has no JSON: None
    assert Figure("coverage", float("nan"), "", 0.95).ratio is None
    with pytest.raises(ValueError, match="better"):
        Figure("x", 1.0, better="faster")


def test_figure_file_round_trip(tmp_path):
    import numpy as np

    path = write_figures(tmp_path / "f.json", [Figure("a", np.float64(1.5), "s", 1.0), Figure("b", None, "")],
                         extra={"arr": np.arange(3), "nan": float("nan"), "path": tmp_path})
    figs, doc = read_figures(path)
    assert [f.name for f in figs] == ["a", "b"] and figs[0].value == 1.5 and figs[0].target == 1.0
    assert doc["figures"][0]["ratio"] == 1.5 and doc["figures"][0]["met"] is False
    assert doc["extra"] == {"arr": [0, 1, 2], "nan": None, "path": str(tmp_path)}


def _record(name: str, path: Path) -> dict:
    figs, doc = read_figures(path)
    return {"name": name, "status": "ok", "figures": [f.to_dict() for f in figs], "extra": doc["extra"]}


def test_table_from_two_benchmark_files(tmp_path):
    write_figures(tmp_path / "oracle.json", [
        Figure("full 1M-state solve", 0.69, "s", 1.0, note="best of 3"),
        Figure("pure-Python / vectorized", 250.0, "x", 100.0, better="higher"),
        Figure("speclimits oracle, default interval", 6.0, "s", 5.0)])
    write_figures(tmp_path / "stats.json", [Figure("bootstrap, 199 resamples", 0.2, "s")])  # no target
    records = [_record("oracle", tmp_path / "oracle.json"), _record("stats", tmp_path / "stats.json"),
               {"name": "ray", "status": "timed out after 600 s", "figures": [], "small_setting": "4 prompts"}]
    rows = run_all.table_rows(records)
    assert [r["benchmark"] for r in rows] == ["oracle"] * 3 + ["stats", "ray"]
    solve, py, cli, boot, ray = rows
    assert (solve["value"], solve["target"], solve["ratio"], solve["met"]) == ("0.69", "<= 1", "0.69", "yes")
    assert solve["note"] == "best of 3"
    assert (py["target"], py["ratio"], py["met"]) == (">= 100", "0.40", "yes")
    assert (cli["ratio"], cli["met"]) == ("1.20", "NO")
    assert (boot["value"], boot["unit"], boot["target"], boot["ratio"], boot["met"]) == ("0.2", "s", "", "", "")
    assert ray["figure"] == "(timed out after 600 s)" and ray["met"] == "NO"
    text = run_all.format_table(rows)
    assert text.splitlines()[0].split()[:7] == list(run_all.COLUMNS[:7])
    assert len(text.splitlines()) == 2 + len(rows)
    md = run_all.markdown_table(rows)
    assert md.count("\n") == 1 + len(rows) and "| stats | bootstrap, 199 resamples | 0.2 | s |  |  |  |" in md


def test_markdown_report_carries_the_machine_state(tmp_path):
    write_figures(tmp_path / "s.json", [Figure("wall", 50.0, "s", 60.0)])
    rec = _record("simulate", tmp_path / "s.json") | {"wall_s": 51.0, "load_before": [0.1, 0.2, 0.3],
                                                      "load_after": [1.0, 0.5, 0.4], "small_setting": "paper",
                                                      "warning": "warning: before simulate: load"}
    doc = {"command": "benchmarks/run_all.py --only simulate", "wall_s": 52.0, "benchmarks": [rec],
           "rows": run_all.table_rows([rec]),
           "machine": {"date": "2026-01-01T00:00:00+00:00", "git_commit": "abc", "git_modified": [],
                       "cpu": {"model": "AMD EPYC", "flags": ["avx2", "avx512f"]}, "cores": 2, "cores_available": 2,
                       "kernel": "6.1", "platform": "Linux", "omp_num_threads": "1",
                       "versions": {"python": "3.11.7", "numpy": "2.3.5"}, "load_average_start": [0.1, 0.2, 0.3]}}
    md = run_all.markdown_report(doc)
    for piece in ("AMD EPYC", "avx2, avx512f", "numpy 2.3.5", "`abc`", "OMP_NUM_THREADS=1", "[0.1, 0.2, 0.3]",
                  "| simulate | wall | 50 | s | <= 60 | 0.83 | yes |", "warning: before simulate"):
        assert piece in md


def test_machine_state_has_the_fields():
    m = run_all.machine_state()
    assert m["cores"] >= 1 and "model" in m["cpu"] and isinstance(m["cpu"]["flags"], list)
    assert m["versions"]["python"] and "numpy" in m["versions"] and "pandas" in m["versions"]
    assert m["date"] and len(m["load_average_start"]) == 3


def test_selection_only_and_skip():
    assert [b.name for b in run_all.select()] == list(run_all.NAMES)
    assert [b.name for b in run_all.select("book,oracle")] == ["oracle", "book"]  # run order, not the list's
    assert [b.name for b in run_all.select(skip="ray,control")] == [n for n in run_all.NAMES
                                                                     if n not in ("ray", "control")]
    assert [b.name for b in run_all.select("oracle,book", "book")] == ["oracle"]
    assert run_all.select("tests") == []
    assert run_all.tests_selected(None, None) and run_all.tests_selected("tests,book", None)
    assert not run_all.tests_selected("book", None) and not run_all.tests_selected(None, "tests")
    with pytest.raises(SystemExit, match="unknown benchmark"):
        run_all.select("orcale")


def test_commands_put_json_before_the_pass_through(tmp_path):
    by_name = {b.name: b for b in run_all.BENCHMARKS}
    cmd = run_all.command(by_name["control"], tmp_path / "f.json", tmp_path)
    cut = cmd.index("--")
    assert cmd.index("--json") < cut and cmd[cmd.index("--json") + 1] == str(tmp_path / "f.json")
    assert f"{tmp_path}/bench.json" in cmd[:cut] and "--blocks" in cmd[cut:]
    cmd = run_all.command(by_name["oracle"], tmp_path / "f.json", tmp_path)
    assert cmd[:2] == [sys.executable, str(BENCH_DIR / "bench_oracle.py")] and cmd[-2:] == ["--json",
                                                                                         str(tmp_path / "f.json")]
    book = run_all.command(by_name["book"], tmp_path / "f.json", tmp_path)
    assert "book" in book and book[-2:] == ["--out", str(tmp_path / "book")]
    # the small settings stay small (the served-load benchmark's three server starts added 90 s to 9 minutes)
    assert sum(b.estimate_s for b in run_all.BENCHMARKS) <= 11 * 60


def test_book_figure_from_the_build_log(tmp_path):
    log = tmp_path / "build.log"
    log.write_text("parameters: {}\nexecuted 01_trace.py in 3.5 s\nexecuted 03_final_model.py in 9.0 s\n$ jb\n")
    (fig,), extra = run_all.book_figures(40.0, log)
    assert fig.value == 40.0 and fig.target == run_all.TARGET_BOOK_S and fig.met
    assert extra["sections_s"] == {"01_trace.py": 3.5, "03_final_model.py": 9.0}
    assert "slowest 03_final_model.py 9.0 s" in fig.note
    (t,) = run_all.tests_record(16 * 60)["figures"]
    assert t["value"] == 16 and t["target"] == 15 and t["met"] is False and "given" in t["note"]


def _fake_bench(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "bench_fake.py"
    script.write_text(textwrap.dedent(f"""\
        import argparse, sys, time
        sys.path.insert(0, {str(BENCH_DIR)!r})
        from _figures import Figure, write_figures
        ap = argparse.ArgumentParser()
        ap.add_argument("--json")
        args, rest = ap.parse_known_args()
        print("fake benchmark", rest)
        """) + textwrap.dedent(body))
    return script


def test_run_bench_plumbing_on_a_fake_script(tmp_path):
    """The subprocess, the figure file and the record, with a script that measures nothing."""
    script = _fake_bench(tmp_path, 'write_figures(args.json, [Figure("answer", 42.0, "s", 60.0)], {"rest": rest})\n')
    bench = run_all.Bench("fake", str(script), ("--x", "1", "--", "--y"), timeout_s=60)
    rec = run_all.run_bench(bench, tmp_path / "work", tmp_path, settle_s=0, say=lambda _: None)
    assert rec["status"] == "ok" and rec["returncode"] == 0 and len(rec["load_before"]) == 3
    assert rec["figures"][0]["name"] == "answer" and rec["figures"][0]["ratio"] == 0.7
    assert rec["extra"] == {"rest": ["--x", "1", "--", "--y"]}
    assert "fake benchmark" in (tmp_path / "fake.txt").read_text()


def test_run_bench_reports_a_timeout_and_a_failure(tmp_path):
    slow = run_all.Bench("slow", str(_fake_bench(tmp_path, "time.sleep(30)\n")), timeout_s=1)
    rec = run_all.run_bench(slow, tmp_path / "w1", tmp_path, settle_s=0, say=lambda _: None)
    assert rec["status"] == "timed out after 1 s" and rec["returncode"] is None and rec["wall_s"] < 20
    (tmp_path / "bad").mkdir()
    bad = run_all.Bench("bad", str(_fake_bench(tmp_path / "bad", "raise SystemExit('boom')\n")), timeout_s=30)
    rec = run_all.run_bench(bad, tmp_path / "w2", tmp_path, settle_s=0, say=lambda _: None)
    assert rec["status"] == "failed (exit 1)" and "boom" in rec["stderr_tail"]
    assert run_all.table_rows([rec])[0]["figure"] == "(failed (exit 1))"


SCRIPTS = sorted(BENCH_DIR.glob("bench_*.py"))


def test_every_benchmark_is_in_the_run():
    assert len(SCRIPTS) >= 7
    assert {b.script for b in run_all.BENCHMARKS if b.script} == {p.name for p in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_every_benchmark_accepts_json(script):
    """``--help`` (argparse only: nothing is measured) lists ``--json``."""
    proc = subprocess.run(["nice", "-n", "10", sys.executable, str(script), "--help"], capture_output=True,
                          text=True, timeout=300, cwd=BENCH_DIR.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--json" in proc.stdout, f"{script.name} has no --json option"


def test_run_all_help_and_dry_run():
    out = subprocess.run(["nice", "-n", "10", sys.executable, str(BENCH_DIR / "run_all.py"), "--dry-run",
                          "--only", "oracle,control"], capture_output=True, text=True, timeout=120, check=True).stdout
    lines = out.splitlines()
    assert lines[0].startswith("oracle") and lines[1].startswith("control") and "estimated total" in lines[-1]
