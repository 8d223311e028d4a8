"""Record in a measured trace's ``meta.json`` exactly how it was produced (models, prompts, machine, command).

``python -m speclimits.models.trace_provenance TRACE_DIR --command "scripts/make_trace.sh"`` adds a
``provenance`` entry: the git commit, sha256 of every model file used, the models' recorded
metrics (validation loss, acceptance, draft/target cost ratio from ``data/models/meta.json``),
prompt counts per category and reference kind, and the machine (CPU model, core count).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import Counter
from pathlib import Path

from speclimits.paths import MODELS_DIR, REPO_ROOT
from speclimits.errors import SpeclimitsError
from speclimits.jsonutil import read_json
from speclimits.machine import cpu_info
from speclimits.models.twin import file_sha256, relative_path
from speclimits.trace import read_meta, write_meta
from speclimits.trace.prompts import PROMPTS_FILE, read_prompts


DEFAULT_NOTE = ("shared 2-core machine: other processes ran during the sweep, so timings carry contention noise; "
                "one torch/OpenMP thread")


def provenance(trace_dir: Path, command: str, models: Path = MODELS_DIR, note: str = DEFAULT_NOTE) -> dict:
    files = {}
    for sub in ("target", "eagle3"):
        for f in sorted((models / sub).glob("*")):
            if f.suffix in (".safetensors", ".json") and f.name != "train_metrics.json":
                files[f"{sub}/{f.name}"] = file_sha256(f)
    mmeta = read_json(models / "meta.json", "models meta", SpeclimitsError)
    stages = mmeta.get("stages", {})
    prompts = read_prompts(trace_dir / PROMPTS_FILE)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()
    return {
        "command": command,
        "git_commit": commit,
        "models": {"dir": relative_path(models), "sha256": files,
                   "target_valid_loss_nats": stages.get("target", {}).get("valid_loss_nats"),
                   "serve_check": stages.get("serve", {})},
        "prompts": {"file": f"{PROMPTS_FILE} (data/prompts/speclimits.jsonl + data/prompts/heldout-corpus.jsonl)",
                    "by_category": dict(Counter(p.category for p in prompts)),
                    "oracle_reference": {"target greedy output": sum(not p.teacher_forced for p in prompts),
                                         "held-out corpus continuation (teacher-forced)":
                                             sum(p.teacher_forced for p in prompts)}},
        "machine": {**cpu_info(), "python": sys.version.split()[0], "note": note},
        "simulated": False,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--command", default="scripts/make_trace.sh")
    ap.add_argument("--note", default=DEFAULT_NOTE, help="how the machine was used during the sweep")
    args = ap.parse_args(argv)
    meta = read_meta(args.trace)
    meta["provenance"] = provenance(args.trace, args.command, note=args.note)
    write_meta(args.trace, meta)
    print(f"provenance written to {args.trace / 'meta.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
