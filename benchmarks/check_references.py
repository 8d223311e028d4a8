"""Does plain decoding reproduce a trace's greedy references at each batch size, in a benchmark's blocks?

``speclimits control bench`` records, for prompts of its policy's trace, where plain decoding left the trace's
reference (``reference_parts_at``). A run on prompts outside that trace records nothing, and a later trace of
them (``data/control/twin/fresh/trace``) prices the gap decomposition of that run only where plain decoding in
the run's batches gives the same tokens. This runs vLLM's plain decoding on the prompts in the benchmark's blocks
(:func:`speclimits.bench.control.block_prompts`) at each batch size and reports, per prompt, the first token that
departs from the trace's reference (none: identical)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/check_references.py --trace data/control/twin/fresh/trace \\
        --prompts data/prompts/fresh-heldout.jsonl --target _build/models/target-twin-w1024 --json OUT.json

A real engine run (minutes); deterministic, no timing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from speclimits.bench.control import block_prompts, first_departure, load_tokenizer, trace_generations
from speclimits.bench.engines import build_llm, close, generate, model_len
from speclimits.tracing.prompts import read_prompts, tokenize


def check(trace: Path, prompts_file: Path, target: str, batches: list[int], blocks: int, max_tokens: int
          ) -> dict[str, object]:
    rec = trace_generations(trace)
    prompts = read_prompts(prompts_file)
    missing = [p.id for p in prompts if p.id not in rec]
    if missing:
        raise SystemExit(f"{trace}: no plain-decoding generation of prompts {missing[:5]} (of {prompts_file})")
    tok = load_tokenizer(target)
    ids = [tokenize(p, tok, chat_template=True) for p in prompts]
    out: dict[str, object] = {"prompt_ids_equal": sum(ids[i] == rec[p.id][0] for i, p in enumerate(prompts)),
                              "prompts": len(prompts), "first_departure": {}}
    for b in batches:
        llm = build_llm(target, None, "eagle3", 0, batch=b, extension=False,
                        max_model_len=model_len(max(map(len, ids)), max_tokens, 0))
        parted: dict[str, list[int | None]] = {}
        try:
            for blk in range(blocks):
                idx = block_prompts(ids, b, blk)
                for i, o in zip(idx, generate(llm, [ids[i] for i in idx], max_tokens)):
                    parted.setdefault(prompts[i].id, []).append(first_departure(rec[prompts[i].id][1][:max_tokens], o))
        finally:
            close(llm)
        out["first_departure"][str(b)] = parted
        bad = {k: v for k, v in parted.items() if any(x is not None for x in v)}
        print(f"batch {b}: {sum(len(v) for v in parted.values())} generations of {len(parted)} prompts; "
              f"departing from the trace's reference: {len(bad)} prompts {bad or ''}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, required=True, help="trace with the prompts' plain-decoding generations")
    ap.add_argument("--prompts", type=Path, required=True, help="the benchmark's JSONL prompts")
    ap.add_argument("--target", required=True, help="the target model the benchmark ran")
    ap.add_argument("--batches", default="1,4,8", help="batch sizes (default: 1,4,8)")
    ap.add_argument("--blocks", type=int, default=24, help="blocks per batch size, as the benchmark (default 24)")
    ap.add_argument("--max-tokens", type=int, default=128, help="tokens per request (default 128)")
    ap.add_argument("--json", type=Path, default=None, help="write the first departures here")
    args = ap.parse_args(argv)
    got = check(args.trace, args.prompts, args.target, [int(x) for x in args.batches.split(",")], args.blocks,
                args.max_tokens)
    print(f"prompt token ids equal to the trace's: {got['prompt_ids_equal']} / {got['prompts']}")
    if args.json:
        args.json.write_text(json.dumps({"produced_by": " ".join(["benchmarks/check_references.py", *sys.argv[1:]]),
                                         **got}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
