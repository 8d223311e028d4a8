#!/usr/bin/env bash
# The GPU run of the per-expert cost experiment (issue 44): Qwen3-30B-A3B-shaped MoE layers in bf16,
# all 48 layers, m = 1..11, the full range of planted unique experts per m, CUDA graphs and events.
#
#   OUT=/some/folder bash scripts/gpu_expert_cost.sh        # on a CUDA machine, from the repository root
#
# Needs PyTorch with CUDA and numpy (no vLLM, no install: the tree's src/ goes on PYTHONPATH); fits
# with pandas, scipy and statsmodels where present, else writes the timed passes and the fit is made
# afterwards with `benchmarks/bench_expert_cost.py --refit FILE`. About 58 GiB of GPU memory for the
# weights (use --layers N on a smaller GPU: figures are scaled to all layers). The whole run is limited
# to $EXPERT_COST_LIMIT seconds (default 280): repeats stop being started after $EXPERT_COST_TIMING
# seconds of timing (default 150), so a slow machine still writes its file.
# Writes $OUT/h200.json (rename after the device), $OUT/log.txt, $OUT/env.txt, $OUT/nvidia-smi.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-${TMPDIR:-/tmp}/expert_cost}
name=${EXPERT_COST_NAME:-h200}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python}
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "no nvidia-smi" > "$out/nvidia-smi.txt"
"$py" - > "$out/env.txt" 2>&1 <<'EOF'
import torch, numpy
print("torch", torch.__version__, "cuda", torch.version.cuda, "numpy", numpy.__version__)
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
print("grouped_mm", hasattr(torch, "_grouped_mm"))
try:
    import pandas, scipy, statsmodels
    print("fit here: yes")
except ImportError as err:
    print("fit here: no", err)
EOF
cat "$out/env.txt"
timeout "${EXPERT_COST_LIMIT:-280}" "$py" benchmarks/bench_expert_cost.py --device cuda --dtype bfloat16 \
  --m 1-11 --repeats 10 --max-seconds "${EXPERT_COST_TIMING:-150}" --out "$out/$name.json" "$@" 2>&1 \
  | tee "$out/log.txt"
exit "${PIPESTATUS[0]}"
