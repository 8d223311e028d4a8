#!/usr/bin/env bash
# One-command GPU verification of the tracing harness (issue 14).
#
#   scripts/gpu_check.sh [--out DIR] [--compile] [--max-overhead X]     # on a CUDA machine
#   scripts/gpu_check.sh --dry-run [--out DIR]                          # everything but CUDA, on a CPU
#
# On a CUDA machine with only this repository: installs the GPU build of vLLM ($VLLM_VERSION,
# default 0.33.0) with pip into a fresh virtual environment ($GPU_VENV, default
# ${TMPDIR:-/tmp}/speclimits-gpu-venv), builds tiny config-only models (dummy weights), traces a
# short sweep (draft_model self-draft K = 1, 7 and eagle3 K = 3) with CUDA graphs on and with
# enforce_eager, and prints a pass/fail table (see tools/gpu_check.py). The
# whole run is limited to $GPU_CHECK_LIMIT seconds (default 480 = 8 minutes, install included).
# Network: the package registry only (pip); models are local, HF_HUB_OFFLINE=1.
#
# --dry-run uses the project's .venv (or $PYTHON) with vLLM's CPU build: no install, no CUDA; the
# "graphs" runs are eager there and labelled so. Exit status: 0 all checks passed, 1 a check
# failed, 2 could not run (no CUDA without --dry-run, install failed, ...), 124 out of time.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

dry=0
out=""
pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --out) out=$2; shift ;;
    --out=*) out=${1#--out=} ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) pass+=("$1") ;;
  esac
  shift
done
limit=${GPU_CHECK_LIMIT:-480}
out=${out:-${TMPDIR:-/tmp}/speclimits-gpu-check-$(date +%Y%m%d-%H%M%S)}
SECONDS=0

if [ "$dry" = 1 ]; then
  python=${PYTHON:-$repo/.venv/bin/python}
  if [ ! -x "$python" ]; then
    echo "gpu_check: --dry-run needs the project's environment (scripts/setup.sh test) or PYTHON=..." >&2
    exit 2
  fi
  echo "gpu_check: DRY RUN on CPU with $("$python" -c 'import sys; print(sys.executable)')" >&2
else
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no CUDA device (nvidia-smi lists none); use --dry-run to check everything but CUDA" >&2
    exit 2
  fi
  nvidia-smi -L >&2
  base=${PYTHON:-python3}
  venv=${GPU_VENV:-${TMPDIR:-/tmp}/speclimits-gpu-venv}
  vllm_version=${VLLM_VERSION:-0.33.0}
  if [ ! -x "$venv/bin/python" ]; then
    "$base" -m venv "$venv"
  fi
  have=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null || true)
  if [ "$have" = "$vllm_version" ]; then
    echo "gpu_check: vllm $have already in $venv (no install)" >&2
  else
    # speclimits itself runs from src/ (PYTHONPATH); only the tracer's own dependencies are installed.
    # Offline machine: pip honours PIP_NO_INDEX=1 PIP_FIND_LINKS=/path/to/wheels (pip download them elsewhere).
    echo "gpu_check: installing vllm==$vllm_version (GPU build) into $venv ..." >&2
    if ! timeout "$limit" "$venv/bin/python" -m pip install --quiet --progress-bar off \
        "vllm==$vllm_version" "pandas>=2.2" "pyarrow>=15" "tqdm>=4.66"; then
      echo "gpu_check: pip install failed or ran out of time (${SECONDS}s)" >&2
      exit 2
    fi
    echo "gpu_check: installed in ${SECONDS}s" >&2
  fi
  python=$venv/bin/python
fi

export PYTHONPATH=$repo/src${PYTHONPATH:+:$PYTHONPATH}
export VLLM_USE_V2_MODEL_RUNNER=0          # the tracer hooks the V1 runner (the start-up check refuses V2)
export VLLM_ENABLE_V1_MULTIPROCESSING=0    # engine in this process: seconds to start, records in-process
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

left=$((limit - SECONDS))
if [ "$left" -lt 60 ]; then
  echo "gpu_check: only ${left}s left of ${limit}s after the install" >&2
  exit 124
fi
args=(--out "$out")
[ "$dry" = 1 ] && args+=(--dry-run)
set +e
timeout "$left" "$python" "$repo/tools/gpu_check.py" "${args[@]}" ${pass[@]+"${pass[@]}"}
rc=$?
set -e
echo "gpu_check: finished in ${SECONDS}s (limit ${limit}s), exit ${rc}; results in $out/gpu_check.json" >&2
exit $rc
