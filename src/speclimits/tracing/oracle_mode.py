"""Dense Oracle data from stock vLLM: the draft chain and the target's window routing at every position.

For a reference ``y_1..y_N`` (the target's own greedy output of a sweep generation; a held-out
continuation, teacher-forced; or, in a sampled trace, a sampled continuation) and each state
``pos`` = 0..N−2 (the prefill emits ``y_1``, so the states are the decode-phase tokens), one request
with prompt ``P + y_1..y_pos``, ``max_tokens=2``, ``ignore_eos``; a batch of requests goes in one
``generate()`` with prefix caching:

* step A (prefill) samples ``y_{pos+1}`` — the reference token is written into the sample (``forced``
  where the target's own choice differed) — and the drafter proposes ``d_1..d_K`` (K = ``k_max``); a
  wrapper on the drafter's ``compute_logits`` keeps per draft step the top-1 probability, the draft
  token and the probability of the reference token ``y_{pos+1+i}`` (along the draft's own chain);
* step B verifies the K drafts: the target rows of the request are the window ``[y_{pos+1}, d_1..d_K]``
  (junk after the first mismatch included); its unique experts per layer over the first m rows give
  ``u_bar_window[m-1]``, m = 1..K+1.

Rows of ``oracle.parquet`` (contract columns of :mod:`speclimits.trace.schema` first):

``context_len``         P + pos (the KV length at verification, as the sweep's ``rounds.context_len``)
``match_prob``          teacher-forced: P_draft(y_{pos+1+i} | P + y_1..y_{pos+i}), i = 1..K (the draft's
                        first-step probability at state pos+i−1); 0 past the end
``draft_conf``          the draft's top-1 probability at chain step i
``accept_len``          greedy match length of the chain against the reference (capped by the tokens left)
``u_bar_window``        K+1 floats; ``e_max_window`` likewise, the max over layers
``match_prob_chain``    P_draft(y_{pos+i}) along the draft's own chain (equals ``match_prob`` up to the
                        first mismatch for ``draft_model``; EAGLE's later steps use its own hidden states)
``draft_tokens``        the chain (K ids)
``accept_len_engine``   accepted drafts reported by vLLM's rejection sampler (in a sampled trace one draw)
``forced``              the reference token differs from the target's choice at step A (its sample when
                        greedy, its argmax when sampled)
``draft_conf2``, ``draft_entropy``  per chain step the draft's second-highest probability and its entropy (nats)
``target_conf``         the target's top-1 probability at step A, before the reference token is written in: at
                        state pos the distribution y_{pos+1} was chosen from (the engine's last verified
                        position). These three are the candidate acceptance features of
                        :mod:`speclimits.control.acceptance`.

**Sampled traces** (``--temperature T > 0``, :mod:`speclimits.trace.sampling`). Each prompt gets
``samples`` references (``--oracle-samples``): sample 0 is its sweep generation at the smallest K
(``seq_id`` = the prompt id), samples j >= 1 are sampled by this pass, seeded, ``seq_id``
``"<prompt id>#<j>"``, kept under ``references/`` before their states run (a resumed or retried pass
walks the same text). Every state's request runs at the trace's temperature and top-p, and adds

``accept_prob``         K floats: the probability that vLLM's rejection sampler accepts d_i given d_1..d_{i-1}
                        were: with its default greedy draft, p_target(d_i | prefix) after the request's
                        temperature and top-p (read with the sampler's own functions); 0 past the end
``prompt_id``, ``sample`` which reference of which prompt

``accept_len`` keeps its definition: under the rejection rule's exact coupling "d_i accepted" is "d_i
equals the sample path's next token" (tests/test_sampling_coupling.py), so along a sampled reference it is
one exact draw of the engine's accepted length, ``P(a >= j) = Π_{i<=j} accept_prob[i-1]``.
``reference_kind`` is ``'sampled'`` (held-out references stay teacher-forced).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

import pyarrow as pa

from speclimits.errors import SpeclimitsError
from speclimits.trace.io import (list_parts, read_generations, read_meta, read_references, read_table, write_meta,
                                 write_part, write_reference)
from speclimits.trace.reference_tokens import (CHOICE_COLUMNS, GENERATION_COLUMNS, first_greedy_tokens,
                                               reference_generations, reference_tokens)
from speclimits.trace.sampling import DEFAULT_ORACLE_SAMPLES, Sampling, sample_seq_id
from speclimits.tracing import engine as eng
from speclimits.tracing.inputs import check_oracle, check_sampled_oracle
from speclimits.vocabulary import GREEDY, SAMPLED, TEACHER_FORCED
from speclimits.tracing.prompts import read_prompts
from speclimits.tracing.sweep import sweep_engine_kwargs


#: ``Reference.source`` of a sampled continuation of the target (a sampled trace's references).
TARGET_SAMPLED = "target sampled"


@dataclass(frozen=True)
class Reference:
    """A reference sequence: prompt ids and the continuation ``y_1..y_N`` (N >= 2); a sampled trace's
    reference j >= 1 has none until the Oracle pass samples it with ``seed`` (:func:`sampled_reference`)."""

    seq_id: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    category: str | None = None
    source: str = "target greedy"
    prompt_id: str | None = None
    sample: int = 0
    seed: int | None = None

    @property
    def kind(self) -> str:
        """``reference_kind`` (:data:`~speclimits.vocabulary.REFERENCE_KINDS`)."""
        return TEACHER_FORCED if self.source == "held-out" else SAMPLED if self.source == TARGET_SAMPLED else GREEDY

    @property
    def unsampled(self) -> bool:
        return self.source == TARGET_SAMPLED and not self.output_ids


def plan_requests(ref: Reference, k_max: int) -> list[tuple[int, list[int], int, list[int]]]:
    """Per state: (pos, prompt ids, forced token y_{pos+1}, reference chain y_{pos+2..pos+1+K} padded with -1)."""
    y = list(ref.output_ids)
    out = []
    for pos in range(len(y) - 1):
        chain = y[pos + 1: pos + 1 + k_max]
        out.append((pos, list(ref.prompt_ids) + y[:pos], y[pos], chain + [-1] * (k_max - len(chain))))
    return out


def oracle_rows(ref: Reference, k_max: int, results: dict[int, dict[str, Any]], sampled: bool = False
                ) -> pd.DataFrame:
    """Rows of ``oracle.parquet`` for one reference from the per-state results (keyed by pos); ``sampled``:
    also ``accept_prob``, ``prompt_id`` and ``sample``."""
    y = np.asarray(ref.output_ids)
    n_states = len(y) - 1
    need = {"u_window", "draft_conf"} | ({"accept_prob"} if sampled else set())
    missing = [p for p in range(n_states) if not need <= set(results.get(p, {}))]
    if missing:
        raise SpeclimitsError(f"Oracle: sequence {ref.seq_id}: no draft chain or window for states {missing[:5]} "
                              f"({len(missing)} in all); the engine verified fewer drafts than k_max = {k_max} "
                              "(check max_model_len)")
    tf = np.array([float(results[p]["chain_prob"][0]) for p in range(n_states)])  # step-1 prob of y_{p+2}
    feats = all({"draft_conf2", "draft_entropy", "target_conf"} <= set(results[p]) for p in range(n_states))
    rows = []
    P = len(ref.prompt_ids)
    for p in range(n_states):
        res = results[p]
        conf = np.asarray(res["draft_conf"], dtype=float)
        if conf.size != k_max or res["u_window"].shape[0] != k_max + 1:
            raise SpeclimitsError(f"Oracle: sequence {ref.seq_id}, state {p}: drafted {conf.size} and verified "
                                  f"{res['u_window'].shape[0] - 1} tokens, expected k_max = {k_max}")
        match = np.zeros(k_max)
        avail = min(k_max, n_states - p)
        match[:avail] = tf[p: p + avail]
        chain = np.asarray(res["draft_tokens"], dtype=np.int64)
        ref_chain = y[p + 1: p + 1 + k_max]
        eq = chain[: len(ref_chain)] == ref_chain
        u = np.asarray(res["u_window"], dtype=float)
        rows.append({"seq_id": ref.seq_id, "pos": p, "context_len": P + p, "match_prob": np.clip(match, 0.0, 1.0),
                     "draft_conf": np.clip(conf, 0.0, 1.0),
                     "accept_len": int(np.argmin(eq)) if not eq.all() else len(ref_chain),
                     "u_bar_window": u.mean(axis=1),
                     "match_prob_chain": np.clip(np.asarray(res["chain_prob"], dtype=float), 0.0, 1.0),
                     "draft_tokens": chain, "e_max_window": u.max(axis=1),
                     "accept_len_engine": int(res.get("n_sampled_verify", 0)) - 1,
                     "forced": bool(res.get("forced", False))})
        if feats:  # the candidate acceptance features
            rows[-1].update({"draft_conf2": np.clip(np.asarray(res["draft_conf2"], dtype=float), 0.0, 1.0),
                             "draft_entropy": np.maximum(np.asarray(res["draft_entropy"], dtype=float), 0.0),
                             "target_conf": float(np.clip(res["target_conf"], 0.0, 1.0))})
        if sampled:
            acc = np.asarray(res["accept_prob"], dtype=float)
            if acc.size != k_max:
                raise SpeclimitsError(f"Oracle: sequence {ref.seq_id}, state {p}: {acc.size} acceptance probabilities "
                                      f"for k_max = {k_max} drafts")
            prob = np.zeros(k_max)
            prob[:avail] = acc[:avail]  # 0 past the end of the reference, as match_prob
            rows[-1]["accept_prob"] = np.clip(prob, 0.0, 1.0)
    df = pd.DataFrame(rows)
    for col in ("pos", "context_len", "accept_len", "accept_len_engine"):
        df[col] = df[col].astype(np.int64)
    if ref.category is not None:
        df["category"] = ref.category
    # the Oracle reports the kinds of reference apart (speclimits.oracle.prepare.REFERENCE_KINDS)
    df["reference_kind"] = ref.kind
    if sampled:
        df["prompt_id"] = ref.prompt_id if ref.prompt_id is not None else ref.seq_id
        df["sample"] = np.int64(ref.sample)
    return df


def references_from_sweep(root: str | Path, prompts: Sequence[Any], k_ref: int,
                          held_out: dict[str, list[int]] | None = None, samples: int = 1,
                          sampling: Sampling | None = None) -> list[Reference]:
    """References: per prompt, the output of the sweep generation with K = ``k_ref`` (the smallest gid), or
    the held-out continuation in ``held_out``. In a sampled trace that generation is sample 0, followed by
    ``samples - 1`` further references, not yet sampled."""
    gens = read_generations(root)
    by_prompt = {p: g for p, (_, g) in reference_generations(gens, k_ref).items()}
    sampled = sampling is not None and not sampling.greedy
    refs = []
    for p in prompts:
        g = by_prompt.get(p.id)
        if g is None:
            raise SpeclimitsError(f"Oracle: no K={k_ref} generation for prompt {p.id!r} in {root}; run the sweep first")
        ids = tuple(g["prompt_token_ids"])
        if held_out and p.id in held_out:
            refs.append(Reference(p.id, ids, tuple(held_out[p.id]), p.category, "held-out", prompt_id=p.id))
        elif sampled:
            refs.append(Reference(p.id, ids, tuple(g["output_token_ids"]), p.category, TARGET_SAMPLED, prompt_id=p.id,
                                  sample=0, seed=g.get("seed")))
            refs.extend(Reference(sample_seq_id(p.id, j), ids, (), p.category, TARGET_SAMPLED, prompt_id=p.id,
                                  sample=j, seed=sampling.request_seed(p.id, j)) for j in range(1, samples))
        else:
            refs.append(Reference(p.id, ids, tuple(g["output_token_ids"]), p.category))
    clash = sorted({r.seq_id for r in refs if r.sample > 0} & {str(p.id) for p in prompts})
    if clash:
        raise SpeclimitsError(f"Oracle: prompt ids {clash[:3]} look like the ids of sampled references "
                              "('<prompt id>#<j>'); rename those prompts")
    return refs


@dataclass
class OraclePlan:
    """What an Oracle pass has to do: every reference, and ``todo``, the (index, reference) pairs without
    their part ``part-s{index:05d}`` yet."""

    root: Path
    prompts: list[Any]
    k_max: int
    k_ref: int
    batch: int
    held_out: dict[str, list[int]]
    refs: list[Reference]
    todo: list[tuple[int, Reference]]
    sampling: Sampling = Sampling()
    samples: int = 1  # references per prompt
    max_tokens: int = 128  # length and EOS rule of the sampled references (the sweep's)
    ignore_eos: bool = False

    @property
    def sampled(self) -> bool:
        return not self.sampling.greedy


def plan_oracle(cfg: Any, k_max: int, batch: int = 64) -> OraclePlan:
    """The Oracle pass's work on the sweep trace at ``cfg.out`` (a :class:`~speclimits.tracing.sweep.SweepConfig`)."""
    check_oracle(cfg.method, k_max)
    sampling = cfg.sampling
    check_sampled_oracle(sampling.temperature, dict(cfg.spec_extra or {}))
    samples = 1
    if not sampling.greedy:
        samples = int(cfg.oracle_samples or DEFAULT_ORACLE_SAMPLES)
    elif (cfg.oracle_samples or 1) > 1:
        raise SpeclimitsError("--oracle-samples above 1 needs --temperature > 0: at temperature 0 the reference of a "
                              "prompt is its one greedy output")
    root = Path(cfg.out)
    meta = read_meta(root)
    if Sampling.from_meta(meta) != sampling:
        raise SpeclimitsError(f"Oracle: {root} was traced with sampling {meta.get('sampling') or 'greedy'}, not "
                              f"temperature {sampling.temperature}, top-p {sampling.top_p}, seed {sampling.seed}")
    prompts = read_prompts(cfg.prompts, limit=cfg.limit)
    k_ref = min(meta["k_values"])
    held_out = {p.id: list(p.reference_token_ids) for p in prompts if p.reference_token_ids is not None}
    text_only = [p.id for p in prompts if p.reference_text is not None and p.reference_token_ids is None]
    if text_only:
        raise SpeclimitsError(f"prompt {text_only[0]!r}: text references need a tokenizer; give "
                              "'reference_token_ids' (tokenizer-backed references are not wired yet)")
    refs = references_from_sweep(root, prompts, k_ref, held_out, samples, sampling)
    old = meta.get("oracle") or {}
    if old and int(old.get("k_max", k_max)) != k_max:
        raise SpeclimitsError(f"--resume: the trace's Oracle data use k_max = {old['k_max']}, not {k_max}")
    if old and int(old.get("samples", 1)) != samples:
        raise SpeclimitsError(f"--resume: the trace's Oracle data use {old.get('samples', 1)} references per prompt, "
                              f"not {samples} (--oracle-samples)")
    on_disk = read_references(root)
    refs = [_with_sampled(r, on_disk.get(f"{ORACLE_PART}{i:05d}")) for i, r in enumerate(refs)]
    done = oracle_done(root)
    todo = [(i, r) for i, r in enumerate(refs) if i not in done]
    return OraclePlan(root, prompts, k_max, k_ref, batch, held_out, refs, todo, sampling, samples,
                      int(cfg.max_tokens), bool(cfg.ignore_eos))


def _with_sampled(ref: Reference, entry: dict[str, Any] | None) -> Reference:
    """``ref`` with the continuation a previous pass sampled for it (``references/``), if any."""
    if entry is None or not ref.unsampled:
        return ref
    if entry.get("seq_id") != ref.seq_id or entry.get("seed") != ref.seed:
        raise SpeclimitsError(f"Oracle: references/ holds {entry.get('seq_id')!r} (seed {entry.get('seed')}) where "
                              f"{ref.seq_id!r} (seed {ref.seed}) belongs; the trace's prompts or settings changed")
    return replace(ref, output_ids=tuple(int(t) for t in entry["output_token_ids"]))


def sampled_reference(llm: Any, plan: OraclePlan, index: int, ref: Reference) -> Reference:
    """Sample the continuation of ``ref`` (sequence ``index``) with its seed and keep it as
    ``references/part-s{index}.json`` before any of its states run."""
    from vllm import SamplingParams  # vllm is heavy and optional: imported when an engine runs
    from vllm.inputs import TokensPrompt

    s = plan.sampling
    params = SamplingParams(temperature=s.temperature, top_p=s.top_p, seed=ref.seed, max_tokens=plan.max_tokens,
                            ignore_eos=plan.ignore_eos, detokenize=False)
    out = llm.generate([TokensPrompt(prompt_token_ids=list(ref.prompt_ids))], params, use_tqdm=False)[0].outputs[0]
    llm.collective_rpc("speclimits_drain")  # the generation's step records are not part of the trace
    ids = tuple(int(t) for t in out.token_ids)
    write_reference(plan.root, f"{ORACLE_PART}{index:05d}", {
        "seq_id": ref.seq_id, "prompt_id": ref.prompt_id, "sample": ref.sample, "seed": ref.seed,
        "temperature": s.temperature, "top_p": s.top_p, "output_token_ids": list(ids),
        "finish_reason": out.finish_reason})
    return replace(ref, output_ids=ids)


#: Name prefix of the Oracle pass's part files: ``part-s{sequence index:05d}``.
ORACLE_PART = "part-s"


def oracle_done(root: str | Path) -> set[int]:
    """Indices of the sequences whose Oracle part is on disk."""
    folder = Path(root) / "oracle.parquet"
    parts = folder.glob(f"{ORACLE_PART}*.parquet") if folder.is_dir() else ()
    return {int(p.stem[len(ORACLE_PART):]) for p in parts}


def oracle_engine(cfg: Any, plan: OraclePlan) -> Any:
    """The engine of an Oracle pass: K = k_max, prefix caching, long enough for ``plan.todo``."""
    longest = max(len(r.prompt_ids) + (plan.max_tokens if r.unsampled else len(r.output_ids)) for _, r in plan.todo)
    kwargs = sweep_engine_kwargs(cfg, plan.k_max, plan.prompts, [plan.k_max], batch=plan.batch, prefix_caching=True,
                                 extra_len=max(0, longest - cfg.max_tokens))
    kwargs.setdefault("max_num_batched_tokens", max(8192, int(kwargs["max_model_len"])))
    return eng.make_llm(kwargs, {"sampled": True} if plan.sampled else None)[0]


def run_oracle_parts(llm: Any, plan: OraclePlan, todo: Sequence[tuple[int, Reference]],
                     progress: bool = True) -> None:
    """Run every state of the references of ``todo`` through ``llm`` (:func:`oracle_engine`) and write each
    one's part as it finishes (a sequence whose part is on disk is skipped)."""
    from vllm import SamplingParams  # vllm is heavy and optional: imported when an engine runs
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, detokenize=False)
    s = plan.sampling
    done = oracle_done(plan.root)
    left = [(i, r) for i, r in todo if i not in done]
    total = sum(max((plan.max_tokens if r.unsampled else len(r.output_ids)) - 1, 0) for _, r in left)
    bar = tqdm(total=total, desc="oracle", unit="state", disable=not progress)
    for index, ref in left:
        if ref.unsampled:
            ref = sampled_reference(llm, plan, index, ref)
        if len(ref.output_ids) < 2:
            continue
        states = plan_requests(ref, plan.k_max)
        if plan.sampled:  # each state's request sampled at the trace's temperature, with its own seed
            step_params = [SamplingParams(temperature=s.temperature, top_p=s.top_p, max_tokens=2, ignore_eos=True,
                                          detokenize=False, seed=s.request_seed(f"oracle:{ref.seq_id}", pos))
                           for pos, _, _, _ in states]
        results: dict[int, dict[str, Any]] = {}
        for start in range(0, len(states), plan.batch):
            chunk = states[start: start + plan.batch]
            # request ids LLM.generate will assign: it counts requests per engine
            next_id = int(getattr(getattr(llm, "request_counter", None), "counter", -1))
            if next_id < 0:
                raise SpeclimitsError("Oracle: cannot read vLLM's request counter (LLM.request_counter.counter); "
                                      "supported vLLM: 0.32.0")
            ids = [str(next_id + i) for i in range(len(chunk))]
            arm = {rid: {"forced": forced, "ref": chain, **({"sampled": True} if plan.sampled else {})}
                   for rid, (_, _, forced, chain) in zip(ids, chunk)}
            llm.collective_rpc("speclimits_set_oracle", args=(arm,))
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for (_, p, _, _) in chunk],
                                step_params[start: start + plan.batch] if plan.sampled else params, use_tqdm=False)
            got = llm.collective_rpc("speclimits_drain_oracle")[0]
            llm.collective_rpc("speclimits_set_oracle", args=(None,))
            if [o.request_id for o in outs] != ids:
                raise SpeclimitsError(f"Oracle: vLLM assigned request ids {[o.request_id for o in outs][:3]}..., "
                                      f"expected {ids[:3]}...; the request counter moved unexpectedly")
            for rid, (pos, _, _, _) in zip(ids, chunk):
                results[pos] = got["results"].get(rid, {})
            bar.update(len(chunk))
        write_part(plan.root, "oracle", f"{ORACLE_PART}{index:05d}",
                   oracle_rows(ref, plan.k_max, results, sampled=plan.sampled))
    bar.close()


def finish_oracle(cfg: Any, plan: OraclePlan, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """After every reference's part is on disk: ``tokens.parquet`` in the documented layout
    (:func:`write_reference_tokens`) and ``meta["oracle"]``, its counts read from the data on disk, so a
    serial, a distributed and a resumed pass record the same numbers."""
    on_disk = read_references(plan.root)
    refs = [_with_sampled(r, on_disk.get(f"{ORACLE_PART}{i:05d}")) for i, r in enumerate(plan.refs)]
    # a sampled reference that stopped (EOS) after its first token has no state: no part, said in meta.json
    short = [i for i, r in enumerate(refs) if r.source == TARGET_SAMPLED and not r.unsampled and len(r.output_ids) < 2]
    missing = sorted(set(range(len(plan.refs))) - oracle_done(plan.root) - set(short))
    if missing:
        raise SpeclimitsError(f"Oracle: sequences {missing[:5]} ({len(missing)} in all) have no part in "
                              f"{plan.root / 'oracle.parquet'}; run the pass again (it resumes)")
    sampled_refs = {r.seq_id: (str(r.prompt_id), list(r.output_ids)) for r in refs if r.sample > 0}
    write_reference_tokens(plan.root, plan.held_out, plan.k_ref, _decoder_for(cfg.target), sampled_refs,
                           sampled=plan.sampled)
    oracle = read_table(plan.root, "oracle")
    meta = read_meta(plan.root)
    if plan.sampled:
        s = plan.sampling
        extra = {"samples": plan.samples,
                 "accept_prob": "per draft, the probability vLLM's rejection sampler accepts it given the drafts "
                                "before it were: the target's probability of the (greedy) draft token at the "
                                "trace's temperature and top-p",
                 **({"without_states": [refs[i].seq_id for i in short]} if short else {}),
                 **(extra or {})}
        reference = (f"sampled continuations of the target at temperature {s.temperature:g}, top-p {s.top_p:g}: per "
                     f"prompt its K={plan.k_ref} sweep generation (sample 0, seq_id = the prompt id) and "
                     f"{plan.samples - 1} more sampled by this pass (seq_id '<prompt id>#<j>', seeds as meta.json "
                     "sampling.request_seeds, kept under references/); held-out continuations (teacher-forced) where "
                     "given; states pos = 0..N-2 (y_1 comes from the prefill); forced = the reference token differs "
                     "from the target's argmax")
    else:
        reference = ("held-out continuations (teacher-forced) where given, else the target's greedy "
                     f"output of the K={plan.k_ref} sweep generation; states pos = 0..N-2 (y_1 comes "
                     "from the prefill)")
    meta["oracle"] = {"k_max": plan.k_max, "k_ref": plan.k_ref, "batch": plan.batch, "reference": reference,
                      "sequences": len(plan.refs), "states": int(len(oracle)),
                      "forced_flips": int(oracle["forced"].sum()), **(extra or {})}
    write_meta(plan.root, meta)
    return meta


def trace_oracle(cfg: Any, k_max: int, batch: int = 64) -> dict[str, Any]:
    """The Oracle pass of ``speclimits trace --oracle`` on the sweep trace at ``cfg.out``, on one engine:
    ``oracle.parquet/part-s{index:05d}.parquet`` per reference (resumable), then :func:`finish_oracle`."""
    plan = plan_oracle(cfg, k_max, batch)
    if plan.todo:
        llm = oracle_engine(cfg, plan)
        try:
            run_oracle_parts(llm, plan, plan.todo, progress=cfg.progress)
        finally:
            eng.close_llm(llm)
    return finish_oracle(cfg, plan)


def _decoder_for(model: str | Path) -> Any:
    """The target's tokenizer as a decoder, without an engine."""
    if not eng.has_tokenizer(model):
        return None
    from transformers import AutoTokenizer  # only when a tokenizer exists

    tok = AutoTokenizer.from_pretrained(str(model))
    return lambda t: tok.decode([t])


#: Arrow type of ``tokens.experts`` (a column that is all null in a part would otherwise be typed null).
EXPERTS_TYPE = pa.list_(pa.int16())


def write_reference_tokens(root: str | Path, held_out: dict[str, list[int]], k_ref: int, decode: Any,
                           sampled_refs: dict[str, tuple[str, list[int]]] | None = None,
                           sampled: bool = False) -> int:
    """Rewrite each ``tokens.parquet`` part in the documented layout
    (:func:`speclimits.trace.reference_tokens.reference_tokens`): the reference generation's rows (K =
    ``k_ref``, smallest gid per prompt) get ``reference_kind`` and the target's choice; a teacher-forced
    prompt's rows are replaced by its held-out tokens; other generations' rows are kept. In a sampled trace
    the rows are of kind ``sampled``, the target's first choice is unknown, and ``sampled_refs`` (seq_id ->
    (prompt seq_id, token ids)) add their rows, without routing, to their prompt's part. Each part is
    rewritten under its own name (atomic); re-running gives the same files. Returns the parts rewritten."""
    root = Path(root)
    parts = list_parts(root, "tokens")
    if not parts:
        return 0
    oracle = read_table(root, "oracle")
    if oracle is None:
        raise SpeclimitsError(f"{root}: no oracle.parquet to take the target's choices from")
    oracle = oracle[["seq_id", "pos", "forced"]]
    gens = read_generations(root)
    first = {} if sampled else first_greedy_tokens(gens, k_ref)  # a sampled generation's first token is a sample
    ref_gid = {p: gid for p, (gid, _) in reference_generations(gens, k_ref).items()}
    sampled_refs = dict(sampled_refs or {})
    for name, path in sorted(parts.items()):
        df = pd.read_parquet(path)
        gid = pd.to_numeric(df["generation_id"], errors="coerce")
        seq = df["seq_id"].astype(str)
        is_ref = (gid == seq.map(ref_gid)).fillna(False)
        if "reference_kind" in df.columns:  # a teacher-forced sequence rewritten before: no generation any more
            is_ref |= (df["reference_kind"] == TEACHER_FORCED).fillna(False)
            is_ref |= seq.isin(sampled_refs)  # likewise a further sampled reference
        is_ref = is_ref.to_numpy(dtype=bool)
        ref = df.loc[is_ref]
        here = set(ref["seq_id"].astype(str))
        new = reference_tokens(ref, oracle, {s: v for s, v in held_out.items() if s in here}, first, decode,
                               sampled={s: v for s, v in sampled_refs.items() if v[0] in here},
                               kind=SAMPLED if sampled else GREEDY) if len(ref) else ref
        rest = df.loc[~is_ref]
        if len(rest) and "reference_kind" not in rest.columns:
            rest = rest.assign(reference_kind=SAMPLED if sampled else GREEDY)
        out = pd.concat([new, rest], ignore_index=True) if len(rest) else new
        for col in GENERATION_COLUMNS:
            out[col] = out[col].astype("Int64")
        # rows of non-reference generations have no target choice: missing, in the same types as the rest
        for col, dtype in zip(CHOICE_COLUMNS, ("boolean", "Int64")):
            out[col] = (out[col] if col in out.columns else pd.Series(pd.NA, index=out.index)).astype(dtype)
        table = pa.Table.from_pandas(out.drop(columns="experts"), preserve_index=False)
        experts = pa.array([None if v is None or (not isinstance(v, np.ndarray) and pd.isna(v)) else v
                            for v in out["experts"]], type=EXPERTS_TYPE)
        table = table.add_column(list(out.columns).index("experts"), "experts", experts)
        write_part(root, "tokens", name, table)
    return len(parts)
