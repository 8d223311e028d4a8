#!/usr/bin/env bash
# The designed experiment for the context cost (data/traces/designed-context-w1024): the memory-bound twin at
# K = 0, 1, 3, 5, 7, 10 (m = 1..11) over prompts of planted lengths: the first L tokens (L = 64, 448, 832, 1216)
# of each of the twelve long-context prompts, each prompt a block whose four lengths run back to back in a
# seeded random order (48 generations per K), with planted routing (Ū drawn per pass, independently of L). At
# each fixed m the slope of T_T on L within blocks is c(m), measured by design and away from the machine's
# drift. Which attention path vLLM ran is recorded in meta.json (engine.attention). Run it alone on an
# otherwise idle machine.
#   scripts/make_context_experiment.sh [OUT]      (about 6 minutes on the project's 2-core machine)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
out=${1:-data/traces/designed-context-w1024}
target=_build/models/target-twin-w1024
[ -f "$target/twin.json" ] || .venv/bin/speclimits models twin --expert-width 1024 --out "$target"
mkdir -p _build
.venv/bin/python -m speclimits.regime context-prompts data/prompts/long-context.jsonl --out _build/context-prompts.jsonl
rm -rf "$out"
.venv/bin/speclimits trace --target "$target" --draft data/models/eagle3 --method eagle3 --k 0,1,3,5,7,10 \
  --prompts _build/context-prompts.jsonl --max-tokens 12 --ignore-eos --dtype float32 --seed 0 \
  --tokens none --plant-routing 0 --out "$out" --quiet
.venv/bin/python -m speclimits.regime record "$out" --target "$target" --command "scripts/make_context_experiment.sh"
.venv/bin/python -m speclimits.regime context "$out"
