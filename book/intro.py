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
# (sec-intro)=
# # The limits of speculation, measured
#
# This book is the research companion of the preprint *The Limits of Speculation: Bounding
# Speculative Decoding in Mixture-of-Experts* (arXiv 2609.22156). It asks three questions of
# speculative decoding on a Mixture-of-Experts (MoE) target:
#
# 1. **What does a verification round really cost?** The target verifies $m = K + 1$ positions in
#    one pass; on an MoE the pass reads the weights of every expert that any of those positions
#    routes to, so the cost depends on $\bar U_r$, the unique experts touched, not only on $m$.
# 2. **Which factors drive that cost**, and how well does a simple model
#    $T_T = \beta_0(m) + \alpha(m)\,\bar U_r + c\,L$ predict it on held-out generations?
# 3. **How much could an ideal per-round choice of the draft length $K$ gain** over the best
#    static $K$? The Oracle solves a Bellman equation over reference sequences with
#    counterfactual MoE verification costs and gives a bound that no $K$ policy can beat.
#
# Beyond the paper, it runs adaptive-$K$ controllers inside vLLM and asks how much of that bound
# a rule deciding in real time can take. {numref}`fig-intro-speeds` answers at a glance, on this
# project's small MoE pair in both regimes it is measured in: the **memory-bound twin**, whose
# passes stream the experts they touch from memory as the paper's GPU does, and the
# **cache-resident pair** (the regimes are introduced below). Per batch size it gives the speed over
# plain decoding of the best static $K$ and of the controller, both measured in vLLM, and of three
# offline bounds: the *real-time bound* (the best rule that decides one round at a time, fed the
# true match probability of each draft), the *surrogate Oracle* (those probabilities, planned
# across rounds) and the *exact Oracle* (it knows which drafts match). A controller below the best
# static $K$ loses to the setting a user could pick by hand; the space between the controller and the
# exact Oracle is decomposed rung by rung in {ref}`sec-online-control`.

# %% tags=["remove-cell"]
import speclimits.book_support as bs
from speclimits.book.views import headline
from speclimits.book.views.oracle import wrap
from speclimits.figures.headline import speed_ladder

# %% tags=["parameters", "remove-cell"]
trace = None
smoke = False
seed = 0
results = None

# %% tags=["remove-cell"]
page = bs.setup(results)
speeds, speed_notes = headline.headline_speeds()

# %% tags=["remove-input"]
if len(speeds):
    page.figure(speed_ladder(speeds), "fig-intro-speeds", headline.caption(speeds))
else:
    page.cannot_show("the speeds of the best static K, the controller and the bounds",
                     "; ".join(speed_notes) or "no committed engine runs")

# %% tags=["remove-input"]
if len(speeds) and speed_notes:
    print(wrap(speed_notes))

# %% [markdown]
# Every number in the book is computed when the book is built, by the `speclimits` package, from
# one **trace**: a directory with `meta.json` and Parquet tables (one row per speculative round,
# plus dense per-position data for the Oracle). The cell below says which trace this build used;
# the figure above reads the two committed traces of the regimes and their engine runs, whichever
# trace the build is given.

# %% tags=["remove-input"]
tr = page.load(trace)
print("This build ran on:", wrap("  " + tr.source_label), sep="\n")
print("Trace directory:", tr.path.name, sep="\n  ")
if tr.meta.get("description"):
    print("Description:", tr.meta["description"], sep="\n  ")

# %% [markdown]
# ## The headline numbers
#
# {numref}`tbl-intro-key-results` gathers the key-results box at the top of each section: our
# estimate with its 95% interval beside the paper's value. Each row links to the section, and the
# quantity's reference links to the figure or table it comes from.

# %% tags=["remove-input"]
sections = ["sec-tracing", "sec-factors", "sec-final-model", "sec-draft-model", "sec-robustness", "sec-oracle",
            "sec-linguistic", "sec-online-control", "sec-beyond-batch"]
gathered = bs.gathered_results(results, sections, contrast=page.contrast)
if gathered is None:
    print("The key results are gathered when the whole book is built (speclimits book).")
else:
    other = (f" *{page.contrast.column}*: the same quantity on the other regime's trace ({{ref}}`sec-regimes`)."
             if page.contrast is not None else "")
    page.table(gathered, "tbl-intro-key-results",
               "Key results of every section, ours beside the paper's. Brackets: the 95% interval, unless the "
               "quantity names another range; a dash: the paper reports no such number." + other)

# %% [markdown]
# ## Simulated or measured?
#
# A trace's `meta.json` says where it came from: `source: "vllm"` for a trace recorded by the
# `speclimits trace` harness around a real vLLM engine, `source: "simulator"` for one written by
# `speclimits simulate`, a seeded simulation of the paper's setting (48 MoE layers × 128
# experts, top-8, a $K$ sweep 1..10) with a **planted** ground truth. Figures computed on a
# simulated trace are labelled SIMULATED; they show that the analysis recovers what was planted,
# not how real hardware behaves.
#
# By default the book runs on `data/traces/twin-eagle3`: a **measurement** of the real vLLM engine
# (CPU build) serving the project's own small pair, trained on this kind of machine — a 16-layer
# Qwen3-MoE target (32 experts, top-4) and an EAGLE-3 head — with the target in its **memory-bound
# twin** form: every expert widened from 64 to 1,024 intermediate units without changing its function
# (`speclimits models twin`), so that, as on the paper's GPU, streaming the routed experts is about half
# of a verification pass. The twin's greedy outputs, routing and acceptance are those of the trained
# pair (identical tokens in all 484 generations the two traces share). The sweep covers $K = 0..10$ at
# batch size 1 on 56 prompts, twelve of them about 1,400 tokens long (see the trace's `README.md`). The
# trained pair's own trace, `data/traces/measured-eagle3`, is the *cache-resident* contrast: its values
# stand beside ours in every key-results box, and {ref}`sec-regimes` measures, by a designed experiment
# with planted routing, what one more unique expert costs in each. The paper-scale simulated trace is one
# parameter away (`--trace`, or `speclimits simulate --preset paper`).
#
# ## Measured on a CPU with a small model: what carries over
#
# The paper measured a 30B MoE on an A100. Read each section's tables (ours beside the paper's) with
# these differences in mind:
#
# - **The expert cost is real here only in the twin.** On the trained target a pass costs mostly
#   per-layer framework work and the expert term is about a tenth of it; the twin was widened until the
#   designed experiment put it near one half at $m \ge 5$ ({ref}`sec-regimes`). Conclusions that depend
#   on the cost's shape (H1–H3, the Oracle's gain, the $\alpha = 0$ ablation) are therefore shown for
#   both targets.
# - **The machine is a 2-core CPU running one thread**: the engine runs eagerly, so there are no
#   CUDA-graph buckets and no reason to expect the paper's $m = 4/5$ boundary (the boundary search of
#   {ref}`sec-final-model` says whether the data show one).
# - **Contexts reach about 1,530 tokens** only in the twin's trace (its long-context prompts); the
#   trained pair's trace ends within a few hundred, where the context slope $c$ is barely identified.
# - **The draft's probabilities are not calibrated**: the small EAGLE-3 head is right far more
#   often than its probability of the reference token says, so the Oracle section measures the gap
#   and recalibrates the surrogate before solving.
#
# ## Rebuild this book on your own trace
#
# ```bash
# speclimits validate /path/to/trace        # checks the data contract, names file/column/rows
# speclimits book --trace /path/to/trace    # executes every section on it and builds the site
# ```
#
# A trace can come from the harness (`speclimits trace --target DIR --draft DIR --method eagle3
# --k 1-10 --prompts prompts.jsonl --out my-trace`) or from the simulator
# (`speclimits simulate --preset paper --out my-trace`).
#
# ## Sections
#
# 1. {ref}`sec-tracing`: what a round is, what the trace records, and a summary of the loaded trace.
# 2. {ref}`sec-factors`: which of six candidate factors predicts the target time (Table A2, H1, H3).
# 3. {ref}`sec-final-model`: the categorical cost model $T_T = \beta_0(m) + \alpha(m)\,\bar U_r + c\,L$, its regime boundary, and its rivals.
# 4. {ref}`sec-draft-model`: draft time as a line in $K$.
# 5. {ref}`sec-robustness`: bootstrap, Huber, trimming, halves, leave-one-category-out, residual diagnostics.
# 6. {ref}`sec-oracle`: the Bellman bound on adaptive $K$, Delta Space, the $\alpha = 0$ ablation, and online policies against the bound.
# 7. {ref}`sec-linguistic`: how the text context relates to the Oracle's $K$ and to routing.
# 8. {ref}`sec-online-control`: adaptive-$K$ policies run inside vLLM, measured against the Oracle's bound
#    and against every static $K$ (beyond the paper).
# 9. {ref}`sec-beyond-batch`: the step cost and the bound when $b$ requests share a verification pass:
#    measured per batch size and $K$, at paper scale on the simulator, and a bound no policy can beat (beyond the paper).
#
# The {ref}`sec-methods` page defines the cost model, the Oracle, the conventions every section shares
# and the trace format.

# %% tags=["remove-input"]
bs.version_report(tr)
