"""Tokenizing prompts (their format and reader live in :mod:`speclimits.trace.prompts`)."""

from __future__ import annotations

from typing import Any

from speclimits.errors import SpeclimitsError
from speclimits.trace.prompts import Prompt, read_prompts  # noqa: F401  (the one reader lives with the trace)


def tokenize(prompt: Prompt, tokenizer: Any, chat_template: bool = True) -> list[int]:
    """Token ids of ``prompt``: its own, or its text through ``tokenizer`` (Spec-Bench questions with the
    chat template, when it has one and ``chat_template`` is true, as Spec-Bench does)."""
    if prompt.token_ids is not None:
        return list(prompt.token_ids)
    if tokenizer is None:
        raise SpeclimitsError(f"prompt {prompt.id!r} is text but the model has no tokenizer; "
                              "give 'prompt_token_ids' instead")
    if prompt.chat and chat_template and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}],
                                            add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict):  # some tokenizers return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer.encode(prompt.text))
