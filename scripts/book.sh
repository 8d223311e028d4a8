#!/usr/bin/env bash
# Set everything up and build the book on the bundled default trace (or pass speclimits-book options).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh book
.venv/bin/speclimits book "$@"
