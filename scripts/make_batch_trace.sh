#!/usr/bin/env bash
# Measure the batch sweep data/traces/measured-batch with the tracing harness (speclimits trace --batch):
# the committed Qwen3-MoE target + EAGLE-3 head (data/models), greedy, float32, --ignore-eos, 128 tokens per
# generation, K = 0..6 (K = 0: plain decoding) x batch sizes 1, 2, 4, 8, 16 (batch j of size b = prompts
# j*b .. (j+1)*b-1 of the file, submitted together; one engine per K with max_num_seqs = 16, reused across b),
# on the 32 project prompts of the measured trace (data/prompts/speclimits.jsonl, 8 per category, in file
# order: measured-eagle3's prompts without its held-out passages), no token table, no Oracle pass.
#   scripts/make_batch_trace.sh [OUT_DIR [TRACE_ARGS...]]
# TRACE_ARGS go to `speclimits trace` after the defaults (the last of a repeated flag wins), e.g. a quick check:
#   scripts/make_batch_trace.sh /tmp/batch-check --limit 4 --k 0,2 --batch 1,2 --max-tokens 8
# Run it alone on an otherwise idle machine: the step times are the measurement.
# The memory-bound twin's batch sweep (data/traces/twin-batch):
#   TARGET=_build/models/target-twin-w1024 scripts/make_batch_trace.sh data/traces/twin-batch
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-data/traces/measured-batch}
target=${TARGET:-data/models/target}
shift $(( $# > 0 ? 1 : 0 ))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# 8 project prompts per category (32), in file order: the same selection as scripts/make_trace.sh
.venv/bin/python - "$tmp/prompts.jsonl" <<'PY'
import json, sys
from collections import Counter
rows, seen = [], Counter()
for line in open("data/prompts/speclimits.jsonl", encoding="utf-8"):
    r = json.loads(line)
    if seen[r["category"]] < 8:
        seen[r["category"]] += 1
        rows.append(line)
open(sys.argv[1], "w", encoding="utf-8").writelines(rows)
PY
rm -rf "$out"
.venv/bin/speclimits trace --target "$target" --draft data/models/eagle3 --method eagle3 \
  --k 0-6 --batch 1,2,4,8,16 --prompts "$tmp/prompts.jsonl" --out "$out" --max-tokens 128 --ignore-eos \
  --dtype float32 --seed 0 --tokens none "$@"
cp "$tmp/prompts.jsonl" "$out/prompts.jsonl"
.venv/bin/python -m speclimits.models.trace_provenance "$out" --command "TARGET=$target scripts/make_batch_trace.sh $*" \
  --note "${PROVENANCE_NOTE:-run alone on an otherwise idle machine; one torch/OpenMP thread}"
.venv/bin/python -m speclimits.regime record "$out" --target "$target" --command "scripts/make_batch_trace.sh $*"
.venv/bin/speclimits validate "$out"
