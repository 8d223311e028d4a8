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
# (sec-tracing)=
# # Tracing: one row per speculative round
#
# In one **speculative round** at batch size 1 the draft proposes $K$ tokens (draft time
# $T_D$), the MoE target verifies $m = K + 1$ positions in one forward pass (target time $T_T$),
# rejection sampling keeps $a$ of the drafts, and the round emits $a + 1$ tokens (the bonus token
# from the target; the last round of a generation can emit fewer). The trace keeps one row per
# round ({numref}`tbl-tracing-columns`; the full schema is in {ref}`sec-methods`); prefill rounds
# stay in it, marking where a generation starts, but no fit uses them.

# %% tags=["remove-cell"]
import speclimits.book_support as bs
from speclimits import describe, figures
from speclimits.book.views import trace as views
from speclimits.trace import decode_rounds

# %% tags=["parameters", "remove-cell"]
trace = None
smoke = False
seed = 0
n_boot = 999
results = None

# %% tags=["remove-input"]
page = bs.setup(results)
key = page.key_results("sec-tracing", "tracing")

# %% [markdown]
# :::{table} The columns of the rounds table that the analyses read.
# :name: tbl-tracing-columns
# :align: center
#
# | column | meaning |
# |---|---|
# | `generation_id`, `prompt_id`, `category` | one generation (a prompt at one $K$); clusters for standard errors and cross-validation |
# | `K`, `m` | draft budget and rows verified, $m = K + 1$ ($K = 0$: plain decoding) |
# | `round`, `phase` | index within the generation; `prefill` or `decode` |
# | `t_target_ms`, `t_draft_ms` | $T_T$ (target forward) and $T_D$ (all $K$ draft steps), ms |
# | `u_bar`, `e_max` | unique experts touched by the pass, averaged over MoE layers ($\bar U_r$), and the largest per-layer count ($E_{\max}$) |
# | `context_len`, `kv_usage` | tokens already in the KV cache ($L$) and KV-cache occupancy |
# | `graph_bucket` | padded token count of the pass (the CUDA-graph bucket on a GPU) |
# | `n_draft`, `n_accepted`, `n_emitted` | drafted, accepted and emitted tokens |
# :::

# %% tags=["hide-input"]
tr = page.load(trace)
print(tr.source_label)
rounds = tr.rounds
_, report = decode_rounds(rounds, timing="target")
print(report)

# %% [markdown]
# The filter above is the one every fit in this book uses: prefill rounds and rounds with a zero
# timing are excluded, counted, and reported (the paper saw 0.3% of records with a zero timing;
# {ref}`sec-draft-model` compares the draft fit with and without them).
#
# ## Rounds and generations per $K$
#
# {numref}`tbl-tracing-per-k` counts the decode rounds and generations of every budget and the
# tokens a round yields. Intervals are 95% cluster-bootstrap percentile intervals: the
# generations of each $K$ are resampled with replacement (999 times, fewer in a smoke build).
# Tokens/s divides the emitted tokens by the summed target and draft time, a throughput proxy
# that ignores every other overhead.

# %% tags=["hide-input"]
summary = describe.per_k_summary(rounds)
rates = describe.per_k_rates(rounds, n_boot=bs.smoke_sizes(smoke, n_boot=n_boot), seed=seed)
page.table(views.per_k_table(summary, rates), "tbl-tracing-per-k",
           "Decode rounds, generations and tokens per round by draft budget $K$, with 95% cluster-bootstrap "
           "intervals (generations resampled within each $K$).",
           decimals={"Tokens/s (T+D)": 0}, full=summary.reset_index().merge(rates, on="K", suffixes=("", "_boot")))

# %% tags=["hide-input"]
page.figure(figures.rounds_per_k(summary), "fig-tracing-rounds",
            "Decode rounds per draft budget $K$. The same prompts run at every $K$, so the drop with $K$ is "
            "the rounds saved by emitting more tokens per round.")

# %% [markdown]
# Larger $K$ emits more tokens per round, so the same prompts need fewer rounds
# ({numref}`fig-tracing-rounds`).
#
# ## Target time, draft time, unique experts and context
#
# {numref}`tbl-tracing-means` gives the means; in the figures below boxes span the 25th–75th
# percentile, whiskers the 5th–95th, the tick is the median.

# %% tags=["hide-input"]
page.table(views.timing_table(summary), "tbl-tracing-means",
           "Mean target time $T_T$, draft time $T_D$ (all $K$ draft steps of a round), unique experts per "
           "layer $\\bar U_r$ and context length $L$ over the decode rounds of each $K$.",
           decimals={"$T_T$ (ms)": 2, "$T_D$ (ms)": 2, "$\\bar U_r$ (experts/layer)": 2, "$L$ (tokens)": 0})

# %% tags=["hide-input"]
dec, _ = decode_rounds(rounds, timing="both")
page.figure(figures.quantile_boxes(dec, "t_target_ms", by="K", title="target time T_T (ms)"), "fig-tracing-target-time",
            "Target time $T_T$ per verification pass by $K$. Look at how slowly the median rises with $m = K + 1$: "
            "{ref}`sec-factors` asks which quantity explains it.")

# %% tags=["hide-input"]
page.figure(figures.quantile_boxes(dec[dec["K"] > 0], "t_draft_ms", by="K", title="draft time T_D (ms)"),
            "fig-tracing-draft-time",
            "Draft time $T_D$ of a round's $K$ draft steps by $K$. A straight rise in $K$ is what the line of "
            "{ref}`sec-draft-model` assumes.")

# %% tags=["hide-input"]
page.figure(figures.quantile_boxes(dec, "u_bar", by="m", title="unique experts per layer Ū"), "fig-tracing-experts",
            "Unique experts per MoE layer $\\bar U_r$ touched by one pass, by rows verified $m$. It grows far "
            "slower than $m$ times top-$k$.")

# %% tags=["hide-input"]
page.figure(figures.histogram_chart(dec["context_len"], title="context length L (tokens)"), "fig-tracing-context",
            "Distribution of the context length $L$ (tokens already in the KV cache) over decode rounds.")

# %% [markdown]
# $\bar U_r$ grows with $m$ but far slower than $m \cdot$top-$k$ ({numref}`fig-tracing-experts`):
# neighbouring positions share experts. If routing were independent across positions, $m$ tokens
# with top-$k$ of $E$ experts would touch $E\,(1 - (1 - k/E)^m)$ experts per layer.
#
# ## Acceptance and emitted tokens
#
# The acceptance rate (accepted over drafted tokens, {numref}`tbl-tracing-per-k`) falls with $K$:
# a later draft position is accepted only if every earlier one was
# ({numref}`fig-tracing-acceptance`), so the tokens a round emits saturate
# ({numref}`fig-tracing-emitted`). Whether the extra verification cost of a longer draft pays
# for these tokens is the question of {ref}`sec-oracle`.

# %% tags=["hide-input"]
page.figure(figures.acceptance_positions(rounds), "fig-tracing-acceptance",
            "Share of rounds whose draft position $i$ was accepted, for each $K$. Look at how fast it decays "
            "along the draft.")

# %% tags=["hide-input"]
page.figure(figures.emitted_per_k(summary), "fig-tracing-emitted",
            "Mean tokens emitted per round by $K$ (accepted drafts plus the target's bonus token). "
            "Look for where the curve flattens.")

# %% tags=["remove-input"]
key.fill(views.key_results(rounds, summary, rates))

# %% [markdown]
# ## Versions

# %% tags=["remove-input"]
bs.version_report(tr)
