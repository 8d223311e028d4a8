"""Tokens/s with and without the tracing harness, same engine, model and prompts, one run.

One vLLM engine (CPU build, tiny config-only Qwen3-MoE with dummy weights, the target as its
own draft, K=3 by default). Blocks alternate: *untraced* (extension uninstalled; plain
``llm.generate``), *hooks* (extension installed; generate, then drain the step records) and
*traced* (the sweep's full per-generation work: generate, drain, build round and token rows,
write the Parquet parts and the generations line, read vLLM's counters). Each block generates every prompt once; the figure is the median over
blocks of output tokens / wall seconds. Target: <= 5% slowdown on CPU.

    .venv/bin/python benchmarks/bench_tracing_overhead.py [--blocks 5] [--max-tokens 96] [--method draft_model]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=5, help="blocks per mode (alternating)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per block")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--method", choices=("draft_model", "ngram"), default="draft_model")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=32)
    args = ap.parse_args()

    from speclimits.tracing import engine as eng

    eng.require_vllm()
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from speclimits.tracing.prompts import Prompt
    from speclimits.tracing.sweep import SweepConfig, _one_generation
    from speclimits.tracing.tinymodel import write_tiny_moe

    work = Path(tempfile.mkdtemp(prefix="bench-tracing-"))
    model = write_tiny_moe(work / "model", hidden_size=args.hidden, num_hidden_layers=args.layers,
                           num_experts=args.experts, intermediate_size=2 * args.hidden,
                           moe_intermediate_size=args.hidden // 2)
    prompts = [Prompt(f"b{i}", token_ids=tuple((7 * i + 3 * j) % 500 + 2 for j in range(32 + 8 * i)))
               for i in range(args.prompts)]
    kwargs = eng.engine_kwargs(target=model, draft=model, method=args.method, K=args.k, seed=0, dtype="auto",
                               load_format="dummy", max_model_len=512)
    llm, info = eng.make_llm(kwargs)
    cfg = SweepConfig(target=str(model), prompts="-", out=str(work / "trace"), method=args.method,
                      draft=str(model), k_values=[args.k], max_tokens=args.max_tokens, tokens="all",
                      load_format="dummy", progress=False)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, detokenize=False)
    root = work / "trace"
    root.mkdir()

    def untraced() -> float:
        t0 = time.perf_counter()
        n = 0
        for p in prompts:
            out = llm.generate([TokensPrompt(prompt_token_ids=list(p.token_ids))], params, use_tqdm=False)
            n += len(out[0].outputs[0].token_ids)
        return n / (time.perf_counter() - t0)

    def hooks_only() -> float:
        t0 = time.perf_counter()
        n = 0
        for p in prompts:
            out = llm.generate([TokensPrompt(prompt_token_ids=list(p.token_ids))], params, use_tqdm=False)
            llm.collective_rpc("speclimits_drain")
            n += len(out[0].outputs[0].token_ids)
        return n / (time.perf_counter() - t0)

    gid = [0]

    def traced() -> float:
        t0 = time.perf_counter()
        for p in prompts:
            _one_generation(llm, root, cfg, p, list(p.token_ids), gid[0], args.k, keep_tokens=True,
                            top_k=int(info["top_k"]), tokenizer=None)
            gid[0] += 1
        return len(prompts) * args.max_tokens / (time.perf_counter() - t0)

    # warm up both paths
    llm.collective_rpc("speclimits_uninstall")
    untraced()
    llm.collective_rpc("speclimits_install", args=({},))
    traced()
    modes = {"untraced": untraced, "hooks": hooks_only, "traced": traced}
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for b in range(args.blocks):
        order = list(modes) if b % 2 == 0 else list(reversed(modes))
        for mode in order:
            if mode == "untraced":
                llm.collective_rpc("speclimits_uninstall")
            else:
                llm.collective_rpc("speclimits_install", args=({},))
            rates[mode].append(modes[mode]())
    eng.close_llm(llm)
    med = {m: statistics.median(v) for m, v in rates.items()}
    ratios = {m: [t / u for t, u in zip(rates[m], rates["untraced"])] for m in ("hooks", "traced")}
    print(f"model: Qwen3-MoE hidden {args.hidden}, {args.layers} layers, {args.experts} experts top-{info['top_k']}, "
          f"{info['dtype']}, dummy weights; method {args.method}, K={args.k}; {args.prompts} prompts x "
          f"{args.max_tokens} tokens per block, {args.blocks} blocks per mode (alternating)")
    for m in modes:
        print(f"{m:>9}: median {med[m]:8.1f} tok/s   blocks: " + ", ".join(f"{x:.1f}" for x in rates[m]))
    for m, label in (("hooks", "extension hooks only (generate + drain)"),
                     ("traced", "full harness (hooks + rows + Parquet parts + checks)")):
        slow = 100 * (1 - statistics.median(ratios[m]))
        print(f" slowdown, {label}: {slow:+.1f}% (median of per-block ratios; target <= 5%)")


if __name__ == "__main__":
    main()
