# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# (sec-linguistic)=
# # Linguistic study: where the Oracle drafts long, and where routing moves
#
# The Oracle chooses a draft length $k^\star(n)$ at every position $n$ of a reference response.
# The appendix asks two questions of those decisions. **Draft length:** is $k^\star$ longer where
# the continuation is linguistically regular (code formatting, a repeated structure) and shorter
# at boundaries (a switch from Latin to Cyrillic script)? **Routing:** does a linguistic
# transition bring more *new experts* (experts per MoE layer used at a position and not at the
# one before), and is there a similar spike where the draft first mismatches the reference?
#
# Each decision is labelled with the local context of the token its draft's first step predicts
# (token row `pos + 1` for state `pos`: the convention of {ref}`methods-positions`, checked below
# on a measured trace), by a rule-based labeller that reads only the token text (so that it runs
# unchanged on a measured trace). The labels describe the observed fragment and are used only to
# compare groups. Intervals are 95% percentile intervals of a bootstrap that resamples whole
# responses. **Greedy references** (the target's own output, as in the paper) give the headline;
# **teacher-forced** references (held-out text the target often disagrees with) are a different
# process and are shown apart, never pooled.

# %% tags=["remove-cell"]
import speclimits.book_support as bs
from speclimits import figures, paper
from speclimits import linguistic as ling
from speclimits.book.views import linguistic as view
from speclimits.book.views.oracle import relative_paths
from speclimits.linguistic import gallery
from speclimits.oracle import prepare_oracle
from speclimits.oracle.prepare import oracle_data_missing
from speclimits.oracle.ablation import alpha_ablation
from speclimits.vocabulary import TEACHER_FORCED

# %% tags=["parameters", "remove-cell"]
trace = None
smoke = False
seed = 0
n_boot = 999
k_max = None
per_group = 4
n_ablation = 4
surrogate = "auto"
cost_model = None
results = None

# %% tags=["remove-input"]
page = bs.setup(results)
key = page.key_results("sec-linguistic", "linguistic study")

# %% tags=["hide-input"]
tr = page.load(trace)
oracle_ok = page.shows("the linguistic study (this whole section: it solves the Oracle)", oracle_data_missing(tr))
if oracle_ok:
    print(tr.source_label)
    boot = bs.smoke_sizes(smoke, n_boot=n_boot)
    setup = prepare_oracle(tr, cost_model, surrogate)
    print("\n".join(relative_paths(setup.notes, cost_model, tr.path)))
    k_asked = setup.inputs.k_list if k_max is None else k_max
    k_max, k_note = setup.priced_k_max(k_max)
    page.shows(f"the Oracle with drafts of up to $K_{{\\max}} = {k_asked}$ tokens", k_note)
    res = setup.solve(k_max=k_max)
    print(res.summary())
    kind_of = dict(zip(setup.inputs.seq_ids.astype(str), setup.kinds))

# %% [markdown]
# **The join.** Where the draft's first token matched (`accept_len` ≥ 1), it *is* the reference
# token the state's first draft predicts, so on a trace that records the draft's tokens the join
# can be checked directly: the share below must be 1 for the convention (row `pos + 1`) and is far
# from it for the other rule (row `pos`). A simulated trace records no draft tokens (no table then).

# %% tags=["hide-input"]
if oracle_ok:
    has_drafts = tr.oracle is not None and "draft_tokens" in tr.oracle.columns
    if has_drafts:
        page.table(view.alignment(ling.alignment_check(tr.oracle, tr.tokens, kind_of)), "tbl-ling-alignment",
                   "The join check: share of states whose matched first draft token equals token row `pos + 1` "
                   "(the convention) and row `pos` (the other rule), per kind of reference.", decimals=3)

# %% [markdown]
# ## Context labels
#
# The rules (documented in `speclimits.linguistic.labels`): each token gets evidence for the
# modes *code*, *prose* and *markup* from its own string (identifiers with `_` or camelCase,
# operators, brackets and indentation point to code; function words, capitalised and Cyrillic
# words to prose; `$`, LaTeX commands, HTML tags to markup), and a Viterbi pass with a penalty
# per switch turns the evidence into modes, putting each change at the first token that shows
# the new mode. The context label is then, in order of precedence: **script change** (the first
# token with letters whose script differs from the last token with letters), **mode change**
# (the first token of a new mode), and within a mode: code formatting / structure (keywords) /
# vocabulary, prose vocabulary / boundary (punctuation, line breaks, sentence starts), markup.
# Finer labels mark function starts, control flow, comments and word continuations.
# {numref}`tbl-ling-labels` counts the labels over all reference tokens.

# %% tags=["hide-input"]
if oracle_ok:
    lab = ling.label_trace_tokens(tr.tokens)
    page.table(view.label_counts(lab), "tbl-ling-labels", "Tokens per context label (rule-based labeller), all references.",
               decimals={"Share of tokens": 3})

# %% [markdown]
# On a simulated trace every token also carries the context the simulator planted, so the
# labeller can be checked against it, in a table and a figure (on a measured trace there are none).

# %% tags=["hide-input"]
if oracle_ok:
    agree = ling.label_agreement(lab) if "context" in lab.columns else None
    if agree is not None:
        page.table(view.agreement(agree.by_context), "tbl-ling-agreement",
                   f"The labeller against the planted contexts, per planted context: over {agree.n_tokens:,} tokens "
                   f"agreement {agree.accuracy:.3f}, Cohen's $\\kappa$ {agree.kappa:.3f}, script of tokens with letters "
                   f"{agree.script_accuracy:.3f}.", decimals=3)

# %% tags=["hide-input"]
if oracle_ok:
    if agree is not None:
        page.figure(figures.label_confusion_chart(agree.confusion), "fig-ling-label-confusion",
                    "Planted context (rows) against the rule-based label (columns), as shares of each planted context. "
                    "Mass off the diagonal is the labeller's error; mode changes are where it is largest.")

# %% [markdown]
# ## $k^\star$ by context
#
# One decision per Oracle state. {numref}`tbl-ling-k-by-context` gives, per context, the number of
# decisions and responses, the share of decisions with $k^\star \ge 4$ and with $k^\star = 1$, each
# with its cluster-bootstrap interval, and the paper's share of $k^\star \ge 4$ where the appendix
# reports it (its $k^\star = 1$ share, reported for script changes only, is in
# {numref}`tbl-ling-paper`). {numref}`fig-ling-k-long` and {numref}`fig-ling-k1` draw the two shares,
# {numref}`fig-ling-k-distribution` the whole distribution of $k^\star$.

# %% tags=["hide-input"]
if oracle_ok:
    studies = ling.study_by_kind(res, lab, setup.kinds, n_boot=boot, seed=seed)
    head = ling.headline(studies)
    dec, kctx = head.decisions, head.k_by_context
    print(f"headline: {head.kind} references, {len(dec):,} decisions over {head.n_responses} responses; "
          f"kinds: {', '.join(f'{k} ({len(v.decisions):,})' for k, v in studies.items())}")
    page.table(view.k_by_context(kctx), "tbl-ling-k-by-context",
               f"Oracle decisions by context on the headline ({head.kind}) references: share of $k^\\star \\ge 4$ and "
               "of $k^\\star = 1$ with 95% intervals (bootstrap over responses), beside the paper's.", full=kctx)

# %% tags=["hide-input"]
if oracle_ok:
    page.figure(figures.k_by_context_chart(kctx), "fig-ling-k-long",
                "Share of decisions with $k^\\star \\ge 4$ per context with 95% intervals; open diamonds are the paper's. "
                "Look for long drafts in regular code and short ones at boundaries.")

# %% tags=["hide-input"]
if oracle_ok:
    page.figure(figures.k_by_context_chart(kctx, measure="k1"), "fig-ling-k1",
                "Share of decisions with $k^\\star = 1$ per context with 95% intervals; open diamonds are the paper's. "
                "A boundary that stops drafts shows as a high share.")

# %% tags=["hide-input"]
if oracle_ok:
    page.figure(figures.k_star_distribution_chart(ling.k_star_shares(dec), contexts=list(kctx["context"])),
                "fig-ling-k-distribution",
                "Distribution of $k^\\star$ per context (stacked shares of the headline references' decisions).")

# %% [markdown]
# The same table on the teacher-forced references, apart (on a trace with greedy references only
# there is no such table). Here the Oracle walks a text the target did not choose: the draft
# predicts it far less often, and the decisions are short almost everywhere.

# %% tags=["hide-input"]
if oracle_ok:
    forced = studies.get(TEACHER_FORCED)
    if forced is not None:
        page.table(view.k_by_context(forced.k_by_context), "tbl-ling-k-by-context-forced",
                   "Oracle decisions by context on the teacher-forced references (a different process, never pooled "
                   "with the greedy ones), beside the paper's.", full=forced.k_by_context)

# %% [markdown]
# Finer labels ({numref}`tbl-ling-k-by-fine-label`): the appendix notes that return and
# control-flow keywords go with a longer, not a shorter, continuation.

# %% tags=["hide-input"]
if oracle_ok and page.shows("the decisions by fine label", None if len(head.k_by_fine_label) else
                            "no Oracle decision of this trace carries a fine label (the labeller finds none in its "
                            "text: prompts given as token ids without a tokenizer have no text to label)"):
    page.table(view.k_by_context(head.k_by_fine_label, first="Fine label"), "tbl-ling-k-by-fine-label",
               "Oracle decisions by fine label on the headline references, with 95% intervals (the paper reports "
               "no shares for these).", full=head.k_by_fine_label)

# %% [markdown]
# On a simulated trace the same table by the *planted* context shows what the labeller's
# errors change (on a measured trace there is no such table).

# %% tags=["hide-input"]
if oracle_ok:
    if "context" in dec.columns:
        planted_k = ling.k_by_context(dec, by="context", n_boot=boot, seed=seed)
        page.table(view.k_by_context(planted_k, first="Planted context"), "tbl-ling-k-by-planted-context",
                   "Oracle decisions by the context the simulator planted (not the labeller's), beside the paper's.",
                   full=planted_k)

# %% [markdown]
# ## Routing at script changes and at the first mismatch
#
# New experts per layer at the event step against the step right before it, aligned by
# continuation step. *Script change*: a reference token whose script differs from the last
# token with letters, against the token before it. *First mismatch (reference)*: per decision,
# the reference token the draft missed against the one before it. *First mismatch (window)*:
# the target's routing on the draft chain (`u_bar_window`), the experts the first wrong draft
# adds against those the last correct one added; the window's unique count saturates, so the
# step-adjusted row subtracts the same difference for correct pairs at the same step.
# {numref}`tbl-ling-routing` gives the numbers beside the paper's, {numref}`fig-ling-routing` draws
# the differences; on a simulated trace the table also gives the planted difference.

# %% tags=["hide-input"]
if oracle_ok:
    contrasts, rtab = head.contrasts, head.routing
    planted = [ling.planted_contrast(c, tr.meta) for c in contrasts[:2]] if tr.simulated else None
    page.table(view.routing(rtab, planted), "tbl-ling-routing",
               f"New experts per layer at the event step and the step before on the headline ({head.kind}) references, "
               "and their difference with its 95% interval (bootstrap over responses), beside the paper's"
               + ("; *Planted*: the planted difference, what the simulator put in." if planted else "."), full=rtab)

# %% tags=["hide-input"]
if oracle_ok:
    page.figure(figures.routing_contrast_chart(rtab), "fig-ling-routing",
                "Difference in new experts per layer (event step − step before) with 95% intervals, ours and the paper's. "
                "Look for a jump at script changes and none at the first mismatch.")

# %% tags=["hide-input"]
if oracle_ok:
    if forced is not None:
        page.table(view.routing(forced.routing), "tbl-ling-routing-forced",
                   f"The routing contrasts on the teacher-forced references, apart: {forced.note}.", full=forced.routing)

# %% [markdown]
# ## Where this pair differs from the paper
#
# The appendix's headline quantities beside ours, on the headline (greedy) references and, apart,
# on the teacher-forced ones; *consistent* when the two 95% intervals overlap (the paper gives no
# interval for the mode change): {numref}`tbl-ling-paper`.

# %% tags=["hide-input"]
if oracle_ok:
    cmp_head = ling.paper_comparison(head)
    page.table(view.comparison(cmp_head), "tbl-ling-paper",
               f"The appendix's linguistic headline quantities beside ours on the headline ({head.kind}) references, "
               "with 95% intervals; *consistent* when the intervals overlap.", full=cmp_head)

# %% tags=["hide-input"]
if oracle_ok:
    if forced is not None:
        cmp_forced = ling.paper_comparison(forced)
        page.table(view.comparison(cmp_forced), "tbl-ling-paper-forced",
                   "The same quantities on the teacher-forced references, apart.", full=cmp_forced)

# %% tags=["hide-input"]
if oracle_ok:
    for name, st in studies.items():
        diff = view.differing(ling.paper_comparison(st))
        print(f"{name} references differ from the paper on {len(diff)} of 7 quantities" + "".join(f"\n  - {q}" for q in diff))

# %% [markdown]
# On the two measured traces (the trained 16-layer, 32-expert Qwen3-MoE target and its EAGLE-3 head, and
# the memory-bound twin of that target, the book's default: the same tokens and routing, other costs) the
# code-formatting share and both routing contrasts land near the paper's, the routing contrasts exactly
# alike on both since the twin routes as its source: more new experts at a Latin↔Cyrillic switch than at
# the step before, none to speak of at the first mismatch (the code-formatting share is lower on the twin,
# where every extra draft token costs more; the key-results box sets both beside the paper's). The
# prose-vocabulary share is higher than the paper's, its interval just reaching it on the trained pair
# (the table above gives this build's).
# The **script change** is where the pair differs. On greedy references a switch is
# *not* a short-draft point: about as many of those decisions draft long as elsewhere, and far fewer
# stop at $k^\star = 1$ than the paper's 94%, although the routing does jump there. A likely reason
# is the pair itself: the target learned Russian from man pages that interleave Russian prose with C
# identifiers and English, so switching script is routine for it, and the draft head was trained on
# the target's own greedy continuations, so it anticipates the target's switches (few decisions in few
# responses: the interval is wide). On held-out Russian text (teacher-forced) script changes are
# short-draft points, as in the paper, but so is nearly everything there, since the draft rarely
# predicts a text the target did not choose. The code↔text mode change drafts shorter here than in
# the paper on both kinds. On a simulated trace the same tables test the planted effects instead
# (script changes are planted as hard to draft and routing-heavy).

# %% [markdown]
# ## Decisions where the expert term sets the boundary ($\alpha = 0$)
#
# Zeroing the expert coefficient and re-solving the whole problem moves $k^\star$ in some
# states; below are the cases with $Q^0(k^\star+1) - Q^0(k^\star) < 0$ and the highest match
# probability of the added token, one per response (rule in
# `speclimits.linguistic.gallery.select_ablation_cases`). Each panel: target continuation on
# top, draft below; green = match, red = first mismatch, grey = after it; faded = past
# $k^\star$; solid line after $k^\star$, dashed after $a_{\mathrm{mode}}$, dotted orange after
# $k^\star$ of the $\alpha = 0$ solution. The cases are listed in {numref}`tbl-ling-ablation`.

# %% tags=["hide-input"]
if oracle_ok:
    abl = alpha_ablation(res, draft_prob=setup.raw_inputs.match_prob)  # the draft's own probability, as in the paper
    head_seqs = set(dec["seq_id"].astype(str))
    cases = gallery.select_ablation_cases(abl.cases[abl.cases["seq_id"].astype(str).isin(head_seqs)], n=n_ablation)
    page.table(view.ablation_cases(cases), "tbl-ling-ablation",
               f"Decisions where the expert term sets the boundary: {len(abl.cases):,} of {res.inputs.n_states:,} states "
               "have $Q^0(k^\\star+1) - Q^0(k^\\star) < 0$; shown, one per response, those whose added token has the "
               f"highest match probability (paper: four cases, {paper.CASE_MATCH_RANGE[0]:.2%}–{paper.CASE_MATCH_RANGE[1]:.2%}). "
               "$\\Delta Q^0$, $\\Delta Q$: $Q(k^\\star+1) - Q(k^\\star)$ at $\\alpha = 0$ and as fitted.",
               decimals={"Match prob. of added token": 4, "$\\Delta Q^0$": 4, "$\\Delta Q$": 4})

# %% tags=["hide-input"]
if oracle_ok:
    if len(cases):
        page.figure(figures.decision_panels(gallery.panel_data(res, lab, cases, oracle=tr.oracle)), "fig-ling-ablation",
                    "The $\\alpha = 0$ cases: target continuation on top, draft below (green match, red first mismatch, "
                    "grey after it, faded past $k^\\star$). Look at where the dotted orange line ($k^\\star$ at "
                    "$\\alpha = 0$) passes the solid one.")

# %% [markdown]
# ## A stratified gallery of twelve decisions
#
# Three groups fixed in advance: regular continuations (exact matches of eight tokens or more,
# of different types), structural boundaries, and counterexamples to "a boundary or a
# mismatch means a short draft". Twelve decisions from twelve different responses, none of them
# an $\alpha = 0$ case above (rule in `speclimits.linguistic.gallery.select_gallery`), all on
# headline (greedy) references, as are the $\alpha = 0$ cases. The gallery is for reading
# decisions, not for estimating how often anything happens ({numref}`tbl-ling-gallery`,
# {numref}`fig-ling-gallery`).

# %% tags=["hide-input"]
gal = None
if oracle_ok:
    gal = gallery.select_gallery(dec, n_per_group=per_group, exclude=list(zip(cases["seq_id"], cases["pos"])), seed=seed)
if gal is not None and page.shows("the gallery of decisions", None if len(gal) else
                                  "no decision of this trace fits any of the gallery's groups (groups short of "
                                  f"candidates: {', '.join(gal.attrs.get('short', [])) or 'none'})"):
    page.table(view.gallery(gal), "tbl-ling-gallery",
               f"The gallery's decisions: group, case, where, label, the Oracle's $k^\\star$, the modal advancement "
               f"$a_{{\\mathrm{{mode}}}}$, the accepted length and $p_1$, the first draft's match probability. Groups short of "
               f"candidates: {', '.join(gal.attrs['short']) or 'none'}.", decimals={"$p_1$": 3}, full=gal)

# %% tags=["hide-input"]
if gal is not None and len(gal):
    page.figure(figures.decision_panels(gallery.panel_data(res, lab, gal, oracle=tr.oracle)), "fig-ling-gallery",
                "Twelve decisions, one per response: target continuation on top, draft below (green match, red first "
                "mismatch, grey after it, faded past $k^\\star$; solid line after $k^\\star$, dashed after "
                "$a_{\\mathrm{mode}}$).")

# %% [markdown]
# ## Limits
#
# The paper's sample is one target/draft pair and 39 responses; Cyrillic text sits mostly in
# code-containing responses, so script cannot be separated from domain, and the same holds
# here wherever script and category go together. On a simulated trace the contexts, their
# match probabilities and their routing overlaps are planted, so the tables above test that
# the analysis recovers what was put in, not a fact about language models; the simulator's
# transition tokens are synthetic, which is why the labeller's mode changes agree poorly with
# the planted ones. Decisions of one response share text and are not independent, which is why
# the bootstrap resamples responses; contexts seen in few responses (script changes) have wide
# intervals, and with so few clusters the percentile bootstrap is too narrow: over 20 simulated
# traces of the default preset (about 7 responses with script changes each) the 95% interval of
# the script-change contrast covered the planted difference in 85% of them
# (`benchmarks/bench_linguistic.py`). The paper's script-change interval (8 responses) shares
# this limit. The draft row of a panel shows the draft's own tokens only when the trace carries
# them; otherwise it shows the reference up to the match length and placeholders after it.
# On the measured traces the target's per-token routing was recorded for its own
# generations only, so the reference-token routing contrasts exist for greedy references and
# not for teacher-forced ones (their `new_experts` are missing, not borrowed from another text).

# %% tags=["remove-input"]
key.fill(view.key_rows(cmp_head, refs={"k": "tbl-ling-k-by-context", "r": "tbl-ling-routing"}) if oracle_ok else
         [bs.Result("k* by linguistic context", bs.NOT_IDENTIFIED)])

# %% [markdown]
# ## Versions

# %% tags=["remove-input"]
bs.version_report(tr)
