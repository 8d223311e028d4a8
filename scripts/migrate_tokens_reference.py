"""Rewrite an OLD measured trace's tokens.parquet so that every sequence holds the reference the Oracle walks.

Only for traces written before the harness wrote this layout itself: ``speclimits trace --oracle``
now records routing on the reading rows and rewrites tokens.parquet at the end of its Oracle pass
(:func:`speclimits.tracing.oracle_mode.write_reference_tokens`, on
:mod:`speclimits.trace.reference_tokens`, whose functions this script uses). The bundled
``data/traces/measured-eagle3`` was written before and migrated by this script; ``--check``
verifies it is up to date.

Usage: python scripts/migrate_tokens_reference.py [TRACE] [--tokenizer DIR] [--check]
(defaults: data/traces/measured-eagle3, data/models/target). Re-runnable: the teacher-forced rows
are rebuilt from the trace's own sources every time, the greedy rows are kept, so a second run
writes the same table. ``--check`` only reports whether the table on disk is what it would write.

Before the migration, tokens.parquet held for every sequence the K = 0 greedy generation, also for
the 12 teacher-forced sequences, whose Oracle walks a held-out text instead. After it:

* greedy references: the K = 0 generation's rows (it is the reference), plus
  ``reference_kind = "greedy"``, with the routing (``new_experts``, ``experts``) moved from the
  harness's producing rows onto the reading rows (row r gets the routing of the pass that reads
  row r's token, which the harness stored at row r + 1; the last token is never read, so its
  routing is missing). Which convention a table is in is read off the data, not assumed: the
  Oracle's windows match ``new_experts`` at row ``pos + 1`` (reading rows) or ``pos + 2``
  (producing rows) exactly, so a migrated table is left as it is;
* teacher-forced references: ``token_id`` = the prompt's ``reference_token_ids``
  (``prompts.jsonl``), ``text`` decoded one token at a time by the project tokenizer (as the
  harness decodes), ``reference_kind = "teacher-forced"``; ``new_experts`` NaN and ``experts``
  null (the target's routing on the held-out text was not recorded per token), and
  ``generation_id`` / ``K`` / ``round`` / ``row`` null (no sweep generation produced them);
  ``context_len`` = prompt length + pos, as for every row;
* every row: ``target_agrees`` (did the target's own greedy choice, given the reference prefix,
  equal this token? from ``oracle.parquet``'s ``forced`` at state ``pos``; on a greedy reference
  also True at the last row, which no state forces, since the reference is the target's own
  output; null there on a teacher-forced one) and ``target_token_id`` (the target's own choice
  where known: the token itself where the target agrees, the K = 0 generation's first token at
  row 0, else null).

Checks before writing (the script stops on any failure): reference lengths equal the number of
token rows; the greedy rows' text is what the tokenizer decodes; where ``accept_len >= 1`` the
first draft token equals token row ``pos + 1`` in every state (the convention of
:mod:`speclimits.linguistic.align`); row 0 of a teacher-forced sequence agrees with the K = 0
generation exactly where ``forced`` is False at state 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from speclimits.linguistic.align import alignment_check, window_routing_check
from speclimits.models.tokenizer import load_tokenizer
from speclimits.trace import read_meta, write_meta
from speclimits.trace.reference_tokens import CHOICE_COLUMNS, add_target_choice, forced_rows, to_reading_rows
from speclimits.vocabulary import GREEDY as KIND_GREEDY
from speclimits.vocabulary import TEACHER_FORCED as KIND_FORCED
#: What meta.json's ``conventions`` says about the tokens after the migration.
TOKENS_CONVENTION = ("tokens: row pos = the token the context ends with at Oracle state pos (state pos drafts row "
                     "pos + 1 first); tokens.experts/new_experts = routing of the pass that reads the token (moved "
                     "from the harness's producing rows by scripts/migrate_tokens_reference.py; missing on "
                     "teacher-forced references and on each generation's last token)")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def routing_convention(tokens: pd.DataFrame, oracle: pd.DataFrame) -> str:
    """``"reading"`` or ``"producing"``: the row offset at which the Oracle's windows match
    ``new_experts`` exactly (see :func:`speclimits.linguistic.align.window_routing_check`)."""
    found = []
    for name, offset in (("reading", 1), ("producing", 2)):
        chk = window_routing_check(oracle, tokens, row_offset=offset)
        if len(chk) > 100 and chk["abs_diff"].max() < 1e-9:
            found.append(name)
    if len(found) != 1:
        raise SystemExit(f"cannot tell the routing convention of tokens.parquet from the Oracle's windows ({found})")
    return found[0]


def greedy_rows(tokens: pd.DataFrame, forced_ids: set[str], convention: str) -> pd.DataFrame:
    """The rows of the greedy references, routing on the reading rows (a previous run's extra
    columns dropped)."""
    keep = [c for c in tokens.columns if c not in ("reference_kind", *CHOICE_COLUMNS)]
    out = tokens.loc[~tokens["seq_id"].astype(str).isin(forced_ids), keep].copy()
    if convention == "producing":
        out = to_reading_rows(out)
    out["reference_kind"] = KIND_GREEDY
    return out


def forced_sequence(prompt: dict, old: pd.DataFrame, decode) -> pd.DataFrame:
    """The rows of one teacher-forced reference, from its prompt record and its old rows (for the
    prompt length and the category)."""
    ref = [int(x) for x in prompt["reference_token_ids"]]
    if len(ref) != len(old):
        raise SystemExit(f"{prompt['id']}: {len(ref)} reference tokens but {len(old)} token rows")
    n_prompt = int(old["context_len"].iloc[0] - old["pos"].iloc[0])
    return forced_rows(prompt["id"], ref, n_prompt, decode, old["category"].iloc[0] if "category" in old else None)


def check(tokens: pd.DataFrame, oracle: pd.DataFrame, first_greedy: dict[str, int], decode) -> list[str]:
    """The checks of the module docstring; returns the failures (empty when all hold)."""
    bad = []
    kinds = dict(zip(tokens["seq_id"].astype(str), tokens["reference_kind"]))
    greedy = tokens[tokens["reference_kind"] == KIND_GREEDY]
    sample = greedy.iloc[:: max(1, len(greedy) // 500)]
    wrong = [(s, p) for s, p, t, x in zip(sample["seq_id"], sample["pos"], sample["token_id"], sample["text"])
             if decode(int(t)) != x]
    if wrong:
        bad.append(f"greedy rows whose text is not the tokenizer's decoding: {wrong[:5]}")
    align = alignment_check(oracle, tokens, kinds)
    if routing_convention(tokens[tokens["reference_kind"] == KIND_GREEDY], oracle) != "reading":
        bad.append("the routing is not on the reading rows")
    for r in align.itertuples():
        if r.share_row_pos_plus_1 != 1.0:
            bad.append(f"{r.reference_kind}: first draft token = token row pos + 1 in only "
                       f"{r.share_row_pos_plus_1:.1%} of {r.n_states} states with accept_len >= 1")
    o0 = oracle[oracle["pos"] == 0].set_index(oracle.loc[oracle["pos"] == 0, "seq_id"].astype(str))
    t0 = tokens[tokens["pos"] == 0].set_index(tokens.loc[tokens["pos"] == 0, "seq_id"].astype(str))
    for s in t0.index:
        same = int(t0.loc[s, "token_id"]) == first_greedy[s]
        if same == bool(o0.loc[s, "forced"]):
            bad.append(f"{s}: row 0 agrees with the K = 0 generation ({same}) but forced = {bool(o0.loc[s, 'forced'])}")
    return bad


def migrate(trace: Path, tokenizer: Path) -> pd.DataFrame:
    """The migrated tokens table of ``trace`` (not written)."""
    tok = load_tokenizer(tokenizer)

    def decode(t: int) -> str:
        return tok.decode([t])

    tokens = pd.read_parquet(trace / "tokens.parquet")
    oracle = pd.read_parquet(trace / "oracle.parquet", columns=["seq_id", "pos", "accept_len", "draft_tokens",
                                                                 "forced", "u_bar_window"])
    prompts = {str(p["id"]): p for p in read_jsonl(trace / "prompts.jsonl")}
    forced_ids = {s for s, p in prompts.items() if "reference_token_ids" in p}
    gens = [g for g in read_jsonl(trace / "generations.jsonl") if int(g["K"]) == 0]
    first_greedy = {str(g["prompt_id"]): int(g["output_token_ids"][0]) for g in gens}
    convention = routing_convention(tokens[~tokens["seq_id"].astype(str).isin(forced_ids)], oracle)
    parts = [greedy_rows(tokens, forced_ids, convention)]
    for s in sorted(forced_ids):
        parts.append(forced_sequence(prompts[s], tokens[tokens["seq_id"].astype(str) == s], decode))
    out = pd.concat(parts, ignore_index=True)
    for col in ("generation_id", "K", "round", "row"):
        out[col] = out[col].astype("Int64")
    order = {s: i for i, s in enumerate(pd.unique(tokens["seq_id"].astype(str)))}
    out = out.sort_values(["seq_id", "pos"], key=lambda c: c.map(order) if c.name == "seq_id" else c,
                          kind="stable").reset_index(drop=True)
    out = add_target_choice(out, oracle, first_greedy)
    problems = check(out, oracle, first_greedy, decode)
    if problems:
        raise SystemExit("migration checks failed:\n  " + "\n  ".join(problems))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", nargs="?", type=Path, default=Path("data/traces/measured-eagle3"))
    ap.add_argument("--tokenizer", type=Path, default=Path("data/models/target"))
    ap.add_argument("--check", action="store_true", help="compare with the table on disk; write nothing")
    args = ap.parse_args(argv)
    new = migrate(args.trace, args.tokenizer)
    path = args.trace / "tokens.parquet"
    if args.check:
        old = pd.read_parquet(path)
        same = list(old.columns) == list(new.columns) and old.reset_index(drop=True).astype(str).equals(
            new.astype(str))
        print(f"{path}: {'up to date' if same else 'would change'}")
        return 0 if same else 1
    tmp = path.with_name("tokens.parquet.new")
    new.to_parquet(tmp, index=False)
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    tmp.rename(path)
    meta = read_meta(args.trace)
    head = str(meta.get("conventions", "")).split("; tokens")[0]
    meta["conventions"] = f"{head}; {TOKENS_CONVENTION}" if head else TOKENS_CONVENTION
    write_meta(args.trace, meta)
    n_forced = int((new["reference_kind"] == KIND_FORCED).sum())
    print(f"wrote {path}: {len(new):,} rows, {n_forced:,} of them teacher-forced reference tokens "
          f"({new.loc[new['reference_kind'] == KIND_FORCED, 'seq_id'].nunique()} sequences)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
