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
# round; prefill rounds stay in it, marking where a generation starts, but no fit uses them.
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

# %%
import speclimits.book_support as bs
from speclimits import describe, figures
from speclimits.trace import decode_rounds

bs.setup()

# %% tags=["parameters", "remove-cell"]
trace = None
smoke = False
seed = 0

# %%
tr = bs.load(trace)
print(tr.source_label)
rounds = tr.rounds
_, report = decode_rounds(rounds, timing="target")
print(report)

# %% [markdown]
# The filter above is the one every fit in this book uses: prefill rounds and rounds with a zero
# timing are excluded, counted, and reported (the paper saw 0.3% of records with a zero timing).
#
# ## Rounds and generations per $K$

# %%
summary = describe.per_k_summary(rounds)
summary.round(3)

# %%
figures.rounds_per_k(summary)

# %% [markdown]
# Larger $K$ emits more tokens per round, so the same prompts need fewer rounds.
#
# ## Target time, draft time, unique experts and context
#
# Boxes span the 25th–75th percentile, whiskers the 5th–95th, the tick is the median.

# %%
dec, _ = decode_rounds(rounds, timing="both")
figures.quantile_boxes(dec, "t_target_ms", by="K", title="target time T_T (ms)")

# %%
figures.quantile_boxes(dec[dec["K"] > 0], "t_draft_ms", by="K", title="draft time T_D (ms)")

# %%
figures.quantile_boxes(dec, "u_bar", by="m", title="unique experts per layer Ū")

# %%
figures.histogram_chart(dec["context_len"], title="context length L (tokens)")

# %% [markdown]
# $\bar U_r$ grows with $m$ but far slower than $m \cdot$top-$k$: neighbouring positions share
# experts. If routing were independent across positions, $m$ tokens with top-$k$ of $E$ experts
# would touch $E\,(1 - (1 - k/E)^m)$ experts per layer.
#
# ## Acceptance and emitted tokens

# %%
figures.acceptance_positions(rounds)

# %%
figures.emitted_per_k(summary)

# %%
print(f"Acceptance rate (accepted / drafted) by K: "
      + ", ".join(f"K={k}: {v:.3f}" for k, v in summary["acceptance"].dropna().items()))

# %% [markdown]
# ## Versions

# %%
bs.version_report(tr)
