"""Would the acceptance model gain from what the engine does not read yet? (issue 57, deliverable 2)

The engine's acceptance model chooses among the features the worker computes when it decides
(:data:`speclimits.control.rules.ENGINE_FEATURES`: the draft's top-1 probability, position, the running
product, the request's recent matches). Three more were asked for: the draft's **top-1/top-2 margin** and its
**entropy** at each step, and the **target's top-1 probability** at the last verified position. Oracle mode
records them since commit 1eb1618 (``oracle.parquet``'s ``draft_conf2``, ``draft_entropy``, ``target_conf``);
the committed traces predate it, so the features were traced again on the same references into a features
file (``data/control/twin/features/``, one row per state: ``seq_id``, ``pos``, and ``accept_len`` /
``draft_conf`` to check that the states are the trace's own).

For the policy's train / held-out split of its trace this script

1. runs the model's forward selection (:func:`~speclimits.control.acceptance.fit_acceptance`, grouped folds,
   the same rule for keeping a feature) over the engine's candidates plus the three new ones, and scores on the
   held-out references the engine's model (refitted: the policy's features), the selected model and each new
   feature added alone: AUC, log loss, Brier;
2. replays the Delta rules at batch 1 (the policy's cost model, the references' own greedy walk) fed each
   model's match probabilities, precomputed per state and draft step (the rule's ``raw-confidence`` path; the
   ``history`` feature along the K_max walk, as fitted), each model's rule at its own λ (tuned on the train
   references over :data:`LAMBDA_SCALES`): speed over the best static K, 95 % bootstrap interval over
   references, the selected model's rule over the engine model's, paired, and the share of rounds in which the
   two choose the same k; on the held-out references, and
   on a second trace's references the policy never saw (``--unseen-trace`` with ``--unseen-features``);
3. with ``--bench`` (runs on those unseen prompts), replays the same at batch > 1, the run's blocks, priced with
   the run's profile (:func:`~speclimits.control.offline.batch_replay`), interval over blocks.

Offline and deterministic (no engine, no timing)::

    .venv/bin/python benchmarks/acceptance_features.py --json data/control/twin/features/study.json \\
        --unseen-trace data/control/twin/fresh/trace \\
        --unseen-features data/control/twin/features/fresh-heldout.parquet \\
        --bench data/control/twin/fresh/amd-epyc-c/overhead/bench-batch4.json \\
                data/control/twin/fresh/amd-epyc-c/b8-all/bench-batch8.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from speclimits.bootstrap import draw_counts, percentile_interval
from speclimits.control import acceptance as A
from speclimits.control.decompose import bench_blocks, bench_references
from speclimits.control.fit import greedy_setup
from speclimits.control.offline import batch_replay, rollout, select
from speclimits.control.profile import EngineProfile
from speclimits.control.rules import ENGINE_FEATURES, AcceptanceModel, PolicyFit
from speclimits.errors import SpeclimitsError
from speclimits.oracle.inputs import CostTable, OracleInputs

ROOT = Path(__file__).resolve().parents[1]
#: The new candidates, computed from a features file (:func:`with_trace_features`).
TRACE_FEATURES = ("margin", "entropy", "logit_target_conf")
RULES = ("delta", "delta-fixed")
#: λ over the fit's, the grid each model's rule is tuned on (train references, batch 1): a model's probabilities
#: shift the rule's balance, so each gets its own λ before the comparison
LAMBDA_SCALES = (0.5, 0.625, 0.75, 0.875, 1.0, 1.15, 1.3, 1.5, 1.75, 2.0)
_EPS = 1e-6


def read_features(path: Path) -> pd.DataFrame:
    """A features file indexed by (``seq_id``, ``pos``); an error names the file and the missing columns."""
    df = pd.read_parquet(path)
    need = {"seq_id", "pos", "accept_len", "draft_conf", "draft_conf2", "draft_entropy", "target_conf"}
    if need - set(df.columns):
        raise SpeclimitsError(f"{path}: missing columns {sorted(need - set(df.columns))} (a features file has "
                              f"{sorted(need)}: oracle.parquet of a trace made since commit 1eb1618)")
    return df.assign(seq_id=df["seq_id"].astype(str)).set_index(["seq_id", "pos"]).sort_index()


def with_trace_features(frame: pd.DataFrame, inputs: OracleInputs, feats: pd.DataFrame, origin: str) -> pd.DataFrame:
    """``frame`` (an :func:`~speclimits.control.acceptance.acceptance_frame` of ``inputs``) with the
    :data:`TRACE_FEATURES` of each row's state and draft step: ``margin`` = top-1 − top-2 probability,
    ``entropy`` (nats), ``logit_target_conf``. Every state must be in ``feats`` with the same accepted length and
    top-1 probabilities (else the features belong to other states: an error names the first)."""
    sid = inputs.seq_ids[inputs.seq_index].astype(str)
    keys = pd.MultiIndex.from_arrays([sid, inputs.pos.astype(np.int64)], names=["seq_id", "pos"])
    missing = keys.difference(feats.index)
    if len(missing):
        raise SpeclimitsError(f"{origin}: no features for {len(missing)} states, first {missing[0]}")
    sub = feats.loc[keys]
    conf = np.stack(sub["draft_conf"].to_numpy())
    k = min(conf.shape[1], inputs.draft_conf.shape[1])  # the features may be traced with another K_max
    bad = np.flatnonzero((np.minimum(sub["accept_len"].to_numpy(), k) != np.minimum(inputs.accept_len, k))
                         | (np.abs(conf[:, :k] - inputs.draft_conf[:, :k]).max(axis=1) > 1e-4))
    if bad.size:
        raise SpeclimitsError(f"{origin}: state {keys[bad[0]]} differs from the trace's (accepted length or draft "
                              f"confidences; {bad.size} states in all): these features were traced on other text")
    state, step = frame["state"].to_numpy(), frame["position"].to_numpy().astype(int) - 1
    conf2, ent = np.stack(sub["draft_conf2"].to_numpy()), np.stack(sub["draft_entropy"].to_numpy())
    tc = np.clip(sub["target_conf"].to_numpy(dtype=float), _EPS, 1 - _EPS)
    return frame.assign(margin=frame["conf"].to_numpy() - conf2[state, step], entropy=ent[state, step],
                        logit_target_conf=np.log(tc / (1 - tc))[state])


def match_table(model: AcceptanceModel, inputs: OracleInputs, feats: pd.DataFrame, origin: str) -> np.ndarray:
    """(n, K) the model's match probability at every state and draft step (the rule's inputs); the features must
    cover the model's K_max draft steps."""
    frame = with_trace_features(A.acceptance_frame(inputs, model.walk_k_max, reached_only=False), inputs, feats,
                                origin)
    q = np.zeros((inputs.n_states, model.walk_k_max))
    q[frame["state"].to_numpy(), frame["position"].to_numpy().astype(int) - 1] = A.predict(model, frame)
    return q


def fed(inputs: OracleInputs, q: np.ndarray) -> OracleInputs:
    """``inputs`` whose draft confidences are ``q`` (what the ``raw-confidence`` rule reads as match probabilities)."""
    return replace(inputs, draft_conf=q.astype(inputs.draft_conf.dtype))


def scaled(fit: PolicyFit, scale: float) -> PolicyFit:
    """``fit`` with λ times ``scale`` (in ms, and as the ratio the engine prices a profile's λ by)."""
    return replace(fit, lambda_=fit.lambda_ * scale,
                   lambda_ratio=None if fit.lambda_ratio is None else fit.lambda_ratio * scale)


def tune_lambda(fit: PolicyFit, rule: str, inputs: OracleInputs, q: np.ndarray) -> float:
    """The scale of :data:`LAMBDA_SCALES` whose rule, fed ``q``, takes the least replayed time on ``inputs``
    (the train references, batch 1, the fit's cost model)."""
    x = fed(inputs, q)
    table, accept = CostTable.build(x, fit.cost_model, fit.k_max), inputs.accept_len[None, :].astype(np.int16)
    return min(LAMBDA_SCALES, key=lambda sc: float(
        rollout(scaled(fit, sc).make(rule + ":raw-confidence").bind(x, table), accept)["time_ms"].sum()))


def speeds(times: dict[str, np.ndarray], n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Per arm (not ``static:*``) its speed over the best static K (summed times), 95 % interval over the units."""
    static = [k for k in times if k.startswith("static:")]
    best = min(static, key=lambda k: times[k].sum())
    w = draw_counts(len(times[best]), n_boot, seed)
    out: dict[str, Any] = {"best_static": best}
    for name, t in times.items():
        if name not in static:
            lo, hi = percentile_interval((w @ times[best]) / (w @ t))
            out[name] = {"speed": float(times[best].sum() / t.sum()), "lo": lo, "hi": hi}
    for rule in RULES:  # paired: the selected model's rule against the engine's model's (> 1: the new is faster)
        a, b = times[f"{rule} | engine's model"], times[f"{rule} | selected model"]
        lo, hi = percentile_interval((w @ a) / (w @ b))
        out[f"{rule}: selected over engine's model"] = {"ratio": float(a.sum() / b.sum()), "lo": lo, "hi": hi}
    return out


def batch1(fit: PolicyFit, inputs: OracleInputs, models: dict[str, tuple[np.ndarray, dict[str, float]]]
           ) -> dict[str, Any]:
    """Batch 1, per reference: every static K, each rule calibrated (the engine's default), and each rule fed each
    model's precomputed probabilities at that model's λ scale per rule."""
    table, accept = CostTable.build(inputs, fit.cost_model, fit.k_max), inputs.accept_len[None, :].astype(np.int16)

    def run(name: str, x: OracleInputs, tab: CostTable, f: PolicyFit = fit) -> np.ndarray:
        return rollout(f.make(name).bind(x, tab), accept)["time_ms"].to_numpy()

    times = {f"static:{k}": run(f"static:{k}", inputs, table) for k in range(1, fit.k_max + 1)}
    for rule in RULES:
        times[f"{rule} | calibrated confidence"] = run(rule, inputs, table)
        for label, (q, lam) in models.items():
            x = fed(inputs, q)
            times[f"{rule} | {label}"] = run(rule + ":raw-confidence", x, CostTable.build(x, fit.cost_model, fit.k_max),
                                             scaled(fit, lam[rule]))
    return speeds(times)


def same_k(fit: PolicyFit, inputs: OracleInputs, models: dict[str, tuple[np.ndarray, dict[str, float]]]
           ) -> dict[str, float]:
    """Per rule, the share of the states both models' batch-1 walks visit at which they choose the same k."""
    from speclimits.control.offline import walk_actions

    out = {}
    for rule in RULES:
        acts = []
        for q, lam in models.values():
            x = fed(inputs, q)
            per_seq = []
            for s in range(x.n_sequences):
                sub = x.subset([s])
                pol = scaled(fit, lam[rule]).make(rule + ":raw-confidence")
                per_seq.append(walk_actions(pol.bind(sub, CostTable.build(sub, fit.cost_model, fit.k_max)), sub))
            acts.append(np.concatenate(per_seq))
        both = ~np.isnan(acts[0]) & ~np.isnan(acts[1])
        out[rule] = float((acts[0][both] == acts[1][both]).mean())
    return out


def batch_b(fit: PolicyFit, inputs: OracleInputs, models: dict[str, tuple[np.ndarray, dict[str, float]]],
            bench: dict[str, Any]) -> dict[str, Any]:
    """Batch > 1: the run's blocks replayed alone, priced with its profile (as the gap decomposition does)."""
    prof = EngineProfile.from_dict(bench["profile"])
    priced = prof.priced(fit)
    groups = bench_blocks(bench, inputs.seq_ids)[0]

    def run(name: str, x: OracleInputs, f: PolicyFit = priced) -> np.ndarray:
        return np.array([batch_replay(f, x, [g], [name], prof)[name]["ms_per_token"]
                         * float(inputs.n_tokens[g].sum()) for g in groups])

    times = {f"static:{k}": run(f"static:{k}", inputs) for k in range(1, fit.k_max + 1)}
    for rule in RULES:
        times[f"{rule} | calibrated confidence"] = run(rule, inputs)
        for label, (q, lam) in models.items():
            times[f"{rule} | {label}"] = run(rule + ":raw-confidence", fed(inputs, q), prof.priced(scaled(fit, lam[rule])))
    return {"batch": prof.batch, "blocks": len(groups), **speeds(times)}


def study(policy: Path, features: Path, unseen: tuple[Path, Path] | None = None, benches: list[Path] = ()
          ) -> dict[str, Any]:
    """Steps 1–3 of the module docstring for the policy file ``policy`` and the features of its trace; ``unseen``:
    ``(trace, features)`` of prompts the policy never saw; ``benches``: runs on those prompts (batch > 1)."""
    fit = PolicyFit.read(policy)
    setup = greedy_setup(ROOT / fit.data["trace"], fit.cost_model)
    feats = read_features(features)
    train, _ = select(setup, list(fit.train_seq_ids))
    test, _ = select(setup, list(fit.test_seq_ids))
    frames = {name: with_trace_features(A.acceptance_frame(x, fit.k_max), x, feats, str(features))
              for name, x in (("train", train), ("test", test))}
    engine = A._fit_lr(frames["train"], list(fit.acceptance.features) if fit.acceptance else ["logit_conf"],
                       fit.k_max)
    selected = A.fit_acceptance(frames["train"], fit.k_max, candidates=tuple(ENGINE_FEATURES) + TRACE_FEATURES)
    scored = {f"engine's features ({' + '.join(engine.features)})": engine,
              f"selected ({' + '.join(selected.features)})": selected}
    for f in TRACE_FEATURES:
        scored[f"engine's + {f}"] = A._fit_lr(frames["train"], list(engine.features) + [f], fit.k_max)
    y = frames["test"]["matched"]
    out: dict[str, Any] = {
        "policy": str(policy), "features": str(features), "trace": fit.data["trace"],
        "references": {"train": train.n_sequences, "held_out": test.n_sequences},
        "selection": [list(s) for s in selected.selection], "selected": list(selected.features),
        "held_out_scores": {name: A.metrics(y, A.predict(m, frames["test"])) for name, m in scored.items()},
        "coefficients": {"selected": dict(zip(selected.features, selected.coef)), "intercept": selected.intercept}}
    fed_models = {"engine's model": engine, "selected model": selected}
    lam = {k: {r: tune_lambda(fit, r, train, match_table(m, train, feats, str(features))) for r in RULES}
           for k, m in fed_models.items()}
    out["lambda_scales"] = lam

    def tables(x: OracleInputs, f: pd.DataFrame, origin: str) -> dict[str, tuple[np.ndarray, dict[str, float]]]:
        return {k: (match_table(m, x, f, origin), lam[k]) for k, m in fed_models.items()}

    out["batch1_held_out"] = batch1(fit, test, tables(test, feats, str(features)))
    out["same_k_held_out"] = same_k(fit, test, tables(test, feats, str(features)))
    if unseen is not None:
        u_trace, u_feats_path = unseen
        u_setup = greedy_setup(u_trace, fit.cost_model)
        u_feats = read_features(u_feats_path)
        u_all, _ = select(u_setup, [str(s) for s in u_setup.raw_inputs.seq_ids])
        u_frame = with_trace_features(A.acceptance_frame(u_all, fit.k_max), u_all, u_feats, str(u_feats_path))
        out["unseen"] = {"trace": str(u_trace), "references": u_all.n_sequences,
                         "scores": {name: A.metrics(u_frame["matched"], A.predict(m, u_frame))
                                    for name, m in scored.items()}}
        out["unseen"]["batch1"] = batch1(fit, u_all, tables(u_all, u_feats, str(u_feats_path)))
        out["unseen"]["same_k"] = same_k(fit, u_all, tables(u_all, u_feats, str(u_feats_path)))
        out["unseen"]["runs"] = {}
        for b in benches:
            bench = json.loads(Path(b).read_text())
            ids = bench_references(bench)
            sub, _ = select(u_setup, ids)
            out["unseen"]["runs"][str(b)] = batch_b(fit, sub, tables(sub, u_feats, str(u_feats_path)), bench)
    return out


def _speed_lines(title: str, res: dict[str, Any]) -> list[str]:
    lines = [f"{title} (best static K: {res['best_static'].split(':')[1]})"]
    for name, r in res.items():
        if isinstance(r, dict) and ("speed" in r or "ratio" in r):
            lines.append(f"  {name:50s} {r.get('speed', r.get('ratio')):.3f} [{r['lo']:.3f}; {r['hi']:.3f}]")
    return lines


def report(out: dict[str, Any]) -> str:
    lines = [f"forward selection (held-out log loss per step, grouped folds): "
             + " -> ".join(f"{f} {v:.4f}" for f, v in out["selection"]), "",
             f"held-out references ({out['references']['held_out']}): auc / log loss / brier"]
    for name, m in out["held_out_scores"].items():
        lines.append(f"  {name:50s} {m['auc']:.3f} / {m['log_loss']:.4f} / {m['brier']:.4f}")
    lines += ["", "batch 1, held-out references: share of rounds (states both walks visit) where the two models' "
              "rules choose the same k: " + ", ".join(f"{r} {v:.3f}" for r, v in out["same_k_held_out"].items())]
    lines += ["", "λ over the fit's, tuned per model and rule on the train references: "
              + "; ".join(f"{k}: " + ", ".join(f"{r} {v:g}" for r, v in d.items()) for k, d in out["lambda_scales"].items()),
              "", *_speed_lines("batch 1, held-out references: speed over the best static K", out["batch1_held_out"])]
    if "unseen" in out:
        u = out["unseen"]
        lines += ["", f"unseen prompts ({u['references']}, {u['trace']}): auc / log loss / brier"]
        for name, m in u["scores"].items():
            lines.append(f"  {name:50s} {m['auc']:.3f} / {m['log_loss']:.4f} / {m['brier']:.4f}")
        lines += ["", *_speed_lines("batch 1, unseen prompts", u["batch1"]),
                  "  same k (states both walks visit): " + ", ".join(f"{r} {v:.3f}" for r, v in u["same_k"].items())]
        for path, r in u["runs"].items():
            lines += ["", *_speed_lines(f"batch {r['batch']}, {r['blocks']} blocks of {path}", r)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", type=Path, default=ROOT / "data/control/twin/fresh/policy.json")
    ap.add_argument("--features", type=Path, default=ROOT / "data/control/twin/features/twin-eagle3.parquet",
                    help="features of the policy's trace (default: the twin's)")
    ap.add_argument("--unseen-trace", type=Path, help="a trace of prompts the policy never saw")
    ap.add_argument("--unseen-features", type=Path, help="its features file")
    ap.add_argument("--bench", type=Path, nargs="*", default=[], help="benchmark runs on the unseen prompts (batch > 1)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    if (args.unseen_trace is None) != (args.unseen_features is None):
        ap.error("--unseen-trace and --unseen-features go together")
    if args.bench and args.unseen_trace is None:
        ap.error("--bench needs --unseen-trace (the runs' prompts)")
    try:
        out = study(args.policy, args.features, (args.unseen_trace, args.unseen_features) if args.unseen_trace else None,
                    args.bench)
    except SpeclimitsError as exc:
        print(f"acceptance_features: {exc}", file=sys.stderr)
        return 2
    out["produced_by"] = "benchmarks/acceptance_features.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(report(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
