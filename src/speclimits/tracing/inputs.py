"""Input checks of ``speclimits trace`` that run before vLLM is imported (this module imports neither vLLM
nor torch), each raising a one-line :class:`~speclimits.errors.SpeclimitsError` naming the flag, the file or
the prompt; and :func:`drafted_nothing`, what the command says about a finished sweep.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from speclimits.cliutil import parse_assignments, parse_batch_sizes, parse_int_list
from speclimits.errors import SpeclimitsError

#: What a Hugging Face repo id looks like (``name`` or ``org/name``); anything else must be a folder.
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


def parse_k(spec: str) -> list[int]:
    """``"1-10"``, ``"0,1,2,4"`` or ``"0,2-4"`` -> sorted unique list of K >= 0 (``--k``)."""
    return parse_int_list(spec, "--k", "'1-10' or '0,1,2,4'", "K", 0)


def check_trace_inputs(args: Any) -> tuple[list[int], list[int]]:
    """The checks of ``speclimits trace`` that need neither vLLM nor an engine (the K and batch lists, the
    model paths, the sampling and Oracle flags, the prompts against the target's ``vocab_size``); returns
    the parsed K values and batch sizes."""
    from speclimits.trace.prompts import read_prompts  # the one reader of prompt files

    k_values = parse_k(args.k)
    batch_sizes = parse_batch_sizes(args.batch)
    check_sampling(args)
    check_model_path("--target", args.target)
    if args.method != "ngram" and any(k > 0 for k in k_values) and args.draft is None:
        raise SpeclimitsError(f"--method {args.method} needs --draft DIR (the draft model or EAGLE head)")
    if args.draft is not None and args.method != "ngram":
        check_model_path("--draft", args.draft)
    prompts_file = Path(args.prompts)
    if not prompts_file.is_file():
        raise SpeclimitsError(f"--prompts {prompts_file}: no such file")
    check_prompt_vocabulary(read_prompts(prompts_file, limit=args.limit), args.target, prompts_file)
    if args.oracle:
        check_oracle(args.method, args.oracle_k_max)
        check_sampled_oracle(args.temperature, parse_assignments(getattr(args, "spec_arg", []) or [], "--spec-arg"))
    return k_values, batch_sizes


def check_sampling(args: Any) -> None:
    """``--temperature``, ``--top-p`` and ``--seed`` (:func:`check_sampling_values`); ``--oracle-samples`` >= 1,
    only with ``--oracle``, and above 1 only when sampling (a greedy reference is one per prompt)."""
    temperature, top_p, seed = (getattr(args, k, d) for k, d in (("temperature", 0.0), ("top_p", 1.0), ("seed", 0)))
    check_sampling_values(temperature, top_p, seed)
    samples = getattr(args, "oracle_samples", None)
    if samples is None:
        return
    if not getattr(args, "oracle", False):
        raise SpeclimitsError("--oracle-samples sets the Oracle pass's references: give --oracle as well")
    if samples < 1:
        raise SpeclimitsError(f"--oracle-samples must be >= 1, got {samples}")
    if samples > 1 and temperature == 0:
        raise SpeclimitsError(f"--oracle-samples {samples} needs --temperature > 0: at temperature 0 the reference "
                              "of a prompt is its one greedy output")


def check_sampling_values(temperature: Any, top_p: Any, seed: Any) -> None:
    """``--temperature`` a finite number >= 0, ``--top-p`` in (0, 1], ``--seed`` an integer."""
    from speclimits.trace.sampling import FLAGS, sampling_problems

    problems = sampling_problems(temperature, top_p, seed)
    if problems:
        field, message = problems[0]
        raise SpeclimitsError(f"{FLAGS[field]} {message}")


def check_sampled_oracle(temperature: float, spec_extra: dict[str, Any]) -> None:
    """A sampled Oracle pass records ``p_target(d)`` as the acceptance probability of a drafted token d:
    vLLM's rule for a greedy draft only (``draft_sample_method`` 'greedy', its default)."""
    method = spec_extra.get("draft_sample_method", "greedy")
    if temperature > 0 and method != "greedy":
        raise SpeclimitsError(f"--oracle at --temperature > 0 records the acceptance probability of a greedy draft; "
                              f"--spec-arg draft_sample_method={method!r} samples the drafts (leave it at 'greedy')")


def check_oracle(method: str, k_max: int | None) -> None:
    """The Oracle pass reads the draft's probabilities (an n-gram proposer has none) along ``k_max`` >= 1
    drafts (None: chosen later)."""
    if method == "ngram":
        raise SpeclimitsError("--oracle reads the draft's probabilities; --method ngram has none (use eagle, eagle3 "
                              "or draft_model, or trace without --oracle)")
    if k_max is not None and k_max < 1:
        raise SpeclimitsError(f"--oracle-k-max must be >= 1, got {k_max}")


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
