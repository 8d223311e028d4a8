"""Long-context prompts: held-out corpus documents cut to about 1,400 tokens.

The bundled prompts end within a few hundred tokens, so the context coefficient ``c`` of the cost
model is barely identified on them. These prompts take documents that the corpus split held out of
training (:func:`speclimits.models.corpus.is_heldout`: Python standard-library modules and English
``/usr/share/doc`` files of the machine that built them), tokenized with the project tokenizer and cut
to ``prompt_tokens`` tokens, so that a 128-token generation runs at contexts of about 1,400–1,530
tokens, within the target's 2,048 positions.

``.venv/bin/python scripts/make_long_prompts.py`` writes them (the committed file is the record; the
documents on another machine may differ).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from speclimits.models.corpus import CorpusConfig, is_heldout, iter_code, iter_en_docs
from speclimits.paths import DATA_DIR, TARGET_MODEL

#: Where the committed long-context prompts live.
LONG_PROMPTS = DATA_DIR / "prompts" / "long-context.jsonl"


def long_prompts(n_per_domain: int = 4, prompt_tokens: int = 1400, tokenizer: Path = TARGET_MODEL / "tokenizer.json",
                 heldout_share: float = 0.05) -> list[dict]:
    """Rows ``{id, category, prompt_token_ids, text, source}``: the first ``n_per_domain`` held-out
    documents per domain (code, en) in source order that are at least ``prompt_tokens`` long."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    cfg = CorpusConfig()
    rows = []
    for domain, docs in (("code", iter_code(cfg)), ("en", iter_en_docs(cfg))):
        found = 0
        for doc in docs:
            if found >= n_per_domain:
                break
            if not is_heldout(doc.source, heldout_share):
                continue
            ids = tok.encode(doc.text).ids
            if len(ids) < prompt_tokens:
                continue
            found += 1
            ids = ids[:prompt_tokens]
            rows.append({"id": f"long-{domain}-{found:02d}", "category": f"long-{domain}", "prompt_token_ids": ids,
                         "text": tok.decode(ids), "source": doc.source})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=LONG_PROMPTS)
    p.add_argument("--per-domain", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=1400)
    args = p.parse_args(argv)
    rows = long_prompts(args.per_domain, args.prompt_tokens)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} prompts to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
