"""Where things live: defined once, used by the CLI, the book pipeline and the notebooks."""

from __future__ import annotations

import os
from pathlib import Path

#: Root of the source checkout (``src/speclimits/paths.py`` -> three levels up).
REPO_ROOT = Path(__file__).resolve().parents[2]

#: Book sources: jupytext percent notebooks plus ``_config.yml`` / ``_toc.yml`` at the repo root.
BOOK_DIR = REPO_ROOT / "book"
BOOK_CONFIG = REPO_ROOT / "_config.yml"
BOOK_TOC = REPO_ROOT / "_toc.yml"

#: Bundled data.
DATA_DIR = REPO_ROOT / "data"
TRACES_DIR = DATA_DIR / "traces"
#: The models trained here (tokenizer, Qwen3-MoE target, EAGLE-3 head, dense draft): ``speclimits train-models``.
MODELS_DIR = DATA_DIR / "models"
#: The bundled pair: the target and its EAGLE-3 head (the defaults of ``speclimits control bench``).
TARGET_MODEL = MODELS_DIR / "target"
EAGLE3_MODEL = MODELS_DIR / "eagle3"


#: The two regimes (the book's regimes page): the bundled pair as trained is *cache-resident* (a pass costs
#: mostly framework time); its memory-bound twin (``speclimits models twin``: wider experts, the same
#: function) streams its routed experts as the paper's GPU does. Both measured with the same prompts.
BUNDLED_TRACE = TRACES_DIR / "measured-eagle3"
TWIN_TRACE = TRACES_DIR / "twin-eagle3"
#: the designed experiment on the context cost (planted context lengths, planted routing; the twin)
CONTEXT_TRACE = TRACES_DIR / "designed-context-w1024"
#: the same sweep of the twin, measured on other CPUs of the project's kind: an Intel Xeon with AMX (L3 300 MB),
#: and a second AMD EPYC (without AVX-VNNI, L3 32 MB) that also ran the context experiment
TWIN_TRACE_XEON = TRACES_DIR / "twin-eagle3-xeon-amx"
TWIN_TRACE_EPYC_B = TRACES_DIR / "twin-eagle3-epyc-b"
#: the twin's sweep by the machine that measured it (the regimes page's comparison; the first is the reference)
TWIN_TRACES_BY_CPU = {"AMD EPYC A": TWIN_TRACE, "AMD EPYC B": TWIN_TRACE_EPYC_B, "Intel Xeon (AMX)": TWIN_TRACE_XEON}
#: The key results of the book built on the other regime's trace, shown beside this build's
#: (``speclimits.book.present.Contrast``; written by ``scripts/make_contrast.sh``).
REGIME_CONTRAST = DATA_DIR / "regime" / "contrast"

#: The trace the book uses when none is given: the memory-bound twin, the paper's regime. Override with
#: ``SPECLIMITS_TRACE``.
DEFAULT_TRACE = TWIN_TRACE

#: The measured batch sweep (batch sizes x K on the same pair and prompts as the default trace),
#: read by the "Beyond batch 1" section; ``speclimits trace --batch`` writes one.
BATCH_TRACE = TRACES_DIR / "measured-batch"
#: Every bundled batch sweep: the trained pair's and its memory-bound twin's (section 9 shows the one
#: whose target and drafter are those of the page's trace).
BATCH_TRACES = (BATCH_TRACE, TRACES_DIR / "twin-batch")

#: Designed experiments on the per-expert cost of MoE layers (``benchmarks/bench_expert_cost.py``), one
#: JSON per run, read by section 3's panel.
EXPERT_COST_DIR = DATA_DIR / "expert_cost"

#: Build outputs (never committed).
BUILD_DIR = REPO_ROOT / "_build"


def default_trace() -> Path:
    """The trace to analyse when the caller names none (``$SPECLIMITS_TRACE`` wins)."""
    env = os.environ.get("SPECLIMITS_TRACE")
    return Path(env) if env else DEFAULT_TRACE
