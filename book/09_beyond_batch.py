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
# (sec-beyond-batch)=
# # Beyond batch 1: a shared verification pass
#
# Everything so far ran one request at a time, as the paper does. A server verifies many requests in
# one pass, and on a Mixture-of-Experts target they share the experts that pass loads: the unique
# experts of a step grow with the *union* of the batch's routed tokens and saturate at the expert
# count $E$, so the price of one more draft token depends on everyone else in the batch. Reported
# elsewhere (not measured here): vLLM's adaptive verification (vLLM PR #47808 and its blog post of
# 2026-08-14) gains 5–10% over the best fixed $K$ up to concurrency 64 and every fixed $K$ falls below no
# speculation at 256 on DeepSeek-V4-Pro; SGLang's best step count falls from 4 at batch 1 to 2 at batch 64
# on Qwen3-235B-A22B (SGLang issue #22246); vLLM's `num_speculative_tokens_per_batch_size` (vLLM PR #32374)
# takes a hand-made batch-size→$K$ table.
# Nobody reports a measured expert-aware cost model at batch $b > 1$ or a bound there.
#
# This section measures it on the pair of the page's trace (a batch sweep traced in vLLM: $b \in \{1, 2, 4, 8,
# 16\}$ × $K \in \{0..6\}$, closed batches of $b$ prompts submitted together; the trained pair's
# `measured-batch` or its memory-bound twin's `twin-batch`, {ref}`sec-regimes`), fits the step cost
#
# $$T_T(n, m, \bar U, L) = \beta_0(m) + \gamma(m)\,(n-1) + \alpha(m)\,\bar U_{\text{step}} + c\,L_{\text{total}},
# \qquad T_D(n, k) = a k + b + (n-1)(a_{\text{req}} k + b_{\text{req}}),$$
#
# ($n$ requests of $m = k+1$ rows each, $\bar U_{\text{step}}$ the unique experts per layer over the whole
# step, $L_{\text{total}}$ the summed context; at $n = 1$ it is the batch-1 model of {ref}`sec-final-model`),
# validates it per $(b, K)$, repeats the analysis at paper scale on the simulator (**simulated**,
# 48 layers × 128 experts, top-8), and bounds what any choice of $k$ could gain at batch $b$: an exact
# Oracle over the joint state of two requests at $b = 2$, and for larger $b$ a relaxation that no policy
# can beat (argued on the {ref}`sec-methods` page, "The bound at batch > 1").

# %% tags=["remove-cell"]
from pathlib import Path

from IPython.display import Markdown, display

import speclimits.book_support as bs
from speclimits.book.views import batch as view
from speclimits.costmodel import BatchCostModel
from speclimits.figures import batch as batch_figures

# %% tags=["parameters", "remove-cell"]
trace = None
batch_trace = None
smoke = False
seed = 0
k_max = 6
batch_sizes = "1,2,4,8,16"
n_samples = None  # Monte Carlo runs per group at b > 2; None: the CLI's default
results = None

# %% tags=["remove-input"]
page = bs.setup(results)
key = page.key_results("sec-beyond-batch", "beyond batch 1")

# %% tags=["hide-input"]
tr = page.load(trace)
sizes = [int(b) for b in str(batch_sizes).split(",")]
measured = view.measured_batch_trace(tr, batch_trace)
print(tr.source_label)
print(view.describe_batch_trace(measured))

# %% [markdown]
# ## Measured: time per token by batch size and $K$
#
# The batch trace runs closed batches: $b$ prompts submitted together, each generating the same number
# of tokens (`--ignore-eos`), so the batch shrinks only when requests reach their end together and a step
# holds $b$ requests nearly throughout. Time per token is the sum of target and drafter time over all steps
# of a $(b, K)$ (prefill included) over the tokens the requests emitted. The cost model is fitted on the
# *uniform decode steps* (every request decoding with the same $m$), one OLS with $\beta_0, \gamma, \alpha$
# per $m$ and a shared $c$, 95% intervals from a leave-one-batch-out jackknife; its prediction of each
# $(b, K)$ is **cross-fitted** (batches alternate between two folds; each fold is priced by the model
# fitted on the other), and the steps it does not price (prefill, mixed) count as measured on both sides.

# %% tags=["hide-input"]
from speclimits.stats.batch import (coefficient_table, fit_batch_cost_model, speedup_frontier, step_union_table,
                                    validate_by_batch_k, worst_error)

val = worst = front = union = None
if measured is not None:
    page.use(measured)  # the measured tables below are the batch trace's
    bmodel = fit_batch_cost_model(measured)
    val = validate_by_batch_k(measured, bmodel)
    worst = worst_error(val)
    front = speedup_frontier(val)
    union = step_union_table(measured)
    page.table(view.time_grid(val), "tbl-batch-grid",
               "Measured time per token (ms, target + drafter over all steps, per emitted token) by batch size b and "
               "K.", decimals=3)
else:
    page.cannot_show("the measured tables of this section",
                     "no measured batch trace belongs to this trace's model pair (trace one with `speclimits trace "
                     "--batch 1,2,4,8,16`, see scripts/make_batch_trace.sh); the simulated part and the bound below "
                     "still apply")

# %% tags=["hide-input"]
if val is not None:
    page.figure(batch_figures.batch_time_per_token(view.time_frame(val)), "fig-batch-time",
                "Measured ms per token against batch size per K (solid) and the batch cost model's cross-fitted "
                "prediction (dashed). Where a coloured line crosses above the black one, K stops paying.")

# %% tags=["hide-input"]
if val is not None:
    page.table(view.validation(val), "tbl-batch-validation",
               f"The batch cost model against the measurement per (b, K): cross-fitted by batch (and in-sample). "
               f"{worst['text']}.", decimals=3)
    page.table(view.frontier(front), "tbl-batch-frontier",
               "Where speculation stops paying, measured: the first batch size at which K is no faster than plain "
               "decoding, and each K's speedup over plain decoding at the same b.", decimals=3)
    page.table(view.coefficients(coefficient_table(bmodel)), "tbl-batch-coefficients",
               "The batch cost model fitted on the measured uniform decode steps (95% jackknife intervals over "
               "batches).")

# %% [markdown]
# **Run to run.** A second pass of the same sweep on the same machine, right after this one (summarised
# in the batch trace's `repeat-pass.json`), says how much of a cell's time is the machine rather than
# $(b, K)$: the cells run one after another, one engine per $K$, so a drift of the machine between them
# shifts whole cells. The model is fitted and cross-fitted within a pass; the comparison below is the
# yardstick for its errors and for the "stops paying" verdicts.

# %% tags=["hide-input"]
repeat = view.read_repeat(measured)
rep = None
if val is not None and repeat is not None:
    rep = view.repeat_table(val, repeat)
    page.table(rep, "tbl-batch-repeat",
               f"Time per token of every (b, K) in this trace and in a second pass of the same sweep "
               f"({repeat['what']}); the model's cross-fitted error in each pass. Over the grid, "
               f"{view.repeat_phrase(rep)}.", decimals=3)
elif val is not None:
    print("no repeat pass recorded beside this batch trace")
if val is not None:
    display(Markdown(view.measured_verdict(val, worst, front, rep)))

# %% [markdown]
# ## Unique experts of a step against the saturation curve
#
# The experts a step touches are the union over its requests. If the requests routed independently, the
# step's $\bar U$ would be $E\,(1 - \prod_i (1 - u_i/E))$ from each request's own $u_i$; if every token
# routed uniformly, $E\,(1 - (1 - k/E)^n)$ for $n$ tokens of top-$k$. The first is what the Oracle
# below assumes; the second the analytic curve quoted by others (knee near $E/k$ tokens).

# %% tags=["hide-input"]
if union is not None:
    E, top_k = union.n_experts, union.top_k
    page.figure(batch_figures.batch_step_union(view.union_points(union), E, top_k, seed=seed), "fig-batch-union",
                f"Measured unique experts per layer of each uniform decode step against the tokens it verifies "
                f"(E = {E}, top-{top_k}), with the uniform saturation curve (black) and E (dashed).")

# %% tags=["hide-input"]
if union is not None:
    shown_union, full_union = view.union_summary(union)
    page.table(shown_union, "tbl-batch-union",
               "Mean Ū of a step per (b, K): measured, the independent-routing union of its requests' own Ū, and "
               "the uniform saturation curve; ratios (measured over each; 95% interval over batches for the first). "
               "Shown: b > 1 at K = 0, 2, 4, 6 (every cell in the download; at b = 1 the union is the request itself). "
               "Below 1: the requests of a step share experts more than independent routing would.",
               decimals=3, full=full_union)
    display(Markdown(view.union_phrase(union)))

# %% [markdown]
# ## At paper scale (SIMULATED)
#
# The bundled pair has 32 experts top-4 and runs on a CPU. The simulator's batch mode draws a **SIMULATED**
# batch sweep at the paper's scale (48 layers × 128 experts, top-8): requests route independently, a step's
# $\bar U$ is the counted union of their sampled expert ids, step times come from a planted batch cost
# model whose batch-1 part is the paper's appendix and whose per-request terms $\gamma, a_{\text{req}},
# b_{\text{req}}$ are simulator choices (not the paper's). The same fit must recover the planted truth.

# %% tags=["hide-input"]
import tempfile

from speclimits.simulate import BatchSim, simulate_batch
from speclimits.simulate import preset

sim_cfg = preset("paper", n_prompts=16 if smoke else 48, response_median=120 if smoke else 200,
                 response_max=240 if smoke else 400, k_values=tuple(range(0, k_max + 1)))
sim_dir = Path(tempfile.mkdtemp(prefix="speclimits-")) / "sim-batch-paper-scale"
simulate_batch(sim_cfg, BatchSim(batch_sizes=tuple(sizes)), seed=seed, out=sim_dir, progress=False)
sim = page.load(sim_dir)
sim_truth = BatchCostModel.from_dict(sim.meta["truth"], origin="planted truth")
sim_model = fit_batch_cost_model(sim)
sim_val = validate_by_batch_k(sim, sim_model)
sim_worst = worst_error(sim_val)
sim_front = speedup_frontier(sim_val)
sim_coef = coefficient_table(sim_model)
sim_cov = view.coverage(sim_coef, sim_truth)
print(sim.source_label)

# %% tags=["hide-input"]
page.table(view.coefficients(sim_coef, truth=sim_truth), "tbl-batch-sim-coef",
           f"SIMULATED: the batch cost model fitted on the simulator's batch sweep against the planted truth "
           f"({sim_cov[0]} of {sim_cov[1]} planted values inside the 95% intervals). {sim_worst['text']}.")

# %% tags=["hide-input"]
page.figure(batch_figures.batch_time_per_token(view.time_frame(sim_val)), "fig-batch-sim-time",
            "SIMULATED (paper scale, planted per-request terms): ms per token against batch size per K, with the "
            "fitted model's cross-fitted prediction (dashed).")

# %% tags=["hide-input"]
page.table(view.frontier(sim_front), "tbl-batch-sim-frontier",
           "SIMULATED: each K's speedup over plain decoding at the same b, and the b at which it stops paying.",
           decimals=3)

# %% [markdown]
# ## The bound at batch $b$
#
# The Oracle's reference sequences (the **greedy** references, as the headline of {ref}`sec-oracle`) are
# grouped into closed batches of $b$ in the order the batch trace ran them; every request of a round drafts
# the same $k$ (as vLLM does) and the round costs the batch step above, with the step's $\bar U$ the
# independent union of the requests' counterfactual windows. Beside the bound: every static $K$, the best
# static $K$ per $b$, and the best **batch-size→$K$ table** in hindsight ($K$ as a function of the number of
# requests still active: what vLLM's `num_speculative_tokens_per_batch_size` would hold if it were chosen
# knowing the outcome; a coordinate-wise optimum). At $b = 2$ the exact Oracle over the joint state of the
# two requests is solved too, which measures how loose the relaxation is.

# %% tags=["hide-input"]
from speclimits.oracle.batch import batch_bounds
from speclimits.oracle.batch_problem import headline_references, trace_order
from speclimits.oracle.batch_tables import DEFAULT_SAMPLES
from speclimits.oracle.prepare import oracle_data_missing, prepare_oracle
from speclimits.vocabulary import HEADLINE_KIND

page.use(tr)  # the bound runs on this page's trace's references
frame = world = None
oracle_ok = page.shows("the bound at batch b (it solves on this trace's Oracle data)", oracle_data_missing(tr))
if oracle_ok:
    bound_model = bmodel if measured is not None else sim_model
    setup = prepare_oracle(tr, bound_model.base)
    refs, order = headline_references(setup, measured)
    if refs.inputs.k_list < k_max:  # the Oracle data holds drafts of up to k_list tokens
        print(f"K_max is {refs.inputs.k_list} here, not {k_max}: this trace's Oracle data holds drafts of up to "
              f"{refs.inputs.k_list} tokens (speclimits trace --oracle-k-max sets it)")
        k_max = refs.inputs.k_list
    bb = batch_bounds(refs.inputs, bound_model, sizes, k_max=k_max, n_samples=8 if smoke else (n_samples or DEFAULT_SAMPLES), seed=seed,
                      order=order)
    frame = bb.frame()
    src = "the batch cost model fitted on the measured batch trace" if measured is not None else \
        "the batch cost model fitted on the SIMULATED batch sweep"
    shown, full = view.bounds(frame)
    page.table(shown, "tbl-batch-bounds",
               f"The bound at batch b on {refs.inputs.n_sequences} {HEADLINE_KIND} references of {bs.data_label_for(tr)} "
               f"({refs.surrogate_label}), priced by {src}: plain decoding, the best static K, the best batch→K table, "
               "the exact Oracle (b ≤ 2), the relaxation bound (no policy is faster), and its gains. Static K and tables "
               f"at b > 2 are Monte Carlo estimates ({bb.n_samples} samples). Columns: ms per token of plain decoding, the "
               "best static K, the best table, the exact Oracle and the bound; the bound's gain over the best static K "
               "and over the table; the relaxation's slack against the exact Oracle. The tables themselves (K for n = "
               "1..b active requests) are in the download.", decimals=3, full=full)

# %% tags=["hide-input"]
if oracle_ok:
    display(Markdown(view.bound_verdict(frame)))

# %% tags=["hide-input"]
if oracle_ok:
    page.figure(batch_figures.batch_bounds(view.bounds_long(frame)), "fig-batch-bounds",
                "Speedup over plain decoding at the same batch size: the relaxation bound, the exact Oracle (b = 2), the "
                "best batch→K table and the best static K.")

# %% [markdown]
# **Checking the world.** The bound is only as good as its world: priced by the batch cost model, every
# static $K$ at every $b$ on the references of the prompts the batch sweep ran, grouped as it grouped
# them, should reproduce what the sweep measured. (References the sweep did not run, such as long-context
# prompts, are left out of this check: they change the workload, not the world.)

# %% tags=["hide-input"]
if oracle_ok:
    world = None
    if measured is not None:
        ran = trace_order(measured)
        same = refs.for_sequences(ran) if ran is not None else refs
        if len(same.inputs.seq_ids) < len(refs.inputs.seq_ids):
            same_frame = batch_bounds(same.inputs, bound_model, sizes, k_max=k_max, seed=seed, tables=False,
                                      n_samples=8 if smoke else (n_samples or DEFAULT_SAMPLES),
                                      order=[s for s in ran if s in set(map(str, same.inputs.seq_ids))]).frame()
        else:
            same_frame = frame
        world = view.oracle_world(same_frame, val)
        page.table(world, "tbl-batch-world",
                   f"Static K at each b: the Oracle's world (batch cost model on the {len(same.inputs.seq_ids)} greedy "
                   f"references of the prompts the batch sweep ran, of {len(refs.inputs.seq_ids)}) against the measured "
                   "batch sweep on those prompts.", decimals=3)

# %% tags=["remove-input"]
key.fill(view.key_rows(val=val, worst=worst, front=front, rep=rep, frame=frame, world=world, sim_cov=sim_cov,
                       sim_worst=sim_worst, sim_front=sim_front, measured=measured is not None))

# %% [markdown]
# ## Versions

# %% tags=["remove-input"]
bs.version_report(tr)
