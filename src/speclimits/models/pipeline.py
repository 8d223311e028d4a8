"""``speclimits train-models``: corpus -> tokenizer -> target -> EAGLE-3 head -> dense draft -> vLLM check.

Every stage is seeded and records what it did in ``<out>/train.log`` and ``<out>/meta.json``.
Scratch data (downloaded packages, the corpus, token streams, generated sequences) stays in
``--scratch``; only models, tokenizer and metadata land in ``--out``. Stages whose outputs exist
are skipped unless ``--force`` (so an interrupted run resumes where it stopped). Each stage imports
torch and the model code itself, so that the other commands do not load them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from speclimits.errors import SpeclimitsError
from speclimits.jsonutil import dumps, read_json
from speclimits.paths import DATA_DIR

STAGES = ("corpus", "tokenizer", "heldout", "target", "headdata", "eagle3", "dense", "serve")


class Pipeline:
    def __init__(self, out: Path, scratch: Path, seed: int = 0, smoke: bool = False, progress: bool = True,
                 threads: int = 1):
        self.out, self.scratch, self.seed, self.smoke, self.progress = Path(out), Path(scratch), seed, smoke, progress
        self.threads = threads
        self.out.mkdir(parents=True, exist_ok=True)
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.meta_path = self.out / "meta.json"
        self.meta = read_json(self.meta_path, "models meta", SpeclimitsError) if self.meta_path.exists() else {}
        self.log_file = open(self.out / "train.log", "a", encoding="utf-8")
        self.corpus_dir, self.streams_dir = self.scratch / "corpus", self.scratch / "streams"
        self.target_dir, self.head_dir = self.out / "target", self.out / "eagle3"
        self.dense_dir = self.out / "dense-draft"

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def save_meta(self) -> None:
        self.meta_path.write_text(dumps(self.meta, indent=2, ensure_ascii=False) + "\n")

    def done(self, stage: str) -> bool:
        return stage in self.meta.get("stages", {})

    def run(self, stages: list[str], force: bool = False) -> None:
        import torch

        torch.set_num_threads(self.threads)
        self.meta.setdefault("seed", self.seed)
        self.meta["smoke"] = self.smoke
        for stage in stages:
            if self.done(stage) and not force:
                self.log(f"stage {stage}: already done, skipped (use --force to redo)")
                continue
            self.log(f"stage {stage}: start")
            t0 = time.perf_counter()
            result = getattr(self, f"stage_{stage}")()
            secs = round(time.perf_counter() - t0, 1)
            self.meta.setdefault("stages", {})[stage] = {"seconds": secs, **(result or {})}
            self.save_meta()
            self.log(f"stage {stage}: done in {secs} s")

    # stages
    def stage_corpus(self) -> dict:
        from speclimits.models.corpus import CorpusConfig, build_corpus

        cfg = CorpusConfig()
        if self.smoke:
            cfg = replace(cfg, max_domain_chars={"code": 300_000, "en": 300_000, "ru": 300_000},
                          max_en_man_pages=60, heldout_share=0.15)
        meta = build_corpus(self.corpus_dir, self.scratch, cfg, log=self.log, progress=self.progress)
        (self.out / "corpus_meta.json").write_text(dumps(meta, indent=2, ensure_ascii=False) + "\n")
        return {"splits": meta["splits"]}

    def stage_tokenizer(self) -> dict:
        from speclimits.models.corpus import read_corpus
        from speclimits.models.tokenizer import encode_corpus, train_tokenizer

        vocab = 2048 if self.smoke else 8192
        tok = train_tokenizer(read_corpus(self.corpus_dir, "train"), self.target_dir, vocab_size=vocab)
        stats = encode_corpus(self.corpus_dir, tok, self.streams_dir)
        self.log(f"tokenizer: vocab {len(tok)}; streams {stats}")
        return {"vocab_size": len(tok), "streams": stats}

    def stage_heldout(self) -> dict:
        """Held-out corpus passages as prompts with teacher-forced references (for the Oracle trace)."""
        from speclimits.models.tokenizer import load_streams

        path = DATA_DIR / "prompts" / "heldout-corpus.jsonl"
        if self.smoke:
            path = self.out / "heldout-corpus.jsonl"
        n = write_heldout_prompts(load_streams(self.streams_dir, "valid"), path, self._tokenizer(),
                                  per_domain=2 if self.smoke else 8)
        self.log(f"held-out passages: {n} prompts in {path}")
        return {"path": str(path), "prompts": n}

    def _tokenizer(self):
        from speclimits.models.tokenizer import load_tokenizer

        return load_tokenizer(self.target_dir)

    def target_config(self):
        from speclimits.models.target import TargetConfig

        cfg = TargetConfig(seed=self.seed)
        if self.smoke:
            cfg = replace(cfg, layers=4, experts=8, top_k=2, seq_len=64, batch=4, steps=6, warmup=2, eval_windows=4)
        return cfg

    def stage_target(self) -> dict:
        from speclimits.models.target import train_target
        from speclimits.models.tokenizer import EOS, load_streams

        tok = self._tokenizer()
        metrics = train_target(self.target_config(), load_streams(self.streams_dir, "train"),
                               load_streams(self.streams_dir, "valid"), len(tok), tok.convert_tokens_to_ids(EOS),
                               self.target_dir, log=self.log, progress=self.progress)
        return {k: v for k, v in metrics.items() if k != "history"}

    def head_config(self):
        from speclimits.models.eagle3 import HeadConfig

        cfg = HeadConfig(seed=self.seed)
        if self.smoke:
            cfg = replace(cfg, draft_vocab=512, seq_len=48, batch=4, steps=4, warmup=2, intermediate=64,
                          aux_layer_ids=(1, 2, 3))
        return cfg

    def stage_headdata(self) -> dict:
        """Target-greedy continuations (vLLM, plain decoding) of corpus prefixes, train and held-out."""
        hc = self.head_config()
        rng = np.random.default_rng(self.seed + 1)
        from speclimits.models.tokenizer import load_streams

        prompt_len, n_train, n_valid = (16, 8, 4) if self.smoke else (32, 640, 32)
        spec = {}
        for split, n in (("train", n_train), ("valid", n_valid)):
            streams = load_streams(self.streams_dir, split)
            prompts = []
            for i in range(n):
                s = streams[sorted(streams)[i % len(streams)]]
                a = int(rng.integers(0, s.size - prompt_len - 1))
                prompts.append(s[a: a + prompt_len].tolist())
            spec[split] = prompts
        req = self.scratch / "headdata_request.json"
        req.write_text(json.dumps({"model": str(self.target_dir), "prompts": spec,
                                   "max_tokens": hc.seq_len - prompt_len, "seed": self.seed}))
        res = self.scratch / "headdata.json"
        self._vllm_subprocess(["generate", str(req), str(res)])
        got = json.loads(res.read_text())
        stats = {}
        for split in ("train", "valid"):
            seqs = np.array([p + o for p, o in zip(spec[split], got[split])], dtype=np.int64)
            np.save(self.scratch / f"greedy_{split}.npy", seqs)
            stats[split] = {"sequences": int(seqs.shape[0]), "length": int(seqs.shape[1])}
        self.log(f"head data: target-greedy sequences {stats} ({got.get('tokens_per_second')} generated tok/s)")
        return {"greedy": stats, "prompt_len": prompt_len, "generation_tok_s": got.get("tokens_per_second")}

    def _vllm_subprocess(self, args: list[str]) -> None:
        from speclimits.tracing.engine import CPU_ENV_DEFAULTS  # the harness's CPU settings, threads our own

        env = {**os.environ, **CPU_ENV_DEFAULTS, "OMP_NUM_THREADS": str(self.threads)}
        cmd = [sys.executable, "-m", "speclimits.models.serve_check", *args]
        self.log(f"running {' '.join(cmd)}")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        tail = "\n".join(proc.stderr.strip().splitlines()[-30:])
        if proc.returncode != 0:
            raise SpeclimitsError(f"vLLM step failed ({' '.join(args[:1])}), exit {proc.returncode}:\n{tail}")
        for line in proc.stdout.strip().splitlines():
            if line.startswith("RESULT "):
                self.log("  vllm: " + line[7:])

    def _mixed_sequences(self, seq_len: int, split: str, n_corpus: int | None = None) -> np.ndarray:
        """Target-greedy sequences plus ``n_corpus`` corpus windows of the same length (train or valid split;
        default: 3 windows per 7 greedy sequences, at least 4)."""
        from speclimits.models.target import WindowSampler
        from speclimits.models.tokenizer import load_streams

        greedy = np.load(self.scratch / f"greedy_{split}.npy")[:, :seq_len]
        n_corpus = max(4, len(greedy) * 3 // 7) if n_corpus is None else n_corpus
        sampler = WindowSampler(load_streams(self.streams_dir, split), seq_len - 1, self.seed + 2)
        corpus = sampler.batch(n_corpus)[0].numpy()
        return np.concatenate([greedy, corpus])

    def stage_eagle3(self) -> dict:
        from speclimits.models.eagle3 import train_head
        from speclimits.models.target import WindowSampler, load_target
        from speclimits.models.tokenizer import load_streams

        cfg = self.head_config()
        target = load_target(self.target_dir)
        train_streams = load_streams(self.streams_dir, "train")
        counts = np.bincount(np.concatenate(list(train_streams.values())), minlength=target.config.vocab_size)
        train = self._mixed_sequences(cfg.seq_len, "train")
        valid_corpus = WindowSampler(load_streams(self.streams_dir, "valid"), cfg.seq_len - 1, self.seed + 3)
        valid = {"target_greedy": np.load(self.scratch / "greedy_valid.npy")[:, : cfg.seq_len],
                 "corpus_heldout": valid_corpus.batch(4 if self.smoke else 24)[0].numpy()}
        metrics = train_head(cfg, target, train, valid, counts, self.head_dir, log=self.log, progress=self.progress)
        return {k: v for k, v in metrics.items() if k != "history"}

    def stage_dense(self) -> dict:
        from speclimits.models.dense_draft import DenseConfig, train_dense
        from speclimits.models.target import load_target

        cfg = DenseConfig(seed=self.seed)
        if self.smoke:
            cfg = replace(cfg, layers=1, seq_len=48, batch=4, steps=4, warmup=2)
        target = load_target(self.target_dir)
        train = self._mixed_sequences(cfg.seq_len, "train")
        valid = self._mixed_sequences(cfg.seq_len, "valid", n_corpus=4 if self.smoke else 24)
        metrics = train_dense(cfg, target, train, valid, self.dense_dir, log=self.log, progress=self.progress)
        return {k: v for k, v in metrics.items() if k != "history"}

    def stage_serve(self) -> dict:
        from speclimits.models.serve_check import agreement_check

        prompts = DATA_DIR / "prompts" / "speclimits.jsonl"
        res = self.scratch / "serve.json"
        req = {"target": str(self.target_dir), "eagle3": str(self.head_dir), "dense": str(self.dense_dir),
               "prompts": str(prompts), "max_tokens": 24 if self.smoke else 128,
               "n_prompts": 4 if self.smoke else 16, "k_max": 6, "seed": self.seed,
               "timing_prompts": 1 if self.smoke else 4}
        (self.scratch / "serve_request.json").write_text(json.dumps(req))
        self._vllm_subprocess(["check", str(self.scratch / "serve_request.json"), str(res)])
        served = json.loads(res.read_text())
        served["agreement"] = agreement_check(self.target_dir, self.head_dir, served["greedy_outputs"],
                                              served["acceptance"]["eagle3_k1"]["per_position"][0])
        self.log(f"teacher-forced vs vLLM K=1: {served['agreement']}")
        served.pop("greedy_outputs")
        (self.out / "serve_check.json").write_text(dumps(served, indent=2) + "\n")
        return {"acceptance": {k: v["per_position"] for k, v in served["acceptance"].items()},
                "timing_ms": served["timing_ms"], "agreement": served["agreement"]}


def write_heldout_prompts(streams: dict[str, np.ndarray], path: Path, tokenizer, per_domain: int = 8,
                          prompt_len: int = 48, ref_len: int = 128) -> int:
    """Evenly spaced held-out passages per domain: ``prompt_token_ids`` + ``reference_token_ids`` (JSONL).

    Passages that cross a document boundary (an end-of-text id) are moved forward to the next
    clean window; ``category`` is ``heldout-<domain>``.
    """
    from speclimits.models.tokenizer import EOS

    eos = tokenizer.convert_tokens_to_ids(EOS)
    rows = []
    span = prompt_len + ref_len
    for domain in sorted(streams):
        s = streams[domain]
        starts = np.linspace(0, s.size - span - 1, per_domain, endpoint=False).astype(int)
        for i, a in enumerate(starts):
            while a + span < s.size and (s[a: a + span] == eos).any():
                a = int(np.nonzero(s[a: a + span] == eos)[0][-1]) + a + 1
            if a + span >= s.size:
                continue
            win = s[a: a + span].tolist()
            rows.append({"id": f"heldout-{domain}-{i + 1:02d}", "category": f"heldout-{domain}",
                         "prompt_token_ids": win[:prompt_len], "reference_token_ids": win[prompt_len:],
                         "text": tokenizer.decode(win[:prompt_len])})
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return len(rows)


def train_models(out: str | Path, scratch: str | Path | None = None, seed: int = 0, smoke: bool = False,
                 stages: list[str] | None = None, force: bool = False, progress: bool = True,
                 threads: int = 1) -> dict:
    """Run the pipeline (all stages by default) and return ``meta.json``'s content."""
    scratch = Path(scratch) if scratch else Path(tempfile.gettempdir()) / "speclimits-models-scratch"
    bad = [s for s in (stages or []) if s not in STAGES]
    if bad:
        raise SpeclimitsError(f"unknown stages {bad}; known: {', '.join(STAGES)}")
    pipe = Pipeline(Path(out), scratch, seed=seed, smoke=smoke, progress=progress, threads=threads)
    pipe.log(f"train-models: out={out} scratch={scratch} seed={seed} smoke={smoke} threads={threads}")
    pipe.run(list(stages or STAGES), force=force)
    return pipe.meta
