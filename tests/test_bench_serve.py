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


def test_mixed_runs_compare_greedy_requests_and_each_kind_apart():
    """A mixed run (temperature > 0, some requests greedy): the text check covers its greedy requests only, and
    each kind's E2EL is compared with plain decoding's and the best stock K's (by all requests' E2EL) apart."""
    runs = []
    for rep in SPEED:
        f = SPEED[rep]
        h = [f"h{rep}{i}" for i in range(4)]
        greedy = [0, 2]
        kinds = {"plain": (1000.0, 1200.0), "stock:1": (900.0, 1100.0), "delta-fixed": (800.0, 1210.0)}
        texts = {"plain": h, "stock:1": [h[0], "x", "y", "z"], "delta-fixed": [h[0], "x", h[2], "z"]}
        e2el = {"plain": 1100.0, "stock:1": 1000.0, "delta-fixed": 1005.0}
        for a, (g, smp) in kinds.items():
            runs.append(run(a, rep, 1.0, 100.0, 10.0, e2el[a], temperature=0.7, greedy_requests=greedy,
                            generated_text_sha1=texts[a],
                            by_kind={"greedy": {"n": 2, "mean_e2el_ms": g / f, "mean_tpot_ms": g / f / 100},
                                     "sampled": {"n": 2, "mean_e2el_ms": smp / f, "mean_tpot_ms": smp / f / 100}}))
    s = bs.summarize(runs, n_boot=200)
    assert s["best_stock"]["1"]["mean_e2el_ms"] == "stock:1"
    ctrl, stock = row(s, 1.0, "delta-fixed"), row(s, 1.0, "stock:1")
    # greedy requests 0 and 2: the controller's equal plain's (both), stock's one of two; sampled texts not compared
    assert ctrl["same_text_as_plain"] == 1.0 and stock["same_text_as_plain"] == 0.5
    g, smp = ctrl["by_kind"]["greedy"], ctrl["by_kind"]["sampled"]
    assert g["requests"] == 2 and g["mean_e2el_ms"] == pytest.approx(800.0 * sum(1 / f for f in SPEED.values()) / 3)
    assert g["e2el_vs_plain"]["ratio"] == pytest.approx(0.8) and g["e2el_vs_best_stock"]["ratio"] == pytest.approx(800 / 900)
    assert smp["e2el_vs_plain"]["ratio"] == pytest.approx(1210 / 1200) and smp["e2el_vs_best_stock"]["n"] == 3
    assert "delta-fixed" in bs.summary_table(s) and "greedy requests (2 per run)" in bs.summary_table(s)
    # an all-sampled run's texts are never compared
    assert bs.same_text_share({0: {"temperature": 0.7, "generated_text_sha1": ["a"]}},
                              {0: {"generated_text_sha1": ["a"]}}) is None


def test_greedy_share_picks_and_sends_the_same_requests(capsys):
    """The greedy requests: round(share x n), the same for a seed, others for another; sent with vLLM's client's
    per-request override, which its merge puts over the run's sampling parameters."""
    picks = bs.greedy_requests(24, 0.5, 3)
    assert len(picks) == 12 and picks == sorted(set(picks)) and all(0 <= i < 24 for i in picks)
    assert picks == bs.greedy_requests(24, 0.5, 3) and picks != bs.greedy_requests(24, 0.5, 4)
    assert bs.greedy_requests(24, 0.0, 3) == [] and len(bs.greedy_requests(10, 0.25, 0)) == 2
    assert bs.main(["--out", "/nonexistent/x", "--greedy-share", "0.5"]) == 2  # refused: no --temperature
    assert "--greedy-share must be in [0, 1) and needs --temperature > 0" in capsys.readouterr().err
    # each kind's means from the client's per-request lists (seconds, request order)
    res = {"latencies": [1.0, 2.0, 0.0, 4.0], "ttfts": [0.1, 0.2, 0.0, 0.4], "output_lens": [10, 10, 0, 10]}
    kinds = bs.by_kind(res, [0, 2])
    assert kinds["greedy"] == {"n": 2, "completed": 1, "mean_e2el_ms": 1000.0, "mean_tpot_ms": pytest.approx(100.0)}
    assert kinds["sampled"]["mean_e2el_ms"] == 3000.0 and kinds["sampled"]["mean_tpot_ms"] == pytest.approx(300.0)
    assert bs.by_kind(res, []) is None
    from loopback import require

    require("vllm", what="the mixed served workload's request overrides")
    import vllm.benchmarks.serve as client
    from vllm.benchmarks.datasets import SampleRequest

    made = [SampleRequest(prompt=f"p{i}", prompt_len=1, expected_output_len=4) for i in range(6)]
    orig = client.get_samples
    client.get_samples = lambda *a, **k: made
    try:
        with bs.greedy_overrides([1, 4]):
            sent = client.get_samples(None, None)  # main_async reads the module's get_samples when it runs
        assert client.get_samples(None, None) is made  # undone on exit
    finally:
        client.get_samples = orig
    body = {"temperature": 0.7, "top_p": 0.9}
    temps = [client._merge_overrides(body, r.request_overrides)["temperature"] for r in sent]
    assert temps == [0.7, 0.0, 0.7, 0.7, 0.0, 0.7]
    import inspect

    assert "get_samples(args" in inspect.getsource(client.main_async)  # the name the wrapper replaces


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
    # a mixed workload: half of the requests greedy, half sampled at 0.7, in one stream
    mixed = ["--temperature", "0.7", "--greedy-share", "0.5"]
    proc = subprocess.run([sys.executable, str(BENCH), "--tiny", *mixed, "--out", str(out), "--json",
                           str(tmp_path / "f.json")], capture_output=True, text=True, env=env, timeout=600)
    logs = "".join(p.read_text()[-1500:] for p in sorted((out / "logs").glob("server-*.log"))) if out.exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs
    first_s = time.time() - t0
    arms = ["plain", "stock:2", "delta-fixed"]
    texts = {}
    for arm in arms:
        for rate in (1.0, 4.0):
            doc = json.loads((out / bs.run_name(0, arm, rate)).read_text())
            for field in bs.RUN_FIELDS:
                assert isinstance(doc[field], (int, float)), (arm, rate, field)
            assert doc["completed"] == 4 and doc["failed"] == 0 and doc["total_output_tokens"] == 4 * 16
            assert doc["request_rate"] == rate and doc["arm"] == arm and doc["git_commit"]
            assert len(doc["load_average_before"]) == 3 and doc["machine"]["cpu"]["model"]
            assert "cache_kib" in doc["machine"]["cpu"] and isinstance(doc["machine"]["cpu"]["flags"], list)
            assert len(doc["generated_text_sha1"]) == 4 and doc["temperature"] == 0.7
            assert doc["greedy_requests"] == bs.greedy_requests(4, 0.5, 0) and len(doc["greedy_requests"]) == 2
            assert all(doc["by_kind"][k]["completed"] == 2 and doc["by_kind"][k]["mean_e2el_ms"] > 0
                       for k in ("greedy", "sampled"))
            texts[arm, rate] = doc["generated_text_sha1"]
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
    # the greedy requests' texts equal plain decoding's in every arm; the sampled ones are draws (not all equal)
    assert all(r["same_text_as_plain"] == 1.0 and set(r["by_kind"]) == {"greedy", "sampled"} for r in summary["rows"])
    sampled = [i for i in range(4) if i not in bs.greedy_requests(4, 0.5, 0)]
    assert any(texts[a, q][i] != texts["plain", q][i] for a in arms[1:] for q in (1.0, 4.0) for i in sampled)
    assert "best stock K" in proc.stdout and "rate 4 req/s" in proc.stdout
    assert len(json.loads((tmp_path / "f.json").read_text())["figures"]) == 4
    # resumable: a rerun finds every file and measures nothing
    t1 = time.time()
    again = subprocess.run([sys.executable, str(BENCH), "--tiny", *mixed, "--out", str(out)], capture_output=True, text=True,
                           env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert time.time() - t1 < first_s / 2
    assert len(list((out / "logs").glob("server-*.log"))) == 3
