"""benchmarks/bench_serve.py: the summary on synthetic per-run files with known answers (no vLLM), and one
``--tiny`` served-load run end to end (marked ``vllm``; in a loopback-only network namespace)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_serve.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_serve", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bs = _load()

#: the machine's speed per repeat: every arm of a repeat shares it, so paired ratios are exact
SPEED = {0: 1.0, 1: 0.8, 2: 1.25}


def run(arm: str, repeat: int, rate: float, thr: float, tpot: float, e2el: float, **extra) -> dict:
    f = SPEED[repeat]
    return {"arm": arm, "repeat": repeat, "request_rate": rate, "output_throughput": thr * f,
            "mean_tpot_ms": tpot / f, "mean_e2el_ms": e2el / f, "request_throughput": thr * f / 100,
            "mean_concurrency": 2.0, **extra}


def synthetic() -> list[dict]:
    """Rate 1: stock:2 has the best throughput and TPOT, stock:1 the best E2E; the controller is 1.1x stock:2's
    throughput, 0.8x its TPOT, 0.9x stock:1's E2E. Rate 2: stock:1 has the best throughput (the controller 0.95x)."""
    out = []
    for rep in SPEED:
        h = [f"h{rep}{i}" for i in range(4)]
        out += [run("plain", rep, 1.0, 100.0, 10.0, 1000.0, generated_text_sha1=h),
                run("stock:1", rep, 1.0, 120.0, 8.0, 900.0, generated_text_sha1=h),
                run("stock:2", rep, 1.0, 150.0, 7.5, 950.0, generated_text_sha1=h[:3] + ["x"]),
                run("delta-fixed", rep, 1.0, 165.0, 6.0, 810.0, generated_text_sha1=h,
                    speclimits_control={"n_rounds": 100 + rep, "mean_k": 2.0 + rep}),
                run("plain", rep, 2.0, 150.0, 12.0, 1500.0),
                run("stock:1", rep, 2.0, 200.0, 9.0, 1200.0),
                run("stock:2", rep, 2.0, 180.0, 8.0, 1300.0),
                run("delta-fixed", rep, 2.0, 190.0, 8.4, 1250.0, speclimits_control={"n_rounds": 50, "mean_k": 1.5})]
    return out


def row(summary, rate, arm):
    return next(r for r in summary["rows"] if r["rate"] == rate and r["arm"] == arm)


def test_summary_known_answer(tmp_path):
    for r in synthetic():
        (tmp_path / bs.run_name(r["repeat"], r["arm"], r["request_rate"])).write_text(json.dumps(r))
    (tmp_path / "summary.json").write_text("{}")  # not a run
    runs = bs.read_runs(tmp_path)
    assert len(runs) == 24
    s = bs.summarize(runs, n_boot=500)
    assert s["rates"] == [1.0, 2.0]
    # the best stock K per rate and metric, chosen on these runs
    assert s["best_stock"]["1"] == {"output_throughput": "stock:2", "mean_tpot_ms": "stock:2",
                                    "mean_e2el_ms": "stock:1"}
    assert s["best_stock"]["2"] == {"output_throughput": "stock:1", "mean_tpot_ms": "stock:2",
                                    "mean_e2el_ms": "stock:1"}
    ctrl = row(s, 1.0, "delta-fixed")
    vb, vp = ctrl["vs_best_stock"], ctrl["vs_plain"]
    # arm / reference: a faster controller has a throughput ratio > 1 and latency ratios < 1
    for got, want in ((vb["output_throughput"], 1.1), (vb["mean_tpot_ms"], 0.8), (vb["mean_e2el_ms"], 0.9),
                      (vp["output_throughput"], 1.65), (vp["mean_tpot_ms"], 0.6), (vp["mean_e2el_ms"], 0.81)):
        assert got["ratio"] == pytest.approx(want) and got["n"] == 3
        assert got["lo"] == pytest.approx(want) and got["hi"] == pytest.approx(want)  # exactly paired: no spread
    assert row(s, 2.0, "delta-fixed")["vs_best_stock"]["output_throughput"]["ratio"] == pytest.approx(0.95)
    assert row(s, 2.0, "delta-fixed")["vs_best_stock"]["mean_tpot_ms"]["ratio"] == pytest.approx(8.4 / 8.0)
    best = row(s, 1.0, "stock:2")["vs_best_stock"]["output_throughput"]
    assert best["ratio"] == pytest.approx(1.0)
    # means over repeats, the controller's rounds, texts equal to plain decoding's
    assert ctrl["output_throughput"] == pytest.approx(165.0 * sum(SPEED.values()) / 3)
    assert ctrl["control_mean_k"] == pytest.approx(3.0) and ctrl["control_rounds"] == pytest.approx(101.0)
    assert [c["mean_k"] for c in ctrl["control_runs"]] == [2.0, 3.0, 4.0]
    assert ctrl["same_text_as_plain"] == 1.0 and row(s, 1.0, "stock:2")["same_text_as_plain"] == 0.75
    assert row(s, 1.0, "plain").get("control_mean_k") is None
    assert [r["arm"] for r in s["rows"] if r["rate"] == 1.0] == ["plain", "stock:1", "stock:2", "delta-fixed"]
    table = bs.summary_table(s)
    assert "rate 1 req/s" in table and "rate 2 req/s" in table
    assert "1.100 [1.100; 1.100]" in table and "tok/s stock:2, TPOT stock:2, E2E stock:1" in table
    figures, _ = bs.figures_of(s)
    assert [round(f.value, 6) for f in figures] == [1.1, 0.8, 0.95, 1.05]


def test_paired_ratio_interval_over_repeats():
    arm = {0: {"m": 1.0}, 1: {"m": 1.1}, 2: {"m": 1.2}, 3: {"m": 2.0}}
    ref = {0: {"m": 1.0}, 1: {"m": 1.0}, 2: {"m": 1.0}}  # repeat 3 has no reference: not paired
    r = bs.paired_ratio(arm, ref, "m", n_boot=1000, seed=1)
    assert r["n"] == 3 and r["ratio"] == pytest.approx((1.0 * 1.1 * 1.2) ** (1 / 3))
    assert 1.0 <= r["lo"] < r["ratio"] < r["hi"] <= 1.2
    one = bs.paired_ratio({0: {"m": 2.0}}, {0: {"m": 1.0}}, "m")
    assert one["ratio"] == 2.0 and math.isnan(one["lo"])
    assert bs.paired_ratio({0: {"m": 2.0}}, {1: {"m": 1.0}}, "m")["n"] == 0


def test_run_names_and_rates():
    assert bs.run_name(0, "stock:3", 0.5) == "r00_stock-3_rate0.5.json"
    assert bs.run_name(2, "delta-fixed", 4.0) == "r02_delta-fixed_rate4.json"
    from speclimits.cliutil import parse_positive_floats

    assert parse_positive_floats("4,0.5,1,1", "--rates", "0.5,1", "rates") == [0.5, 1.0, 4.0]
    for bad in ("", "a", "0", "-1", "inf"):
        with pytest.raises(bs.SpeclimitsError, match="--rates"):
            parse_positive_floats(bad, "--rates", "0.5,1", "rates")


def test_help_says_what_and_how_long():
    out = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert "What it measures" in out and "How long" in out and "--tiny" in out and "--json" in out


@pytest.mark.vllm
def test_tiny_served_load_end_to_end(tmp_path):
    from loopback import QUIET_VLLM_ENV, require

    require("vllm", what="the served-load benchmark")
    out = tmp_path / "serve"
    env = dict(os.environ, **QUIET_VLLM_ENV)
    t0 = time.time()
    proc = subprocess.run([sys.executable, str(BENCH), "--tiny", "--out", str(out), "--json", str(tmp_path / "f.json")],
                          capture_output=True, text=True, env=env, timeout=600)
    logs = "".join(p.read_text()[-1500:] for p in sorted((out / "logs").glob("server-*.log"))) if out.exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs
    first_s = time.time() - t0
    arms = ["plain", "stock:2", "delta-fixed"]
    for arm in arms:
        for rate in (1.0, 4.0):
            doc = json.loads((out / bs.run_name(0, arm, rate)).read_text())
            for field in bs.RUN_FIELDS:
                assert isinstance(doc[field], (int, float)), (arm, rate, field)
            assert doc["completed"] == 4 and doc["failed"] == 0 and doc["total_output_tokens"] == 4 * 16
            assert doc["request_rate"] == rate and doc["arm"] == arm and doc["git_commit"]
            assert len(doc["load_average_before"]) == 3 and doc["machine"]["cpu"]["model"]
            assert "cache_kib" in doc["machine"]["cpu"] and isinstance(doc["machine"]["cpu"]["flags"], list)
            assert len(doc["generated_text_sha1"]) == 4
            if arm == "plain":
                assert "spec_decode_acceptance_rate" not in doc and doc["speclimits_control"] is None
            else:
                assert doc["spec_decode_num_drafts"] > 0 and 0 <= doc["spec_decode_acceptance_rate"] <= 100
            if arm == "delta-fixed":
                c = doc["speclimits_control"]
                # armed by the server's environment (speclimits.control.plugin): its log line
                assert "armed policy delta-fixed of" in c["armed"] and "12 profiling rounds" in c["armed"]
                assert c["policy"] == "delta-fixed" and c["profiled"] and doc["warmup"]["profiled"]
                assert c["n_rounds"] > 0 and 1 <= c["mean_k"] <= 6
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rates"] == [1.0, 4.0] and len(summary["rows"]) == 6
    assert "best stock K" in proc.stdout and "rate 4 req/s" in proc.stdout
    assert len(json.loads((tmp_path / "f.json").read_text())["figures"]) == 4
    # resumable: a rerun finds every file and measures nothing
    t1 = time.time()
    again = subprocess.run([sys.executable, str(BENCH), "--tiny", "--out", str(out)], capture_output=True, text=True,
                           env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert time.time() - t1 < first_s / 2
    assert len(list((out / "logs").glob("server-*.log"))) == 3
