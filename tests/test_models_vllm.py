"""The committed pair runs in vLLM: EAGLE-3 speculation leaves greedy outputs unchanged and accepts drafts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from speclimits.paths import MODELS_DIR

MODELS = MODELS_DIR
pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not (MODELS / "eagle3" / "model.safetensors").exists(), reason="models not built")]

SCRIPT = r"""
import json, sys
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from speclimits.tracing.engine import spec_counters

if __name__ == "__main__":
    target, head = sys.argv[1], sys.argv[2]
    prompts = ["def main(argv=None):\n    if argv is None:\n", "ОПИСАНИЕ\nФункция malloc() выделяет "]
    sp = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    out = {}
    for name, spec in (("plain", None),
                       ("eagle3", {"method": "eagle3", "model": head, "num_speculative_tokens": 3})):
        llm = LLM(model=target, speculative_config=spec, enforce_eager=True, distributed_executor_backend="uni",
                  block_size=32, max_model_len=512, dtype="float32", seed=0, disable_log_stats=False)
        res = llm.generate(prompts, sp, use_tqdm=False)
        out[name] = [list(r.outputs[0].token_ids) for r in res]
        if spec:
            out["counters"] = spec_counters(llm)
        del llm
    print("RESULT " + json.dumps(out))
"""


def test_eagle3_speculation_is_lossless_and_accepts(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script), str(MODELS / "target"), str(MODELS / "eagle3")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[7:])
    assert out["eagle3"] == out["plain"]  # greedy speculative decoding must not change the output
    c = out["counters"]
    assert c["drafts"] > 0 and len(c["per_pos"]) == 3
    assert c["per_pos"][0] / c["drafts"] > 0.3  # the trained head is far better than chance
    assert c["per_pos"][0] >= c["per_pos"][1] >= c["per_pos"][2]
