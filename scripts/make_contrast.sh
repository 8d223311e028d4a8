#!/usr/bin/env bash
# Record the key results of the book built on the bundled (cache-resident) trace, so that a build on the
# memory-bound twin's trace shows them beside its own (speclimits.book.present.Contrast; the regimes page).
#   scripts/make_contrast.sh            (a full book build on data/traces/measured-eagle3: a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
trace=${TRACE:-data/traces/measured-eagle3}
out=data/regime/contrast
build=_build/contrast-book
rm -rf "$build"
.venv/bin/speclimits book --trace "$trace" --out "$build"
rm -rf "$out"
mkdir -p "$out"
cp "$build"/results/*.json "$out"/
.venv/bin/python - "$out" "$trace" <<'PY'
import datetime, json, subprocess, sys
out, trace = sys.argv[1], sys.argv[2]
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
info = {"trace": trace, "column": "Bundled pair (cache-resident)", "applies_to": ["twin-eagle3"],
        "command": "scripts/make_contrast.sh", "git_commit": commit,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "note": "key-results rows of every section of the book built on the bundled pair's measured trace"}
open(f"{out}/contrast.json", "w").write(json.dumps(info, indent=1) + "\n")
PY
echo "wrote $out"
