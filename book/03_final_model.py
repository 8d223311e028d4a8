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
# (sec-final-model)=
# # The final target-time model
#
# The paper's cost model for one verification pass (its Eq. 4) lets the budget enter
# categorically, with a free intercept and expert slope for every $m = K + 1$ and one shared
# context coefficient:
#
# $$T_T = \beta_0(m) + \alpha(m)\,\bar U_r + c\,L .$$
#
# $\alpha(m)$ is the predictive increment of one more unique expert (H2: roughly constant within
# a system regime), $c$ the increment of one context token, $\beta_0(m)$ the launch cost of the
# dense sublayers and the router. This section fits it per $K$ and jointly, asks whether and
# where the regime changes, and compares it with a pooled linear model and a ladder of simpler
# specifications. Standard errors are clustered by generation; out-of-sample metrics use
# `GroupKFold(5)` by generation. $K = 0$ rounds (plain decoding) are left out here, as in the
# paper's sweep; the cost model the Oracle reads adds $m = 1$ from them (last section below).

# %% tags=["remove-cell"]
from pathlib import Path

import speclimits.book_support as bs
from speclimits import figures, stats
from speclimits.book.views import expert_cost
from speclimits.book.views import final_model as view
from speclimits.costmodel import CostModel

# %% tags=["parameters", "remove-cell"]
trace = None
smoke = False
seed = 0
n_splits = 5
n_boot = 999
cost_model = None
results = None

# %% tags=["remove-input"]
page = bs.setup(results)
key = page.key_results("sec-final-model", "the final target-time model")

# %% tags=["hide-input"]
tr = page.load(trace)
print(tr.source_label)
res = stats.fit_final_model(tr.rounds, n_splits=n_splits, n_boot=bs.smoke_sizes(smoke, n_boot=n_boot), seed=seed)
print(res.report)
truth = CostModel.from_dict(tr.meta["truth"]) if tr.simulated and "truth" in tr.meta else None

# %% [markdown]
# **Uncertainty.** Coefficient intervals in the tables are 95% $t$-intervals from standard errors
# clustered by generation ($G - 1$ df). The headline cells also carry 95% cluster-bootstrap
# intervals: generations are resampled with replacement *within each K* (each $K$ was its own
# sweep over the same prompts), 999 times (fewer in a smoke build; printed below).
# Coefficient-type cells (α and β0 ranges, the α-level ratio, $R^2$) are refitted on every
# resample; error-type cells (CV MAPE, MAPE by
# $K$, leave-one-$K$-out) keep the out-of-fold predictions fixed and resample the held-out
# generations, so their interval covers which generations were scored, not the refits. The
# reported value is always the full-sample estimate.

# %% tags=["remove-input"]
print(f"bootstrap resamples: {res.n_boot}")

# %% [markdown]
# ## Per-$K$ fits
#
# OLS of $T_T$ on $\bar U_r$ and $L$ within each $K$ ({numref}`tbl-final-per-k`), with 95% intervals
# from generation-clustered standard errors ($t$ with $G-1$ df); the CV MAPE is the GroupKFold mean
# with a $t$ interval over folds. {numref}`fig-final-coefficients` plots the coefficients across
# $m$: the grey dashed line is the paper's split ($m \le 4 \mid m \ge 5$); a red one marks the split
# the rule below declares, if it declares one; on a simulated trace the red crosses are the planted
# truth.

# %% tags=["hide-input"]
if page.shows("the per-$K$ fits", res.why_missing("per_k")):
    page.table(view.per_k(res), "tbl-final-per-k",
               "Per-$K$ fits of $T_T = \\beta_0 + \\alpha\\,\\bar U_r + c\\,L$: estimates with 95% intervals "
               "(generation-clustered) and the held-out error.", full=res.per_k)
    if res.skipped_within("per_k", "per_k_cv"):
        page.cannot_show("every per-$K$ fit or its held-out error", res.skipped_within("per_k", "per_k_cv"))

# %% tags=["hide-input"]
if res.why_missing("per_k") is None:
    page.figure(figures.coefficients_by_m_chart(res, truth), "fig-final-coefficients",
            "Per-$K$ coefficients $\\alpha(m)$ and $\\beta_0(m)$ against $m = K + 1$ with 95% intervals "
                "(generation-clustered). Look for a jump between neighbouring $m$: that is what a regime boundary is; "
                "the paper's jump is at $m = 4 \\to 5$.")

# %% [markdown]
# ## Is there a regime boundary, and where?
#
# The paper chose the $m = 4/5$ split after inspecting the sweep, so its later cross-validation
# did not test the split. Here the data decide, by a rule fixed in advance. Each candidate is a
# model: "no split" (one regime: intercept, slope in $m$, $\alpha$ and $c$ shared by every $m$) or
# $m \le s \mid m > s$ (per regime its own intercept, slope in $m$ and $\alpha$; $c$ shared), scored
# by the held-out RMSE of each GroupKFold fold.
#
# **The rule.** A split is declared only if it beats "no split" by more than one standard error:
# with $s^*$ the candidate of smallest mean fold RMSE, the simpler model stands whenever
# $\overline{\mathrm{RMSE}}(\text{none}) \le \overline{\mathrm{RMSE}}(s^*) + \mathrm{SE}(s^*)$, the SE
# being the standard deviation of $s^*$'s fold RMSEs over $\sqrt{5}$ (the one-standard-error
# rule). **Stability.** The same rule is repeated inside each outer training set (nested CV) and
# the selected model scored on the held-out fold; a split is reported only if every outer fold
# selects the same one as the rule on all the data. Otherwise the section reports *no regime*,
# and the regime rows below use one regime for the rule's column. Whatever the rule says, every
# regime-dependent row is also reported at the paper's fixed split, so the comparison with the
# paper is like for like.

# %% tags=["hide-input"]
if page.shows("where the regime changes (the boundary rule, its nested CV and its curve)", res.why_missing("boundary")):
    print(res.boundary.summary().split("\n")[0])
    print(f"plain argmin of the curve: {res.boundary.argmin_split}; rule on all data: {res.boundary.rule_split}")

# %% tags=["hide-input"]
if res.boundary is not None:
    page.table(view.outer_folds(res), "tbl-final-outer-folds",
               "Stability of the boundary rule (nested CV): the split the one-standard-error rule selects inside "
               "each outer training set, the plain argmin, and the selected model's held-out error. A split is "
               "reported only if every fold agrees with the rule on all the data.", decimals=3)

# %% [markdown]
# {numref}`fig-final-boundary` shows the curve the rule reads.

# %% tags=["hide-input"]
if res.boundary is not None:
    page.figure(figures.boundary_chart(res), "fig-final-boundary",
                "Mean held-out RMSE of each candidate split (last $m$ of the small regime) with ±1 SE over the "
                "GroupKFold folds; the grey band is \"no split\" ±1 SE, the red point the reported choice. A split "
                "is declared only where its point sits below the band.")

# %% [markdown]
# ## Regime-dependent rows: the rule's split and the paper's
#
# In {numref}`tbl-final-regimes` the split column says which split a row uses. Ranges are the
# min–max over the per-$K$ fits in a regime; the interval is the 95% bootstrap interval of the
# range's minimum and of its maximum. The α-level ratio is the mean $\alpha(m)$ over the large
# regime's $m$ over the mean over the small regime's (paper: about 3.2).

# %% tags=["hide-input"]
if page.shows("the regime-dependent rows", res.why_missing("regimes")):
    page.table(view.regimes(res), "tbl-final-regimes",
               "Regime-dependent quantities at the rule's split and at the paper's fixed split "
               "$m \\le 4 \\mid m \\ge 5$, beside the paper's values.")

# %% [markdown]
# ## The joint categorical model
#
# One regression over all $K$: free $\beta_0(m)$ and $\alpha(m)$, one shared $c$
# ({numref}`tbl-final-joint`).

# %% tags=["hide-input"]
page.table(view.joint_by_m(res), "tbl-final-joint",
           f"The joint categorical model (the paper's Eq. 4): $\\beta_0(m)$ and $\\alpha(m)$ with 95% intervals "
           f"(generation-clustered); the shared context coefficient is $c$ = {view.joint_c_cell(res)} ms per 1000 tokens.")

# %% [markdown]
# ## Pooled linear model and the comparison
#
# The paper also fitted $T_T = \beta_0 + \alpha \bar U_r + c L + \gamma K$ on all rounds. In the
# paper $\gamma$ is negative: a conditional coefficient produced by mixing the two regimes, not
# the price of a position. Where the trace has no regime, $\gamma$ simply absorbs whatever
# trend in $m$ the intercepts have.

# %% tags=["hide-input"]
if page.shows("the pooled linear model", res.why_missing("pooled")):
    page.table(view.pooled(res), "tbl-final-pooled",
               "The pooled linear model $T_T = \\beta_0 + \\alpha\\,\\bar U_r + c\\,L + \\gamma K$ on all rounds: "
               "estimates with 95% intervals (generation-clustered).", decimals={"SE": 5})

# %% [markdown]
# {numref}`tbl-final-comparison` sets the three models side by side, and
# {numref}`tbl-final-standardized` gives the pooled model's standardized coefficients.

# %% tags=["hide-input"]
if page.shows("the comparison of the three models", res.why_missing("comparison")):
    page.table(view.comparison(res), "tbl-final-comparison",
               "Three target-time models in sample ($R^2$) and on held-out generations (GroupKFold; $t$ intervals "
               "over folds), beside the paper's.", decimals=3, full=view.comparison_full(res))

# %% tags=["hide-input"]
if res.pooled_std is not None:  # missing with the pooled model, said above
    page.table(view.standardized(res), "tbl-final-standardized",
               "Standardized coefficients of the pooled model (coefficient × SD of the factor / SD of $T_T$), "
               "beside the paper's.", decimals=2)

# %% [markdown]
# **Cluster sensitivity.** The same questions recur at every $K$, so rounds of one prompt at
# different $K$ are not independent (the appendix says as much). The headline standard errors,
# clustered by generation (as reported) and by prompt, side by side; `ratio` is prompt over
# generation. A ratio far from 1 means the reported SE depends on a choice the data cannot make
# for us; it can go either way (within a prompt, the pooled model's misfit at different $K$ can
# cancel).

# %% tags=["hide-input"]
cs = res.cluster_se
page.table(view.cluster_se(res), "tbl-final-cluster-se",
           f"Standard errors of the headline coefficients clustered by generation (as reported) and by prompt "
           f"({cs['n_generations'].iloc[0]} generations, {cs['n_prompts'].iloc[0]} prompts); the ratio is prompt over "
           f"generation, {cs['ratio'].min():.2f}–{cs['ratio'].max():.2f} here.",
           decimals={"Coefficient": 4, "SE by generation": 4, "SE by prompt": 4, "Ratio": 2})

# %% [markdown]
# ## MAPE by $K$, leave-one-$K$-out, interpolation
#
# In the paper the pooled line is dominated by the larger mass of large-regime rounds, so its
# error concentrates in the small regime; without a regime there is no such concentration to
# expect. Leave-one-$K$-out fits the pooled form without a $K$ and predicts it
# ({numref}`tbl-final-mape-by-k`, {numref}`fig-final-mape-by-k`).

# %% tags=["hide-input"]
if page.shows("the MAPE by $K$", res.why_missing("mape_by_k")):
    page.table(view.mape_by_k(res), "tbl-final-mape-by-k",
               "Held-out MAPE by $K$ of the pooled and the categorical model, and of the pooled form fitted "
               "without that $K$ (leave-one-$K$-out); 95% bootstrap intervals over held-out generations.",
               full=view.mape_by_k_full(res))
    page.shows("leave-one-$K$-out", res.why_missing("loko"))

# %% tags=["hide-input"]
if res.mape_by_k is not None:
    page.figure(figures.mape_by_k_chart(res), "fig-final-mape-by-k",
                "Held-out MAPE by $K$ of the pooled and the categorical model, with the paper's pooled values. "
                "In the paper the pooled error concentrates at small $K$ (the small regime).")

# %% [markdown]
# **Other smooth parameterizations** of $m$ (the appendix: 6.5–7.4%, exploratory): $\beta_0(m)$
# and $\alpha(m)$ both linear, quadratic or logarithmic in $m$, or piecewise linear with a kink
# after the paper's $m = 4$ (fixed in advance, not tuned inside the folds), each with one shared
# $c$, scored by leave-one-$K$-out MAPE (mean over $K$, with its bootstrap interval, and the
# worst $K$; {numref}`tbl-final-smooth`).

# %% tags=["hide-input"]
if page.shows("the smooth forms in $m$", res.why_missing("smooth")):
    page.table(view.smooth(res), "tbl-final-smooth",
               "Smooth forms in $m$ scored by leave-one-$K$-out MAPE (mean over $K$ with its 95% bootstrap "
               "interval, and the worst $K$). The paper: 6.5–7.4%.", decimals={"MAPE at worst K (%)": 2})
    if res.skipped_within("smooth"):
        page.cannot_show("every smooth form", res.skipped_within("smooth"))

# %% [markdown]
# Interpolation predicts each $K$ from the mean of its neighbours' per-$K$ coefficients: within a
# regime, or across the boundary; "transfer" uses the adjacent $K$ on the other side. The labels
# depend on the split, so the table is given at the rule's split ({numref}`tbl-final-interpolation`)
# and at the paper's ({numref}`tbl-final-interpolation-paper`).

# %% tags=["hide-input"]
if page.shows("interpolation at the rule's split", res.why_missing("interpolation")):
    page.table(view.interpolation(res.interpolation), "tbl-final-interpolation",
               "Predicting each $K$ from its neighbours' per-$K$ coefficients, labelled at the rule's split "
               "(paper: 0.26–0.65% within a regime, 8.8–15.5% across).", decimals={"MAPE (%)": 2})

# %% tags=["hide-input"]
if page.shows("interpolation at the paper's split", res.why_missing("interpolation_paper")):
    page.table(view.interpolation(res.interpolation_paper), "tbl-final-interpolation-paper",
               "The same interpolation labelled at the paper's split $m \\le 4 \\mid m \\ge 5$.",
               decimals={"MAPE (%)": 2})

# %% [markdown]
# ## Specification ladder
#
# Nested specifications, each scored by GroupKFold MAPE and in-sample $R^2$, with 95% bootstrap
# intervals ({numref}`tbl-final-ladder`, {numref}`fig-final-ladder`). The paper: $\bar U_r$ alone
# 5.6% / 0.788; $+L$ 4.4% / 0.856; linear $m$, $m\!\cdot\!L$, $m\!\cdot\!\bar U_r$ and $E_{\max}$ no
# better than 4.3%; categorical 0.37% / 0.999.

# %% tags=["hide-input"]
if page.shows("the specification ladder", res.why_missing("ladder")):
    page.table(view.ladder(res), "tbl-final-ladder",
               "The specification ladder: in-sample $R^2$ and GroupKFold MAPE of nested models, with 95% "
               "bootstrap intervals, beside the paper's.", full=view.ladder_full(res))
    if res.skipped_within("ladder"):
        page.cannot_show("every rung of the ladder", res.skipped_within("ladder"))

# %% tags=["hide-input"]
if res.ladder is not None:
    page.figure(figures.ladder_chart(res), "fig-final-ladder",
                "Held-out MAPE of each specification on the ladder with its 95% interval, and the paper's value. "
                "Look at where the error stops falling: that is as much structure as the data support.")

# %% [markdown]
# ## The numbers beside the paper's
#
# {numref}`tbl-final-headline` collects the section's numbers. The split column names the split of a
# regime-dependent row; the interval is 95% (cluster bootstrap unless the cell says otherwise).

# %% tags=["hide-input"]
page.table(view.headline(res), "tbl-final-headline",
           "The final model's numbers beside the paper's (Sec. 4 and Appendix B).")

# %% [markdown]
# ## The cost model the Oracle reads
#
# `speclimits fit TRACE --out cost_model.json` writes this fit, and the book build writes it into
# the site as `_static/cost_model.json`: the Oracle and linguistic sections read that file
# instead of fitting again. It is the joint categorical target
# model on every decode round including $K = 0$ and the draft line. At $m = 1$ every pass
# touches exactly `top_k` experts per layer, so $\alpha(1)$ is not identified; the convention
# $\alpha(1) := \alpha(2)$, $\beta_0(1) := \text{intercept}(1) - \alpha(1)\cdot\text{top\_k}$
# is applied and recorded in the JSON.

# %% tags=["hide-input"]
cost = stats.fit_trace_cost_model(tr)
print("\n".join(cost.extra["fit"]["notes"]))
if cost_model:
    cost.write(cost_model)
    print(f"written for the Oracle sections ({{ref}}`sec-oracle`, {{ref}}`sec-linguistic`): {Path(cost_model).name}")

# %% tags=["hide-input"]
page.table(view.cost_model_by_m(cost), "tbl-final-cost-model",
           f"The cost model the Oracle reads ({{ref}}`sec-oracle`): per $m$ the intercept and expert slope of "
           f"the target pass and the draft time of $K = m - 1$ tokens; the shared context coefficient is "
           f"$c$ = {cost.c * 1e3:.3f} ms per 1000 tokens.", decimals={"β₀(m) (ms)": 3, "α(m) (ms/expert)": 4,
                                                                   "Draft time (ms)": 3})

# %% [markdown]
# ## The per-expert cost by experiment
#
# The regression's $\alpha(m)$ cannot say what one more expert *causes*: $\bar U_r$ moves with $m$
# and with what the text routes to. `benchmarks/bench_expert_cost.py` holds $m$ fixed and plants the
# routing of stand-alone MoE layers (random weights, the model's shape) so that every layer of a pass
# touches exactly $\bar U$ experts, from top-$k$ to $\min(m\cdot k, E)$; passes are interleaved and
# repeated, and $T = \beta_0(m) + \alpha(m)\,\bar U$ is fitted per $m$ (HC3 intervals), in the paper's
# units (ms per unit of per-layer $\bar U$ over all layers). Beside it: the floor of reading one
# expert's weights in every layer at the measured copy bandwidth, and the paper's regression values.

# %% tags=["hide-input"]
cost_runs = expert_cost.load_runs()
print(expert_cost.summary(cost_runs))

# %% tags=["hide-input"]
page.table(expert_cost.alpha_table_compact(cost_runs), "tbl-final-expert-cost",
           "Per-expert cost $\\alpha(m)$ and intercept $\\beta_0(m)$ by experiment (planted routing; 95% HC3 "
           "intervals; all layers), over the bandwidth floor and over the paper's regression $\\alpha$ (A100 80GB, "
           "bf16); the floor and the paper's values are in the full table. Data: measured benchmark runs in "
           "`data/expert_cost/` (the run column names device and shape).", full=expert_cost.alpha_table(cost_runs))

# %% tags=["hide-input"]
page.table(expert_cost.step_table(cost_runs), "tbl-final-expert-cost-step",
           "Does $\\alpha$ step at $m = 4/5$ with the routing held fixed? Regime means, their ratio, and the "
           "jump $\\alpha(5) - \\alpha(4)$ with its 95% interval. Data: measured benchmark runs in "
           "`data/expert_cost/`.")

# %% tags=["remove-input"]
key.fill(view.key_results(res))

# %% [markdown]
# ## Versions

# %% tags=["remove-input"]
bs.version_report(tr)
