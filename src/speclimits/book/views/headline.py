"""The intro's figure: per regime and batch size, the speed over plain decoding of the best stock static K
and the controller in vLLM (measured: the engine run's ``vs_plain``, geometric mean over all blocks), and of
the real-time bound and the two Oracles (offline: :func:`speclimits.control.decompose.gap_decomposition`'s
speed over the best static K of its own replay, times the measured best stock K's ``vs_plain``, the same
comparison the decomposition's engine row makes). The decompositions (about 3 s each) are cached under
``_build/cache`` by the content of their inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from speclimits.book.views.control import regime_of
from speclimits.book.views.control_runs import BENCH_DIR, TWIN_BENCH_DIR, load_bench_runs
from speclimits.paths import BUILD_DIR, BUNDLED_TRACE, TWIN_TRACE

#: The two regimes: (trace, folder of its engine runs), the memory-bound twin first.
REGIMES = ((TWIN_TRACE, TWIN_BENCH_DIR), (BUNDLED_TRACE, BENCH_DIR))
#: The arm the decomposition follows: the Delta rule with λ fixed (section 8's table).
RULE = "delta-fixed"
#: The five marks, in the legend's order: (label, harness, the decomposition's rung or None).
MARKS = (("best stock K", "measured", None),
         ("controller in vLLM", "measured", None),
         ("real-time bound", "offline", 3),
         ("surrogate Oracle", "offline", 2),
         ("exact Oracle", "offline", 1))
#: Where the decompositions are cached.
CACHE_DIR = BUILD_DIR / "cache" / "gap-decomposition"
#: The decomposition's columns the figure reads (its replay world: point estimates only).
_COLUMNS = ["rung", "name", "speed_replay", "share_replay", "best_static_k_replay"]
#: The package's source the decomposition runs (a change there computes it again).
_CODE = ("control", "oracle", "trace")


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def cache_key(trace: Path, result_path: Path, rule: str = RULE) -> str:
    """The content key of one decomposition: the engine run's JSON, the trace folder's files, the source
    the decomposition runs (:data:`_CODE`, the package's top-level modules, this module) and the rule."""
    pkg = Path(__file__).resolve().parents[2]
    code = sorted(pkg.glob("*.py")) + sorted(p for d in _CODE for p in (pkg / d).rglob("*.py")) + [Path(__file__)]
    data = [Path(result_path)] + sorted(p for p in Path(trace).iterdir() if p.is_file())
    return hashlib.sha256(f"{_digest(data)} {_digest(code)} {rule}".encode()).hexdigest()[:24]


def decomposition_speeds(trace: Any, result: dict[str, Any], rule: str = RULE,
                         cache_dir: Path | None = CACHE_DIR) -> pd.DataFrame:
    """:func:`~speclimits.control.decompose.gap_decomposition` of one engine run (``result``: a parsed
    ``bench-*.json`` with its ``path``) on ``trace``, its :data:`_COLUMNS`, read from ``cache_dir`` where
    computed before. No Monte Carlo or bootstrap: the replay world's point estimates do not depend on them."""
    from speclimits.control.decompose import gap_decomposition
    from speclimits.control.fit import greedy_setup
    from speclimits.control.rules import PolicyFit

    path = cache_dir / f"{cache_key(trace.path, result['path'], rule)}.json" if cache_dir else None
    if path is not None and path.exists():
        return pd.DataFrame(json.loads(path.read_text()))
    fit = PolicyFit.from_dict(result["policy_fit"], origin=str(result["path"]))
    with warnings.catch_warnings():  # empty bootstrap, one rollout: their warnings are about what is not read
        warnings.simplefilter("ignore")
        gap = gap_decomposition(fit, greedy_setup(trace, fit.cost_model), rule=rule, bench=result,
                                n_rollouts=1, n_boot=0)
    out = gap[_COLUMNS].copy()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(out.to_dict("records")))  # every digit (pandas' to_json keeps 10)
        os.replace(tmp, path)  # atomic: a concurrent build reads the whole file or none
    return out


def _arm(result: dict[str, Any], key: str) -> dict[str, Any]:
    return next(r for r in result["summary"] if r["arm"] == key)


def speed_marks(speeds: pd.DataFrame, result: dict[str, Any], rule: str = RULE) -> pd.DataFrame:
    """The five :data:`MARKS` of one engine run (``speeds``: its :func:`decomposition_speeds`): ``mark``,
    ``harness``, ``speed`` over plain decoding, ``over_best_static`` (measured: the ratio of the two
    ``vs_plain``; offline: the decomposition's), ``rung`` and ``batch``."""
    best = result["choice"]["best_stock"]
    base = float(_arm(result, best)["vs_plain"])
    by_rung = speeds.set_index("rung")["speed_replay"].astype(float)
    rows = []
    for label, harness, rung in MARKS:
        if rung is not None:
            over = float(by_rung.loc[rung])
            speed = base * over
        else:
            speed = float(_arm(result, best if label == "best stock K" else rule)["vs_plain"])
            over = speed / base
        rows.append({"mark": label, "harness": harness, "speed": speed, "over_best_static": over,
                     "rung": rung, "batch": int(result["config"]["batch"])})
    return pd.DataFrame(rows)


def headline_speeds(regimes: tuple = REGIMES, batches: tuple[int, ...] | None = None, rule: str = RULE,
                    cache_dir: Path | None = CACHE_DIR) -> tuple[pd.DataFrame, list[str]]:
    """``(rows, notes)``: the :func:`speed_marks` of every engine run fitted on each regime's trace
    (``regimes``: pairs of trace folder and folder of its ``bench-*.json``; ``batches``: those kept, default
    all) with ``regime``, ``machine`` (the CPU that measured it), ``trace``, ``best_static`` (the run's
    choice on its even blocks) and ``source`` (the run's file); a note per regime left out and why."""
    from speclimits.trace import read_trace

    frames, notes = [], []
    for trace_dir, folder in regimes:
        trace_dir = Path(trace_dir)
        if not (trace_dir / "meta.json").exists():
            notes.append(f"{trace_dir.name}: no such trace, its regime is left out")
            continue
        tr = read_trace(trace_dir)
        runs, note = load_bench_runs(tr.meta, folder)
        if not runs:
            notes.append(f"{trace_dir.name}: {note}")
            continue
        for batch, res in sorted(runs.items()):
            if batches is not None and batch not in batches:
                continue
            res = {**res, "path": Path(folder) / res["file"]}
            marks = speed_marks(decomposition_speeds(tr, res, rule, cache_dir), res, rule)
            cpu = res["engine"]["cpu"]
            marks.insert(0, "regime", regime_of(res))
            marks.insert(1, "machine", f"{cpu.get('model', '?')}, {cpu.get('cores', '?')} cores")
            marks["trace"] = trace_dir.name
            marks["best_static"] = res["choice"]["best_stock"]
            marks["source"] = str(Path(folder).relative_to(BENCH_DIR.parent.parent) / res["file"]) \
                if Path(folder).is_relative_to(BENCH_DIR.parent.parent) else res["file"]
            frames.append(marks)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), notes


def caption(rows: pd.DataFrame) -> str:
    """The figure's caption: which harness each mark comes from, the runs and the machines that measured them."""
    runs = "; ".join(f"{regime}: {', '.join(f'`{s}`' for s in dict.fromkeys(g['source']))} on "
                     f"{' and '.join(dict.fromkeys(g['machine']))}"
                     for regime, g in rows.groupby("regime", sort=False))
    traces = ", ".join(f"`{Path(str(t)).name}`" for t in dict.fromkeys(rows["trace"]))
    return ("Speed over plain decoding per batch size, in each regime. **Measured** in vLLM (paired ratio to "
            "plain decoding, geometric mean over all blocks of the run, on the machine each panel names): the "
            "best stock static K (stock vLLM at the K the run chose on its even blocks) and the controller (the "
            "Delta rule with λ fixed, the arm the decomposition follows). **Offline** (the gap decomposition of "
            "{ref}`sec-online-control`: the run's held-out references replayed, priced by its fitted cost model "
            "at batch 1 and by the costs it profiled at batch > 1): the real-time bound (the best rule of the "
            "engine's class fed the true match probabilities, λ chosen in hindsight), the surrogate Oracle and "
            "the exact Oracle (per request at batch > 1); each is its speed over the best static K of the same "
            "replay times the measured best stock K's speed over plain decoding. A measured mark above an "
            f"offline one means the replay's prices are not the engine's. Data: measured traces {traces}; engine "
            f"runs {runs}.")
