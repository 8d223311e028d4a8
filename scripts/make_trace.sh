#!/usr/bin/env bash
# Regenerate the measured trace data/traces/measured-eagle3 with the tracing harness (speclimits trace):
# the committed Qwen3-MoE target + EAGLE-3 head (data/models), batch size 1, greedy, K = 0..10
# (K = 0: plain decoding), 128 tokens per generation, on 32 project prompts (data/prompts/speclimits.jsonl,
# 8 per category; Oracle reference = the target's own greedy output) plus 12 held-out corpus passages
# (data/prompts/heldout-corpus.jsonl, Oracle reference = the held-out continuation, teacher-forced).
#   scripts/make_trace.sh [OUT_DIR]        (~15-25 min on 2 CPU cores)
# The memory-bound twin's trace (data/traces/twin-eagle3): the same sweep on the twin (speclimits models twin), with
# the long-context prompts (data/prompts/long-context.jsonl) added:
#   TARGET=_build/models/target-twin-w256 EXTRA_PROMPTS=data/prompts/long-context.jsonl \
#     scripts/make_trace.sh data/traces/twin-eagle3        (~30-40 min; run it alone: the times are the measurement)
# The sampled twin trace (temperature 0.7, K = 0..6, two sampled references per prompt):
#   TARGET=_build/models/target-twin-w1024 EXTRA_PROMPTS=data/prompts/long-context.jsonl K_RANGE=0-6 \
#     TRACE_ARGS="--temperature 0.7 --oracle-samples 2" scripts/make_trace.sh data/traces/twin-eagle3-t07
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-data/traces/measured-eagle3}
target=${TARGET:-data/models/target}
extra=${EXTRA_PROMPTS:-}
ks=${K_RANGE:-0-10}              # K values of the sweep; the Oracle's K_max is the largest
kmax=${ks##*-}
# more `speclimits trace` options, e.g. TRACE_ARGS="--temperature 0.7 --oracle-samples 2" for a sampled sweep
read -r -a trace_args <<< "${TRACE_ARGS:-}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# 8 project prompts per category (32) + 4 held-out passages per domain (12), in file order; the EXTRA_PROMPTS, if
# any, spread evenly among them (so that within each K they are measured at the same times as the others, and a
# drift of the machine during a K's run is not read as an effect of their long contexts)
.venv/bin/python - "$tmp/prompts.jsonl" "$extra" <<'PY'
import json, sys
from collections import Counter
rows, seen = [], Counter()
for path, cap in (("data/prompts/speclimits.jsonl", 8), ("data/prompts/heldout-corpus.jsonl", 4)):
    for line in open(path, encoding="utf-8"):
        r = json.loads(line)
        if seen[r["category"]] < cap:
            seen[r["category"]] += 1
            rows.append(line)
extra = open(sys.argv[2], encoding="utf-8").readlines() if sys.argv[2] else []
out = list(rows)
for i, line in enumerate(extra):  # extra i goes after base prompt round((i + 1) * n / (len(extra) + 1))
    out.insert(round((i + 1) * len(rows) / (len(extra) + 1)) + i, line)
open(sys.argv[1], "w", encoding="utf-8").writelines(out)
PY
# RESUME=1 finishes an interrupted run in OUT_DIR (the same settings), else it starts afresh
if [ "${RESUME:-0}" = 1 ]; then trace_args+=(--resume); else rm -rf "$out"; fi
.venv/bin/speclimits trace --target "$target" --draft data/models/eagle3 --method eagle3 \
  --k "$ks" --prompts "$tmp/prompts.jsonl" --out "$out" --max-tokens 128 --ignore-eos --dtype float32 \
  --seed 0 --oracle --oracle-k-max "$kmax" "${trace_args[@]}"
cp "$tmp/prompts.jsonl" "$out/prompts.jsonl"
.venv/bin/python -m speclimits.models.trace_provenance "$out" --command "TARGET=$target EXTRA_PROMPTS=$extra scripts/make_trace.sh $*" \
  --note "${PROVENANCE_NOTE:-shared 2-core machine: other processes ran during the sweep, so timings carry contention noise; one torch/OpenMP thread}"
.venv/bin/python -m speclimits.regime record "$out" --target "$target" --command "scripts/make_trace.sh $*"
.venv/bin/speclimits validate "$out" || true
