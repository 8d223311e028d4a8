"""Serve the trained pair with plain vLLM (CPU): acceptance per position, timings, and the K=1 agreement check.

Run as ``python -m speclimits.models.serve_check generate|check REQUEST.json RESULT.json`` with
``VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_OMP_THREADS_BIND=nobind``
(the pipeline does this). ``generate`` writes the target's greedy continuations of token-id
prompts; ``check`` serves the prompts file with no speculation, eagle3 (K=1 and K=k_max), the
dense draft and ngram, and records

* acceptance per draft position from vLLM's own counters
  (``vllm:spec_decode_num_accepted_tokens_per_pos`` / ``vllm:spec_decode_num_drafts``; for ngram
  this is conditional on a draft being proposed),
* at batch 1: the target forward (``_model_forward``) per number of verified rows and the
  drafter call (``propose_draft_token_ids``) per K, from wrappers on the V1 CPU model runner,
* the greedy outputs, so that :func:`agreement_check` can compare the head's offline
  teacher-forced agreement with vLLM's K=1 acceptance.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

from speclimits.trace.prompts import read_prompts
from speclimits.tracing.engine import spec_counters

_TIMES: dict[str, list] = {"forward": [], "propose": []}


def _install_timers(worker) -> bool:
    """Wrap the runner's target forward and drafter call (in-process engine) to time them."""
    runner = worker.model_runner
    fwd = runner._model_forward

    def timed_forward(*args, **kwargs):
        rows = kwargs.get("input_ids", args[0] if args else None)
        t = time.perf_counter()
        out = fwd(*args, **kwargs)
        _TIMES["forward"].append((int(rows.shape[0]) if rows is not None else -1, time.perf_counter() - t))
        return out

    runner._model_forward = timed_forward
    if hasattr(runner, "propose_draft_token_ids"):
        prop = runner.propose_draft_token_ids

        def timed_propose(*args, **kwargs):
            t = time.perf_counter()
            out = prop(*args, **kwargs)
            _TIMES["propose"].append(time.perf_counter() - t)
            return out

        runner.propose_draft_token_ids = timed_propose
    return True


def _engine(model: str, spec: dict | None, seed: int, max_len: int = 1024):
    from vllm import LLM

    return LLM(model=model, speculative_config=spec, enforce_eager=True, distributed_executor_backend="uni",
               block_size=32, max_model_len=max_len, dtype="float32", seed=seed, disable_log_stats=False,
               enable_prefix_caching=False, gpu_memory_utilization=0.5)


def _greedy(max_tokens: int):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def generate(req: dict) -> dict:
    from vllm.inputs import TokensPrompt

    llm = _engine(req["model"], None, req.get("seed", 0))
    out, n_tok, t0 = {}, 0, time.perf_counter()
    for split, prompts in req["prompts"].items():
        res = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], _greedy(req["max_tokens"]),
                           use_tqdm=False)
        out[split] = [list(r.outputs[0].token_ids) for r in res]
        n_tok += sum(len(o) for o in out[split])
    out["tokens_per_second"] = round(n_tok / (time.perf_counter() - t0), 1)
    print(f"RESULT generated {n_tok} tokens at {out['tokens_per_second']} tok/s")
    return out


def pick_prompts(path: str | Path, n: int) -> list[dict]:
    """``n`` prompts of the prompts JSONL (:func:`speclimits.trace.prompts.read_prompts`) spread over
    categories (round robin in file order), as ``id``, ``category``, ``prompt``; each needs text and a category."""
    by_cat: dict[str, list[dict]] = {}
    for p in read_prompts(path):
        if p.text is None or p.category is None:
            raise ValueError(f"{path}: prompt {p.id!r} needs 'prompt' text and a 'category'")
        by_cat.setdefault(p.category, []).append({"id": p.id, "category": p.category, "prompt": p.text})
    n = min(n, sum(map(len, by_cat.values())))
    picked, i = [], 0
    while len(picked) < n:
        for cat in sorted(by_cat):
            if i < len(by_cat[cat]) and len(picked) < n:
                picked.append(by_cat[cat][i])
        i += 1
    return picked


def _timed_runs(llm, prompts, max_tokens: int) -> dict:
    """Batch-1 generation of each prompt; median target forward per row count and drafter call (ms)."""
    _TIMES["forward"].clear()
    _TIMES["propose"].clear()
    for p in prompts:
        llm.generate([p], _greedy(max_tokens), use_tqdm=False)
    by_rows: dict[int, list[float]] = {}
    for rows, secs in _TIMES["forward"]:
        by_rows.setdefault(rows, []).append(secs * 1e3)
    fwd = {str(r): round(float(np.median(v)), 3) for r, v in sorted(by_rows.items()) if len(v) >= 5 and r <= 16}
    prop = round(float(np.median(_TIMES["propose"])) * 1e3, 3) if _TIMES["propose"] else None
    return {"forward_ms_by_rows": fwd, "propose_ms": prop, "n_forward": len(_TIMES["forward"])}


def check(req: dict) -> dict:
    from vllm.inputs import TokensPrompt

    rows = pick_prompts(req["prompts"], req["n_prompts"])
    k_max, max_tokens, seed = req["k_max"], req["max_tokens"], req.get("seed", 0)
    runs = {
        "plain": None,
        "eagle3_k1": {"method": "eagle3", "model": req["eagle3"], "num_speculative_tokens": 1},
        "eagle3_k3": {"method": "eagle3", "model": req["eagle3"], "num_speculative_tokens": 3},
        f"eagle3_k{k_max}": {"method": "eagle3", "model": req["eagle3"], "num_speculative_tokens": k_max},
        "dense_k1": {"method": "draft_model", "model": req["dense"], "num_speculative_tokens": 1},
        f"dense_k{k_max}": {"method": "draft_model", "model": req["dense"], "num_speculative_tokens": k_max},
        f"ngram_k{k_max}": {"method": "ngram", "num_speculative_tokens": k_max, "prompt_lookup_min": 2,
                            "prompt_lookup_max": 4},
    }
    result: dict = {"prompts": [r["id"] for r in rows], "max_tokens": max_tokens, "acceptance": {}, "timing_ms": {},
                    "tokens_per_second_batched": {}}
    for name, spec in runs.items():
        llm = _engine(req["target"], spec, seed)
        tok = llm.get_tokenizer()
        prompts = [TokensPrompt(prompt_token_ids=tok.encode(r["prompt"], add_special_tokens=False)) for r in rows]
        llm.generate(prompts[:1], _greedy(8), use_tqdm=False)  # warm up (ngram JIT, first-use compiles)
        before = spec_counters(llm)
        t0 = time.perf_counter()
        res = llm.generate(prompts, _greedy(max_tokens), use_tqdm=False)
        secs = time.perf_counter() - t0
        after = spec_counters(llm)
        result["tokens_per_second_batched"][name] = round(len(rows) * max_tokens / secs, 1)
        if name == "plain":
            result["greedy_outputs"] = [{"id": r["id"], "prompt_ids": list(p["prompt_token_ids"]),
                                         "output_ids": list(o.outputs[0].token_ids)}
                                        for r, p, o in zip(rows, prompts, res)]
        else:
            drafts = after["drafts"] - before["drafts"]
            per_pos = [a - b for a, b in zip(after["per_pos"], before["per_pos"] or [0] * len(after["per_pos"]))]
            acc = after["accepted"] - before["accepted"]
            result["acceptance"][name] = {
                "drafts": drafts, "draft_tokens": after["drafted"] - before["drafted"], "accepted": acc,
                "per_position": [round(x / drafts, 4) if drafts else None for x in per_pos],
                "mean_accepted_length": round(1 + acc / drafts, 4) if drafts else None}
            print(f"RESULT {name}: acceptance per position {result['acceptance'][name]['per_position']}")
        llm.collective_rpc(_install_timers)
        result["timing_ms"][name] = _timed_runs(llm, prompts[: req["timing_prompts"]], max_tokens)
        print(f"RESULT {name}: batch-1 timing {result['timing_ms'][name]}")
        del llm
        gc.collect()
    result["ratios"] = cost_ratios(result["timing_ms"], k_max)
    print(f"RESULT ratios: {result['ratios']}")
    return result


def cost_ratios(timing: dict, k_max: int) -> dict:
    """Draft-step cost relative to a one-token target forward (batch 1), and the per-row verification cost."""
    one = timing["plain"]["forward_ms_by_rows"].get("1")
    out: dict = {"target_forward_1_row_ms": one}
    for drafter in ("eagle3", "dense"):
        p1 = timing.get(f"{drafter}_k1", {}).get("propose_ms")
        pk = timing.get(f"{drafter}_k{k_max}", {}).get("propose_ms")
        if p1 and pk and one:
            marginal = (pk - p1) / (k_max - 1)
            out[drafter] = {"propose_k1_ms": p1, f"propose_k{k_max}_ms": pk,
                            "mean_step_ms": round(pk / k_max, 3), "marginal_step_ms": round(marginal, 3),
                            "mean_step_over_target_forward": round(pk / k_max / one, 4),
                            "k1_call_over_target_forward": round(p1 / one, 4)}
    rows = {}
    for name, t in timing.items():
        if name.startswith("eagle3") or name == "plain":
            for r, ms in t["forward_ms_by_rows"].items():
                rows.setdefault(int(r), []).append(ms)
    if len(rows) >= 2:
        r = np.array(sorted(rows))
        ms = np.array([np.median(rows[k]) for k in r])
        slope, intercept = np.polyfit(r, ms, 1)
        out["verification"] = {"forward_ms_by_rows": {int(k): round(float(v), 3) for k, v in zip(r, ms)},
                               "per_row_ms": round(float(slope), 4), "intercept_ms": round(float(intercept), 3)}
    return out


def agreement_check(target_dir: str | Path, head_dir: str | Path, greedy_outputs: list[dict],
                    vllm_k1_acceptance: float) -> dict:
    """Offline teacher-forced first-step agreement of the head on vLLM's greedy outputs vs vLLM's K=1 acceptance.

    For each prompt ``P`` and greedy output ``y``, the head at origin ``p`` (target features of
    position ``p``, token ``p + 1``) drafts the token at ``p + 2``; vLLM drafts every generated
    token after the first, so origins with ``p + 2`` in ``[|P| + 1, |P| + |y| - 1]`` are scored
    against ``y``.
    """
    import torch

    from speclimits.models.eagle3 import build_cache, load_head
    from speclimits.models.target import load_target

    target = load_target(target_dir)
    head, d2t_ids, aux_ids = load_head(head_dir)
    embed = target.get_input_embeddings()
    hits = total = 0
    for g in greedy_outputs:
        seq = np.array([g["prompt_ids"] + g["output_ids"]])
        cache = build_cache(target, seq, aux_ids, batch=1)
        with torch.no_grad():
            logits = head.unroll(embed(cache.ids), cache.aux, 1)[0][0]
        pred = d2t_ids[logits.argmax(-1)].numpy()  # pred[p] drafts token p + 2
        n_p, ids = len(g["prompt_ids"]), seq[0]
        pos = np.arange(n_p + 1, len(ids))
        hits += int((pred[pos - 2] == ids[pos]).sum())
        total += pos.size
    offline = hits / total
    return {"offline_teacher_forced_step1": round(offline, 4), "vllm_k1_acceptance": vllm_k1_acceptance,
            "difference": round(offline - vllm_k1_acceptance, 4), "positions": total}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("generate", "check"):
        print("usage: python -m speclimits.models.serve_check generate|check REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    req = json.loads(Path(argv[1]).read_text())
    res = generate(req) if argv[0] == "generate" else check(req)
    Path(argv[2]).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
