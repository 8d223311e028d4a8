"""A byte-level BPE tokenizer trained on the corpus, and the corpus turned into token streams.

The tokenizer is saved as a ``PreTrainedTokenizerFast`` folder (``tokenizer.json``,
``tokenizer_config.json``), which both transformers and vLLM load. Token streams are one
``uint16`` array per (split, domain): the documents' tokens, each document followed by the
end-of-text id.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from speclimits.jsonutil import dumps
from speclimits.models.corpus import DOMAINS, CorpusError, Document, read_corpus

EOS = "<|endoftext|>"
PAD = "<|pad|>"


def train_tokenizer(docs: list[Document], out: str | Path, vocab_size: int = 8192):
    """Train a byte-level BPE on ``docs`` and save it into ``out``; return the ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not docs:
        raise CorpusError("no documents to train the tokenizer on")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((d.text for d in docs), trainer=trainer, length=len(docs))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=EOS,
                                   model_max_length=2048, clean_up_tokenization_spaces=False)
    fast.save_pretrained(str(out))
    return fast


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def encode_corpus(corpus_dir: str | Path, tokenizer, out: str | Path) -> dict:
    """Write ``<out>/<split>_<domain>.npy`` token streams; return tokens and tokens-per-byte per split/domain."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    backend = tokenizer.backend_tokenizer
    stats: dict = {}
    for split in ("train", "valid"):
        docs = read_corpus(corpus_dir, split)
        for domain in DOMAINS:
            texts = [d.text for d in docs if d.domain == domain]
            encs = backend.encode_batch(texts, add_special_tokens=False)
            ids = np.fromiter((t for e in encs for t in (*e.ids, eos)), dtype=np.uint16)
            np.save(out / f"{split}_{domain}.npy", ids)
            n_bytes = sum(len(t.encode("utf-8")) for t in texts)
            stats.setdefault(split, {})[domain] = {"tokens": int(ids.size),
                                                   "tokens_per_byte": round(ids.size / max(n_bytes, 1), 4)}
    (out / "streams.json").write_text(dumps(stats, indent=2) + "\n")
    return stats


def load_streams(path: str | Path, split: str) -> dict[str, np.ndarray]:
    """The token streams of one split, by domain (``int64`` arrays)."""
    path = Path(path)
    streams = {}
    for domain in DOMAINS:
        file = path / f"{split}_{domain}.npy"
        if not file.exists():
            raise CorpusError(f"{file} not found: encode the corpus first")
        streams[domain] = np.load(file).astype(np.int64)
    return streams
