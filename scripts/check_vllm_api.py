#!/usr/bin/env python3
"""Check the private vLLM names the speclimits tracer relies on against a vLLM source tree.

    python scripts/check_vllm_api.py                      # the installed vLLM (found, not imported)
    python scripts/check_vllm_api.py --vllm-dir /tmp/vllm033/src   # e.g. an unpacked wheel
    python scripts/check_vllm_api.py --markdown           # Markdown tables (README, notes)

Prints a table (name, where, present, signature as expected, used by) and exits 1 when a
required name is missing or changed. Reads vLLM's source with ``ast``: no CUDA, no vLLM import.
The list itself is :data:`speclimits.tracing.vllm_api.NEEDS`.
"""

import sys
from pathlib import Path

# run from a checkout without installing speclimits
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from speclimits.tracing.vllm_api import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
