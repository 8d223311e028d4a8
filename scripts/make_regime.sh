#!/usr/bin/env bash
# The designed experiment for the per-expert cost (data/traces/designed-wN): for the bundled target (expert width
# 64) and its memory-bound twins (speclimits models twin --expert-width N), every target pass of the K = 0..10
# sweep (m = 1..11) routes by a planted routing whose unique experts per layer U are drawn per pass from
# top_k..min(m*top_k, E) (speclimits trace --plant-routing), so alpha(m) is measured with m held fixed and U
# randomised pass by pass. Run it alone on an otherwise idle machine: the pass times are the measurement.
#   scripts/make_regime.sh [WIDTHS...]      (default: 64 128 256 512; about 2-4 minutes per width)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
widths=${*:-64 128 256 512}
for w in $widths; do
  if [ "$w" = 64 ]; then target=data/models/target; else
    target=_build/models/target-twin-w$w
    .venv/bin/speclimits models twin --expert-width "$w" --out "$target"
  fi
  out=data/traces/designed-w$w
  rm -rf "$out"
  .venv/bin/speclimits trace --target "$target" --draft data/models/eagle3 --method eagle3 --k 0-10 \
    --prompts data/prompts/speclimits.jsonl --limit 4 --max-tokens 64 --ignore-eos --dtype float32 --seed 0 \
    --tokens none --plant-routing 0 --out "$out" --quiet
  .venv/bin/python -m speclimits.regime record "$out" --target "$target" --command "scripts/make_regime.sh $w"
done
