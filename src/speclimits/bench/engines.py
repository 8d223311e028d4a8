"""Engines for the controller, built with the tracing harness's engine arguments
(:func:`speclimits.tracing.engine.engine_kwargs`), the worker extension replaced by
:class:`~speclimits.control.extension.ControlWorkerExtension` (which is also the tracer).
"""

from __future__ import annotations

import sys
from typing import Any

from speclimits.machine import cpu_info, engine_dtype
from speclimits.tracing import engine as eng
from speclimits.tracing.inputs import model_config

EXTENSION = "speclimits.control.extension.ControlWorkerExtension"


def build_llm(target: str, draft: str | None, method: str, k: int, *, batch: int = 1, load_format: str = "auto",
              max_model_len: int = 1024, seed: int = 0, dtype: str = "float32", extension: bool = True,
              max_num_batched_tokens: int | None = None) -> Any:
    """``vllm.LLM`` with the control extension (``extension=False``: stock, the same arguments without it); ``k =
    0``: a plain engine. ``max_num_batched_tokens``: vLLM's token budget per step (None: vLLM's default)."""
    vllm = eng.require_vllm()
    eng.check_vllm_api()
    choice = engine_dtype(None, model_config(target), cpu_info()["flags"], dtype)  # an MLA target on AMX: bfloat16
    if choice.reason:
        print(f"speclimits control bench: {choice.reason}", file=sys.stderr)
    dtype = choice.dtype
    kw = eng.engine_kwargs(target=target, draft=draft, method=method, K=k, seed=seed, dtype=dtype,
                           load_format=load_format, max_model_len=max_model_len, max_num_seqs=batch,
                           extra={"max_num_batched_tokens": int(max_num_batched_tokens)}
                           if max_num_batched_tokens else None)
    if extension:
        kw["worker_extension_cls"] = EXTENSION
        eng.detach_worker_extensions()  # an earlier engine in this process may have mixed in the tracer
    else:
        kw.pop("worker_extension_cls", None)
    return vllm.LLM(**kw)


def model_len(longest_prompt: int, max_tokens: int, k_max: int) -> int:
    """``max_model_len`` with room for the longest prompt, its output and a full draft, in whole KV blocks of 32
    tokens (the block size of :func:`build_llm`)."""
    return -(-(int(longest_prompt) + int(max_tokens) + int(k_max) + 1) // 32) * 32


def generate(llm: Any, prompts: list[list[int]], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
             seeds: list[int] | None = None, greedy: list[bool] | None = None) -> list[list[int]]:
    """Outputs (token ids, ``ignore_eos``) of token-id prompts, in prompt order: greedy, or sampled at
    ``temperature`` and ``top_p`` with one seed per prompt (``seeds``); ``greedy``: per prompt, True for a
    greedy request among sampled ones (a mixed batch)."""
    from vllm import SamplingParams  # vLLM is optional and heavy: imported only where an engine runs
    from vllm.inputs import TokensPrompt

    kw = dict(max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    if temperature > 0:
        flags = greedy or [False] * len(prompts)
        params: Any = [SamplingParams(temperature=0.0, **kw) if g else
                       SamplingParams(temperature=temperature, top_p=top_p, seed=s, **kw)
                       for s, g in zip(seeds or range(len(prompts)), flags)]
    else:
        params = SamplingParams(temperature=0.0, **kw)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def close(llm: Any) -> None:
    """Shut the engine down (so that the next one can be built in this process)."""
    try:
        llm.collective_rpc("speclimits_control_uninstall")
    except Exception:  # noqa: BLE001 - best effort on teardown (a plain engine has nothing installed)
        pass
    eng.close_llm(llm)
