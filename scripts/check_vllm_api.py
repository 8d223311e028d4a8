#!/usr/bin/env python3
"""Check the private vLLM names the speclimits tracer relies on against the installed vLLM.

    python scripts/check_vllm_api.py

Imports vLLM's modules and checks each row of :data:`speclimits.tracing.vllm_api.NEEDS` with
``hasattr`` / ``inspect``; prints a Markdown table (module, name, what is relied on, status, used by)
and a verdict line. Exit status 1 when a required name is missing or changed, 2 without vLLM.
"""

import importlib.util
import sys
from pathlib import Path

# run from a checkout without installing speclimits
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from speclimits.tracing.vllm_api import NEEDS, check, describe_missing, installed_version  # noqa: E402


def main() -> int:
    if importlib.util.find_spec("vllm") is None:
        print("check_vllm_api: error: vLLM is not installed in this environment", file=sys.stderr)
        return 2
    missing = check()
    print(f"vLLM {installed_version()}: {len(NEEDS)} rows\n")
    print("| module | name | relies on | status | used by (speclimits/) |\n|---|---|---|---|---|")
    for n in NEEDS:
        status = "; ".join(f"{m.name}: {m.problem}" for m in missing if m.need is n) or "ok"
        status += "" if n.required or status == "ok" else " (optional)"
        cells = [n.module, n.name or "(the module)", ", ".join(n.params + n.kwargs + n.fields + n.keys + n.source),
                 status, n.used_by]
        print("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    required = [m for m in missing if m.need.required]
    print(f"\nFAIL: {describe_missing(required)}" if required else "\nOK: every required name is as expected")
    return 1 if required else 0


if __name__ == "__main__":
    sys.exit(main())
