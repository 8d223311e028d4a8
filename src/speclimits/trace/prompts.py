"""Prompt files: plain JSONL and Spec-Bench's ``question.jsonl``, and the copy in a trace.

One JSON object per line. Accepted shapes (the first matching key wins):

``{"id": "p1", "prompt": "text", "category": "code"}``
    a text prompt (tokenized with the target's tokenizer; ``"text"`` is accepted too);
``{"id": "p2", "prompt_token_ids": [1, 2, 3]}``
    token ids, used as they are (needed for config-only models without a tokenizer);
``{"question_id": 81, "category": "writing", "turns": ["...", "..."]}``
    Spec-Bench (and MT-Bench) questions: the first turn is the prompt; ``question_id``
    becomes the id. Text prompts get the chat template unless disabled.

Optional keys: ``category`` (kept in the trace), ``reference`` / ``reference_token_ids`` (a
held-out continuation, teacher-forced in Oracle mode instead of the target's own output).
Ids are ``id``, else ``question_id``, else ``prompt_id``, else the line number; they must be
unique. Blank lines and lines starting with ``#`` are skipped.

The tracing harness copies the prompt file it ran into the trace as :data:`PROMPTS_FILE`;
:func:`read_prompts` is the one reader of both (the harness, the Oracle's reference kinds, the
provenance record).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclimits.errors import SpeclimitsError

#: The prompt file the tracing harness copies into a trace directory.
PROMPTS_FILE = "prompts.jsonl"


@dataclass(frozen=True)
class Prompt:
    """One prompt: an id, text or token ids, an optional category and reference."""

    id: str
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    category: str | None = None
    chat: bool = False  # Spec-Bench style question: apply the chat template
    reference_text: str | None = None
    reference_token_ids: tuple[int, ...] | None = None

    @property
    def teacher_forced(self) -> bool:
        """True when the prompt carries a held-out reference (its Oracle sequence is teacher-forced)."""
        return self.reference_text is not None or self.reference_token_ids is not None


def _ids(value: Any, path: Path, line: int, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(t, int) and t >= 0 for t in value):
        raise SpeclimitsError(f"{path}, line {line}: '{key}' must be a non-empty list of non-negative integers")
    return tuple(value)


def read_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Read a prompt file (see the module docstring); ``limit`` keeps the first N prompts."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SpeclimitsError(f"cannot read prompts file {path}: {exc}") from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for no, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpeclimitsError(f"{path}, line {no}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise SpeclimitsError(f"{path}, line {no}: expected a JSON object")
        pid = str(obj.get("id", obj.get("question_id", obj.get("prompt_id", no))))
        if pid in seen:
            raise SpeclimitsError(f"{path}, line {no}: duplicate prompt id {pid!r} (first on line {seen[pid]})")
        seen[pid] = no
        category = obj.get("category")
        common = dict(category=None if category is None else str(category), reference_text=obj.get("reference"),
                      reference_token_ids=_ids(obj["reference_token_ids"], path, no, "reference_token_ids")
                      if "reference_token_ids" in obj else None)
        if "prompt_token_ids" in obj:
            p = Prompt(pid, token_ids=_ids(obj["prompt_token_ids"], path, no, "prompt_token_ids"), **common)
        elif isinstance(obj.get("prompt", obj.get("text")), str):
            p = Prompt(pid, text=obj.get("prompt", obj.get("text")), **common)
        elif "turns" in obj:
            turns = obj["turns"]
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                raise SpeclimitsError(f"{path}, line {no}: 'turns' must be a non-empty list of strings")
            p = Prompt(pid, text=turns[0], chat=True, **common)
        else:
            raise SpeclimitsError(f"{path}, line {no}: needs 'prompt' (text), 'prompt_token_ids' or 'turns' "
                                  "(Spec-Bench question.jsonl)")
        if not (p.text or p.token_ids):
            raise SpeclimitsError(f"{path}, line {no}: the prompt is empty")
        prompts.append(p)
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise SpeclimitsError(f"prompts file {path} holds no prompts")
    return prompts
