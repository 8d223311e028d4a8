"""The rule-based context labeller: hand-written snippets (every label), the Viterbi segmentation
against brute force, bad input, and agreement with the simulator's planted contexts."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from speclimits.errors import TraceFormatError
from speclimits.linguistic.labels import (
    label_agreement, label_tokens, label_trace_tokens, script_of, segment_modes, token_evidence)
from speclimits.vocabulary import CONTEXTS, FINE_LABELS

# A Markdown answer: prose, a fenced Python block (comment, definition, control flow), prose
# again, a Russian sentence, back to Latin, and an inline LaTeX formula.
ANSWER = ["Here", " is", " the", " code", ":", "\n", "```", "python", "\n", "def", " compute", "_cost", "(", "x",
          "):", "\n    ", "# add", " one", "\n    ", "if", " x", " >", " 0", ":", "\n        ", "return", " x",
          " +", " 1", "\n", "```", "\n\n", "The", " function", " returns", " a", " value", ".", " Это", " функция",
          ".", " See", " $", "\\frac", "{", "1", "}{", "2", "}$", " and", " more", "."]


def _lab(texts):
    df = label_tokens(texts)
    return {i: (r.context, r.fine, r.mode) for i, r in enumerate(df.itertuples())}


def test_every_context_and_fine_label_on_a_hand_written_answer():
    lab = _lab(ANSWER)
    expect_context = {
        0: "prose_boundary",   # a sentence start
        1: "prose_vocab", 2: "prose_vocab", 3: "prose_vocab",
        4: "prose_boundary", 5: "prose_boundary",
        6: "mode_change",      # the opening fence: prose -> markup
        7: "mode_change",      # first token inside the fence: markup -> code
        8: "code_format", 9: "code_structure", 10: "code_vocab", 12: "code_format", 13: "code_vocab",
        15: "code_format",     # indentation
        19: "code_structure", 21: "code_format", 25: "code_structure",
        30: "mode_change",     # the closing fence
        32: "mode_change",     # back to prose
        33: "prose_vocab", 37: "prose_boundary",
        38: "script_change",   # Latin -> Cyrillic
        39: "prose_vocab",
        41: "script_change",   # Cyrillic -> Latin
        42: "mode_change",     # " $" opens a formula
        43: "markup", 44: "markup", 46: "markup",
        49: "mode_change",     # back to prose after the formula
        51: "prose_boundary",
    }
    for i, ctx in expect_context.items():
        assert lab[i][0] == ctx, (i, ANSWER[i], lab[i])
    expect_fine = {9: "function_start", 10: "function_start", 11: "word_continuation", 16: "comment",
                   17: "comment", 19: "control_flow", 25: "control_flow", 18: "", 20: "", 33: ""}
    for i, fine in expect_fine.items():
        assert lab[i][1] == fine, (i, ANSWER[i], lab[i])
    seen_context = {v[0] for v in lab.values()}
    seen_fine = {v[1] for v in lab.values()} - {""}
    assert seen_context == set(CONTEXTS)
    assert seen_fine == set(FINE_LABELS)


def test_word_continuation_and_scripts_in_prose():
    df = label_tokens(["The", " mod", "el", " works", ".", " Модель", " работает", "."])
    assert df["fine"].tolist()[2] == "word_continuation"
    assert df["context"].tolist() == ["prose_boundary", "prose_vocab", "prose_vocab", "prose_vocab",
                                      "prose_boundary", "script_change", "prose_vocab", "prose_boundary"]
    assert df["script"].tolist() == ["latin"] * 4 + ["none", "cyrillic", "cyrillic", "none"]


def test_code_without_fences_is_found_from_its_tokens_and_a_word_is_not_split():
    prose = ["In", " this", " section", " we", " describe", " how", " the", " value", " of", " the", " model",
             " is", " computed", ":", "\n"]
    code = ["x", "_val", " =", " compute", "(", "data", ")", "\n", "print", "(", "x", "_val", ")"]
    df = label_tokens(prose + code)
    modes = df["mode"].tolist()
    assert modes[: len(prose)] == ["prose"] * len(prose)
    assert modes[len(prose):] == ["code"] * len(code)
    # the change sits at the start of the word "x_val", not inside it
    assert df["context"].tolist()[len(prose)] == "mode_change"
    assert df["context"].tolist()[len(prose) + 1] == "code_vocab"


def test_one_odd_token_does_not_flip_the_mode():
    df = label_tokens(["The", " results", " (", "see", " below", ")", " are", " good", "."])
    assert set(df["mode"]) == {"prose"}
    assert "mode_change" not in set(df["context"])


def test_a_script_change_needs_letters_and_skips_punctuation():
    df = label_tokens([" модель", " и", ".", " ", "\n", "(", " The", " end"])
    assert df["context"].tolist()[6] == "script_change"
    assert (df["context"] == "script_change").sum() == 1
    assert script_of("42") == "none" and script_of("ёж") == "cyrillic" and script_of("naïve") == "latin"


@pytest.mark.parametrize("text, mode", [("_cache", 1), ("camelCase", 1), (" ==", 1), ("\n    ", 1), (" the", 0),
                                        (" модель", 0), ("\\sum", 2), ("</p>", 2), (",", None), ("\n", None)])
def test_token_evidence_examples(text, mode):
    """The strongest evidence of a token (prose 0, code 1, markup 2; None: neutral)."""
    ev = token_evidence(text)
    assert np.argmax(ev) == mode if mode is not None else ev == (0.0, 0.0, 0.0)


def _brute_force(ev, cost):
    best, best_seq = -np.inf, None
    for seq in itertools.product(range(ev.shape[1]), repeat=len(ev)):
        score = sum(ev[t, s] for t, s in enumerate(seq)) - cost * sum(a != b for a, b in zip(seq, seq[1:]))
        if score > best + 1e-12:
            best, best_seq = score, seq
    return best, best_seq


def test_viterbi_segmentation_matches_brute_force():
    rng = np.random.default_rng(5)
    for _ in range(40):
        t = int(rng.integers(1, 7))
        ev = rng.integers(0, 4, size=(t, 3)).astype(float)
        cost = float(rng.choice([0.5, 2.5, 4.0]))
        best, _ = _brute_force(ev, cost)
        got = segment_modes(ev, switch_cost=cost)
        score = ev[np.arange(t), got].sum() - cost * np.count_nonzero(np.diff(got))
        assert score == pytest.approx(best)


def test_viterbi_puts_a_change_at_the_first_token_of_the_new_mode():
    ev = np.array([[3, 0, 0], [0, 0, 0], [0, 0, 0], [0, 3, 0], [0, 3, 0]], dtype=float)
    assert segment_modes(ev, 2.5).tolist() == [0, 0, 0, 1, 1]
    ev = np.array([[2, 0, 0], [0, 3, 0], [2, 0, 0]], dtype=float)
    assert segment_modes(ev, 2.5).tolist() == [0, 0, 0]
    assert segment_modes(np.zeros((4, 3)), 2.5).tolist() == [0, 0, 0, 0]
    forced = np.array([-1, 1, -1])
    assert segment_modes(ev, 2.5, forced=forced).tolist()[1] == 1


def test_label_trace_tokens_sorts_and_rejects_bad_tables():
    tok = pd.DataFrame({"seq_id": ["b", "a", "a"], "pos": [0, 1, 0], "text": [" x", " the", "The"]})
    out = label_trace_tokens(tok)
    assert out[["seq_id", "pos"]].values.tolist() == [["a", 0], ["a", 1], ["b", 0]]
    assert {"label", "label_mode", "label_fine", "label_script"} <= set(out.columns)
    with pytest.raises(TraceFormatError, match="column 'text'"):
        label_trace_tokens(tok.drop(columns="text"))
    with pytest.raises(TraceFormatError, match="duplicate"):
        label_trace_tokens(pd.concat([tok, tok.iloc[:1]]))
    with pytest.raises(TraceFormatError, match="planted"):
        label_agreement(out)


def test_agreement_with_the_planted_contexts_of_a_simulated_trace(smoke_trace):
    from speclimits.trace import read_trace

    tr = read_trace(smoke_trace)
    agree = label_agreement(label_trace_tokens(tr.tokens))
    assert agree.n_tokens == len(tr.tokens)
    assert agree.accuracy > 0.85 and agree.kappa > 0.8
    assert agree.script_accuracy == 1.0
    by = agree.by_context.set_index("context")
    # the contexts the analysis leans on are recovered; mode changes are not (the simulator's
    # transition token is the same word whatever the new mode), and the test says so
    for ctx in ("code_format", "code_structure", "prose_vocab", "markup", "script_change"):
        assert by.loc[ctx, "f1"] > 0.85, ctx
    assert by.loc["mode_change", "recall"] < 0.6
    assert agree.confusion.to_numpy().sum() == agree.n_tokens


def test_inline_math_and_inline_code_spans():
    texts = ["The", " sum", " is", " $", "x", "_i", "$", " for", " every", " item", " in", " the", " list", "."]
    df = label_tokens(texts)
    assert df["mode"].tolist()[3:7] == ["markup"] * 4  # identifiers inside $...$ are a formula, not code
    assert df["context"].tolist()[3] == "mode_change"
    assert df["mode"].tolist()[-1] == "prose"
    # an unpaired "$" (a price) does not swallow the rest of the sentence
    df = label_tokens(["It", " costs", " $", "5", " and", " the", " model", " runs", " on", " the", " cluster", "."])
    assert df["mode"].tolist()[5:] == ["prose"] * 7
    # a fenced block wins over the look of its tokens
    df = label_tokens(["Text", " here", ":", "\n", "```", "\n", "the", " quick", " brown", " fox", "\n", "```"])
    assert df["mode"].tolist()[6:10] == ["code"] * 4
