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
# (sec-methods)=
# # Methods and data contract
#
# This page is the reference the package's docstrings point to: what a trace holds, how a
# verification round is priced, what the Oracle solves, and the conventions that every producer
# (the tracing harness, the simulator) and every consumer (the statistics, the Oracle, the
# linguistic study) share. The formulation is ours: the preprint's main text is not available to
# us, so where the appendix is silent we say what we chose.
#
# (methods-rounds)=
# ## Speculative rounds
#
# One **round** of one generation at batch size 1: the drafter proposes $K$ tokens (draft time
# $T_D$), the MoE target verifies $m$ positions in one forward pass (target time $T_T$), greedy
# verification keeps the longest matching prefix of $a$ drafts, and the round emits $a + 1$ tokens
# (the target's own token after the last accepted draft), fewer at the end of a generation. On a
# decode round $m = n_\text{draft} + 1$, which is $K + 1$ whenever all $K$ drafts are proposed (an
# n-gram drafter may find fewer). $\bar U_r$ is the number of distinct experts the pass routes to,
# per MoE layer, averaged over layers; $E_\max$ the largest per-layer count. The first round of a
# generation is its **prefill** (it emits the first token); prefill rounds stay in the trace, to
# mark generation boundaries, and every fit excludes them through one counted filter
# (`speclimits.trace.decode_rounds`), which also drops rounds with a zero timing and reports how
# many it dropped.
#
# (methods-cost)=
# ## The cost model
#
# The target time of a pass with $m$ rows is
#
# $$T_T(m, \bar U, L) = \beta_0(m) + \alpha(m)\,\bar U + c\,L,$$
#
# free intercept and expert slope per $m$, one context slope $c$ (the appendix's Eq. 4, fitted on
# the decode rounds with standard errors clustered by generation). The draft time of $k$ steps is
# $T_D(k) = a\,k + b$, and $0$ for $k = 0$ (a plain autoregressive step). A round that drafts $k$
# tokens therefore costs
#
# $$C(k) = T_D(k) + T_T(k+1, \bar U, L).$$
#
# `speclimits.costmodel.CostModel.round_ms` is the one place this formula is written. At $m = 1$
# every pass touches exactly `top_k` experts per layer, so $\alpha(1)$ is not identified; the fit
# sets $\alpha(1) := \alpha(2)$ and $\beta_0(1) := \text{intercept}(1) - \alpha(1)\cdot\text{top\_k}$ and
# records that in the JSON. The **cost-model JSON** (ms units) is the hand-off between the fit and
# the Oracle:
#
# ```json
# {"target": {"c": 0.0011, "by_m": {"2": {"beta0": 7.3, "alpha": 0.078}, "...": {}}},
#  "draft":  {"a": 0.459, "b": 0.073}}
# ```
#
# `speclimits fit TRACE --out FILE` writes it; `--cost-model FILE` makes the Oracle commands read
# one (hand-edited for a what-if, say). In a book build, section 3 writes the fit into the site as
# `_static/cost_model.json` and the Oracle and linguistic sections read that file: one fit per build.
#
# (methods-minimum-sweep)=
# ### What a sweep must hold
#
# The cost model is fitted and written first, on any trace where it is identified: rounds at some
# $m \ge 2$ whose $\bar U$ varies (K = 0 rounds add $m = 1$), and $\ge 2$ values of $K > 0$ for the
# draft line (with one, the line goes through the origin, $b := 0$, and the JSON says so).
# **Sparse cells.** An n-gram or draft-model trace has most rounds at $m = 1$ and a handful at larger
# $m$. An $m$ with fewer than 20 decode rounds, or rounds from fewer than 3 generations, is pooled
# with the next larger $m$ until the group meets both minimums (a sparse group at the top joins the
# one below; $m = 1$ is never pooled): the group shares one $\beta_0$ and one $\alpha$, written for
# each of its $m$, and is named in the output (`speclimits.stats.costfit.pool_sparse_m`). An $m$
# missing between two present ones (a grid such as K = 0, 2, 4) gets $\beta_0$ and $\alpha$
# interpolated linearly in $m$. Cluster-bootstrap replicates that draw no generation of a cell the
# design needs are counted, reported and left out of the intervals.
#
# Each comparison of section 3 is computed only where the trace identifies it; otherwise it is
# skipped with one line saying why (`FinalModelResults.skipped`): per-K cross-validation needs
# $\ge 5$ generations per K; the pooled model with $\gamma K$, the comparison table and MAPE by K
# need $\ge 2$ values of $K > 0$; leave-one-K-out and the linear and log-$m$ forms need $\ge 3$; the
# quadratic form $\ge 4$; the hinge after $m = 4$ needs $\ge 2$ values of $K \le 2$ and $\ge 2$ of
# $K \ge 4$; interpolation within a regime needs three consecutive K. The whole section, as the
# paper's, needs a contiguous sweep $K = 1..5$ or wider (the paper swept $1..10$); the bundled traces
# sweep $K = 0..10$.
#
# **The book on a thin trace.** Every page runs on any trace that `speclimits validate` passes. Where
# the trace cannot give a table or figure, the page shows one note in its place, "This trace cannot
# show …: …", with the requirement above and what the trace has, and a numbered reference to it reads
# "Table (not shown on this trace)"; a key result it cannot give reads "not identified on this trace".
# The factor analysis skips a factor that does not vary ($m$ on a sweep with one $K > 0$); the draft
# section needs $\ge 2$ values of $K > 0$; the robustness checks run on $K = 8$, else on the largest
# $K$ present; the Oracle sections solve with drafts only as long as the cost model prices (a sweep
# $K = 0, 2, 4$: $K_{\max} = 4$), and a trace traced without `--oracle` has no Oracle sections.
#
# (methods-oracle)=
# ## The Oracle
#
# The Oracle runs offline over **reference sequences**, each the $N$ tokens a generation emits
# after its prefill. **State** $n \in \{0, \dots, N-1\}$ counts the reference tokens already emitted;
# $N - n$ remain, and a round's progress is capped at that. The context length is $L_n$. In state
# $n$ the drafter proposes a greedy chain $d_{n,1..K_\max}$, each step conditioned on its own
# previous proposals. **Action** $k \in \{1..K_\max\}$ drafts $k$ of them ($k = 0$, a plain step, is
# allowed on request). Its cost is the round cost above with the **counterfactual** expert count
# $\bar U_n(k)$: the distinct experts per layer the target would touch verifying the window of the
# state's last emitted token and $d_{n,1..k}$, the wrong-token "junk tail" after the first mismatch
# included. It is obtained by running the target on that window, not on the reference.
#
# Transitions use a **surrogate** $q_{n,i}$ for the chance that draft step $i$ matches given that
# the chain matched so far: $P(a \ge j \mid n, k) = \prod_{i \le j} q_{n,i}$ for $j \le k$. Three
# surrogates are available, and `speclimits.oracle.prepare_oracle` chooses among them the same way
# for the command line and the book:
#
# * **raw**: the draft's probability of the reference token, as recorded;
# * **calibrated**: that probability mapped through isotonic fits (scikit-learn) of the observed
#   greedy outcomes, one map per draft position, each fitted on the draft steps that greedy rounds
#   actually tested in *other* sequences (five folds by sequence), so that no state's own outcome
#   enters its probability;
# * **exact**: the observed greedy match length itself (deterministic transitions): under greedy
#   verification this is the exact hindsight bound on these references.
#
# The default, `auto`, is *calibrated* when the trace shows a calibration gap (the observed greedy
# match rate differs from the mean recorded probability by at least 0.02, with a 95% interval over
# sequences that excludes zero) and *raw* otherwise; a simulated draft is calibrated by
# construction. The choice is checked against the measurement, not assumed (see *Validation*
# below). The Bellman equation is a DAG (every round makes progress), solved by backward induction
# over all sequences at once:
#
# $$V(N) = 0, \qquad Q(n,k) = C(n,k) + \sum_{a=0}^{k} P(a \mid n,k)\,V(\min(N, n+a+1)), \qquad
#   V(n) = \min_k Q(n,k).$$
#
# $k^\star(n) = \arg\min_k Q(n,k)$. The bounds: $\sum V(0)$ over sequences against the
# autoregressive time $\sum_n T_T(1, \bar U_n(0), L_n)$ (the **Oracle speedup**, available when the
# cost model has $m = 1$), and against every static $K$ evaluated in the same model (the **gain
# over the best static K**, chosen in hindsight).
#
# **Validation.** The trace measured every static $K$ on the prompts whose greedy output the Oracle
# walks, so the Oracle's world can be checked: each static $K$ evaluated in the Oracle's model (its
# cost model and surrogate) must reproduce the measured speedup over plain decoding, computed from
# the decode rounds' target plus draft time per emitted token. A surrogate that misses by more than
# 5% draws a warning: its bound describes another world. **Uncertainty**: the cost model is refitted
# on generations resampled with replacement and the Oracle solved again; the 95% percentile
# intervals describe the cost model's sampling uncertainty for these references.
#
# **Delta Space.** For each state and each extension $k \to k+1$ the point
# $(\Delta E[a], \Delta E[\mathrm{Cost}]) = (P(a \ge k+1),\; C(n,k+1) - C(n,k))$ is *accepted* when
# $k + 1 \le k^\star(n)$. If $V(n) \approx \lambda (N - n)$ with $\lambda$ the Oracle's time per
# token, extending pays below the line $\Delta E[\mathrm{Cost}] = \lambda\,\Delta E[a]$.
# **α = 0 ablation**: zero every $\alpha(m)$, re-solve, and compare the decisions.
#
# (methods-positions)=
# ## Reference kinds and positions
#
# A reference is either the **target's greedy output** for a prompt (as in the paper: the Oracle
# then bounds greedy speculation on the target's own text) or a **held-out text passage**, fed
# teacher-forced (the target may disagree with it at any position). The two are different
# processes and are reported apart.
#
# A **sampled reference** is a continuation the target sampled at the trace's temperature and top-p
# (`speclimits trace --temperature T --oracle-samples N`: the prompt's sweep generation and N - 1 more,
# seeded). With a greedy draft, vLLM's rejection sampler accepts draft $d$ with probability
# $p_T(d \mid \text{prefix})$, the target's probability at that temperature and top-p, and otherwise samples
# from the rest of the target's distribution; the accepted tokens are then distributed as a sample path of
# the target, and "the draft is accepted" is "it equals that path's next token". So the Oracle walks a
# sampled reference as it walks a greedy one, with `accept_prob` ($p_T$ of each drafted token, recorded by
# the harness) as each draft's match probability. A sampled trace's headline is on its sampled
# references, as a greedy trace's is on its greedy ones (`speclimits.vocabulary.headline_kind`).
#
# `oracle.parquet` holds one row per state; `tokens.parquet` one row per token, for the routing
# and linguistic studies. The convention, the same in the vLLM harness and in the simulator:
#
# * **State `pos`** (0-based) is the moment before a round: the context ends with token row `pos`
#   of `tokens.parquet`, and the round verifies the window `[row pos, d_1, …, d_k]`. In the harness
#   the prefill always emits the first token, so state `pos` has $y_1..y_{pos+1}$ emitted, row `pos`
#   holds $y_{pos+1}$ and `context_len` $= P + pos$ (the KV length of the verification pass). The
#   simulator writes, as row 0, the token its simulated prefill emitted before state 0.
# * **Draft step $i$** of state `pos` predicts **row `pos + i`**; the state's decision ($k^\star$)
#   is labelled with row `pos + 1`, the token its first draft predicts; after $a$ matched drafts
#   the first mismatch is row `pos + a + 1`. A sequence with $S$ states therefore has $S + 1$ token
#   rows (`pos` $= 0..S$).
# * **Routing** in `tokens.parquet` (`new_experts`, `experts`) is that of the target pass that
#   *reads* the row's token (the forward row whose input it is), against the pass that reads row
#   `pos − 1`: the same rows whose experts make up a verification window's $\bar U$. The Oracle's
#   own windows therefore check it: where `accept_len` ≥ 1 at state `pos`, the window's first two
#   rows read rows `pos` and `pos + 1`, and $\bar U$ over them minus $\bar U$ over the first is the
#   `new_experts` of row `pos + 1`. The harness writes the reading rows itself
#   (`speclimits.tracing.records`; `round` and `row` still name the pass that produced the token);
#   traces written before it did stored the *producing* row (the pass that emitted the token, which
#   reads the row before), and `scripts/migrate_tokens_reference.py` moves such a trace onto the
#   reading rows, telling the two apart by that identity. Routing is missing (NaN)
#   where no pass read the token: a generation's last token, and a teacher-forced reference, on
#   which the target's per-token routing was not recorded. The simulator draws it from the row's own
#   planted context.
#
# Every join goes through one function, `speclimits.linguistic.align.state_tokens` (used by the
# decision table, the first-mismatch contrast and the panels). Two checks hold on the bundled
# measured trace, and its tests assert them: where `accept_len` ≥ 1 the first draft token
# (`oracle.parquet` `draft_tokens[0]`) equals token row `pos + 1` in **every** state, greedy and
# teacher-forced (row `pos` would agree in about 5% of them), and the routing identity above holds
# exactly (one row off, it fails in most states). `speclimits linguistic TRACE --decisions FILE`
# writes the joined table (state, row joined, the predicted token's id and text, its label,
# $k^\star$, reference kind) for a reader to check.
#
# For a teacher-forced reference `tokens.parquet` holds the text the Oracle walks, with
# `reference_kind`, and the target's own greedy choice given the reference prefix where known:
# `target_agrees` (from `oracle.parquet`'s `forced`) and `target_token_id`. On a greedy reference
# the target's choice is the token itself. `speclimits trace --oracle` writes this layout at the end
# of its Oracle pass (`speclimits.trace.reference_tokens`); the project's tests check a trace the
# harness writes on the tiny model by the same rules as the bundled one.
#
# (methods-bootstrap)=
# ## Intervals
#
# Rounds of one generation, decisions of one response and states of one reference sequence are
# not independent. Every interval in the book that is not an OLS interval clustered by generation
# comes from one **cluster bootstrap** (`speclimits.bootstrap`): whole clusters are drawn with
# replacement, the statistic is recomputed, and the 2.5% and 97.5% percentiles of the replicates
# are reported.
#
# (methods-control)=
# ## Online control: where each quantity comes from
#
# A policy inside the engine (section {ref}`sec-online-control`) prices a round that drafts $k$
# tokens with costs **measured on the serving machine**, not with the trace's cost model:
#
# * **Profile at start.** For its first rounds (140 by default) the controller drafts
#   $k = 0, 1, \dots, K_{\max}$ in turn, the same $k$ for every request of the batch (at $k = 0$ the drafter
#   runs one step and no draft is kept: a pass of one row per request, the price of keeping none), and times each
#   engine step: the verification pass (the runner's `execute_model` to the drafter's start; $m = k+1$
#   rows per request), the drafter call ($j$ steps) and the time outside both (the drafter's end to
#   the next step: scheduler, input preparation, sampling, output processing). Per width $m$ the median
#   pass (made non-decreasing in $m$ by pooling adjacent violators for the per-request price; the
#   medians as measured are kept beside it), a least-squares line
#   $d_0 + d_1 j$ through the drafter's medians, the median outside time $o$.
# * **The price**, in wall-clock ms per request (the step's cost over the $b$ requests in it):
#   $\beta_0(m) = V(m)/b - \alpha(m)\,\bar U(m) - c\,\bar L$, draft line $a = d_1/b$,
#   $b_{\text{draft}} = (d_0 + o)/b$, so that at the profile's mean $\bar U$ and context the price is
#   the measured step. At batch 1 the expert slope $\alpha(m)$ and the context slope $c$ come from the
#   trace's fit (timing alone cannot separate them from the intercept); at batch > 1 the step's
#   $\bar U$ is not priced ($\alpha = 0$).
# * **Refresh.** Every later round at the profiled batch size (the drafter's start to the next drafter's
#   start) is compared with the price of the $k$ each request drafted; an exponentially weighted ratio
#   (weight 0.05, each observation clipped to $[1/3, 3]$) scales every price, so a machine that slows
#   down is followed. Steps with fewer requests (a batch's tail, once some requests have finished) are
#   left out: each of their requests pays a larger share of the step, which is not a change of speed.
#   Only rules that read prices (the Delta rule) refresh.
# * **At batch > 1** the Delta rules decide once for the batch: after draft step $j$ they search every
#   $J \in \{j, \dots, K_{\max}\}$ and every total $n$ of draft tokens kept, pricing a step at
#   $s\,(d_1 J + V(\lceil (b+n)/b \rceil))$ with $V$ the **pass medians as measured** (not pooled: at
#   batch 8 on an Intel Xeon with AMX passes of 32 and 48 rows were faster than passes of 24 and 40, the
#   kernels run rows in tiles of 16; not on an AMD EPYC without AMX), a width between two profiled ones priced as the wider; each kept token
#   $t$ of request $i$ gains $\lambda_i P_{i,t}$, with the steps not drafted yet extrapolated from the
#   last confidence. They draft on while some longer round has a lower cost less gain, then keep
#   the $n$ most probable tokens. The offline prediction at batch > 1 replays the greedy references a
#   batch at a time through the engine's own round driver, each step priced by its shape in the same way
#   (`speclimits.control.offline.batch_replay`).
# * **The throughput-aware rule** keeps, per draft position $t$, decayed counts of the rounds that reached
#   it and of those that accepted it (weight 1/20 on the newest, as SGLang's window of 20; a position no
#   round tests fades back towards the prior over 100 rounds), plus 4 pseudo-rounds at the fit's
#   per-position acceptance (from the static-$K$ tokens per round of the train references). Each round it
#   drafts $\arg\max_k (1 + \sum_{t \le k} \prod_{s \le t} \hat\alpha_s)/\hat C(k)$; in the engine
#   $\hat C(k)$ is the profiled pass as measured plus the drafter's line and the time outside, per request;
#   at batch > 1 the live requests' counts are pooled and the batch drafts one $k$, so the pass has a width
#   the profile timed. The prior weight and fade were chosen on the batch replay of the train references.
# * **Deciding.** Each rule is written once, one request at a time in Python floats from tables made at
#   setup, the form the engine runs: right after a forward pass a numpy call costs 10–20 µs there (its
#   code and data are out of the caches), a float operation well under 1 µs. The offline harness runs
#   the same rules through the same round driver (`speclimits.control.driver`), so an engine run's
#   recorded inputs replay to its $k$ in every round (tested inside vLLM at batch 1 and 4). The confidence of a draft step is computed only
#   where a request could stop at that step, over the EAGLE-3 head's own logits (its draft vocabulary;
#   checked once against the target-vocabulary logits vLLM makes of them), by one compiled call
#   (`speclimits.control.top1op`, C++ built once per machine and checked against torch at load: per row
#   the first maximum and $1/\sum_v e^{x_v - \max}$, within $10^{-5}$ of torch's softmax; rows that are not
#   finite are left to torch) or, where no compiler is available, one softmax and one max in torch; the
#   same call gives the step's draft token, which the controller then hands to vLLM in place of its
#   `argmax` (the compiled call: the argmax's token exactly; torch's form: the probabilities' first
#   maximum, the argmax's token except where two logits round to the same probability, which can change
#   what is drafted, never what is output); on those steps vLLM's
#   scatter of the head's logits into the target vocabulary, whose only reader was that `argmax`, is not
#   run. At batch > 1 the batch rule's stop test after each step builds the longer rounds' gains only
#   as its search reaches them (it usually stops at the first longer round that beats stopping) and sums
#   plain floats (the request and position of each gain matter only for the final keep, computed once
#   when the batch stops). The steps without a
#   confidence run vLLM's `argmax`. The first 8 read steps per batch width run it too, timed in place
#   (the top-1 is computed after the step); decision time is the controller's time in its hooks less that
#   `argmax` median for each later read step, where the compiled call made the token choice (the gross
#   time is kept too).
#   The rules with memory (the running $\lambda$, EMA, Cascade, throughput-aware) see each round's outcome
#   one round late in the engine: the tokens a round emitted reach the host in vLLM's bookkeeping, after
#   that step's drafting, and the controller reads them from the requests' output lists at the next step
#   rather than copying the sampled tensor a second time (a `tolist` right after a forward, 10 µs here);
#   a rule that decides round $r+1$ has then seen rounds $1..r-1$, offline as in the engine (the round
#   driver holds each request's last round until its next one is verified).
# * **From the offline fit**, only what timing cannot give: the confidence calibration map, the
#   threshold $\tau$, $\lambda$ as a dimensionless ratio to the best static $K$'s time per token on the
#   training references (in the engine $\lambda_0$ is that ratio times
#   $\min_k \hat C(k)/\text{tokens per round}(k)$ under the profiled price; the running $\lambda$ then
#   adds the measured ms and tokens), the $\bar U$ predictor (mean per $m$).
#
# The benchmark's reference is **stock vLLM** with `num_speculative_tokens = K` for every $K$, in the
# same process, warmed up like every arm. Blocks (one prompt, or one batch of prompts) run every arm in
# a rotated order; a speed ratio is the geometric mean over blocks of the reference's time over the
# arm's in the same block, with a 95% percentile bootstrap interval over blocks. The best stock $K$ is
# chosen on the even blocks and the comparison is made on the odd ones, so the reference is not the
# arm that happened to be lucky on the blocks it is judged on.
# The offline prediction of an arm (its replay priced with the run's profiled costs) is total time over
# total tokens, so its error is taken against the same ratio measured (all blocks' time over all their
# tokens), not against the median of the blocks' own ratios, which differs where blocks differ.
# It is priced at the speed the machine had when the run started; when that speed moves during the run,
# the controller's price refresh measures it. The **rescaled** prediction multiplies the same
# prediction by the run's price level: per block, the median of the price scales the controlled arms
# ended the block with (measured over priced round time), averaged over the arm's blocks weighted by
# its tokens in each. The stock arms have no clock of their own; they share the block's minutes, so
# their rescaled error is a test of the correction, not a fit to it.
#
# (methods-batch)=
# ## The bound at batch > 1
#
# At batch $b$ (section {ref}`sec-beyond-batch`) the requests of an engine step share one verification
# pass and one drafter call, and vLLM drafts the same $k$ for all of them. A step with $n$ active
# requests of $m = k + 1$ rows each costs
#
# $$C_n(k) = \underbrace{[k>0]\big(a k + b + (n-1)(a_{\text{req}} k + b_{\text{req}})\big)}_{T_D}
#  + \underbrace{\beta_0(m) + \gamma(m)(n-1) + \alpha(m)\,\bar U_{\text{step}} + c\sum_i L_i}_{T_T},$$
#
# with $\bar U_{\text{step}} = E\,(1 - \prod_i (1 - u_i/E))$ the union of the requests' counterfactual
# windows $u_i$ under independent routing (compared with the measured steps in the section). At
# $n = 1$ this is the batch-1 model. The **closed batch** runs $b$ reference sequences from the
# start until every one has finished; a finished request leaves, and the batch shrinks. The objective is
# the expected total time; ms per token divides by all tokens.
#
# **Exact at $b = 2$.** The state is the pair of positions $(p_1, p_2)$; each request's accepted drafts
# follow its own survival $P(a_i \ge j)$, independently, and
# $Q(p_1, p_2, k) = C_2(k) + \mathbb E\,V(p_1 + a_1 + 1, p_2 + a_2 + 1)$ (progress capped at what is
# left; once one request is done the other continues with its batch-1 values). Backward induction runs
# row by row in decreasing $p_1$, vectorised over $p_2$ and $k$; tests check it against enumeration of
# every joint action sequence (exact references) and a naive recursion (probabilistic).
#
# **A bound for any $b$: the decoupling relaxation.** Split each shared round among its $n \le b$
# requests: request $i$ pays $1/n$ of the draft and base terms, its own context $c L_i$, and the expert
# term in proportion to its own experts, $\alpha(m)\,\bar U_{\text{step}}\,u_i/\sum_j u_j$. The shares add
# up to the round. Each is at least the request's **relaxed batch-1 cost**
# $c'_i(k) = [k>0](a' k + b') + \beta_0'(m) + \alpha'(m)\,u_i + c\,L_i$ with
# $\beta_0'(m) = \min_{n \le b} \frac{\beta_0(m) + \gamma(m)(n-1)}{n}$,
# $a' = \min_{n\le b}\frac{a + a_{\text{req}}(n-1)}{n}$, $b'$ likewise, and
# $\alpha'(m) = \alpha(m)\,\rho_b(x_m)$, $\rho_b(x) = \frac{1 - (1-x)^b}{b x}$, $x_m$ the largest
# $u/E$ at width $m$. For the expert term order the requests by decreasing $x_j = u_j/E \le x$ and
# write the union as first hits:
#
# $$1 - \prod_j (1 - x_j) = \sum_j x_j \prod_{i<j}(1 - x_i) \ \ge\ \sum_j x_j (1-x)^{j-1}
#   \ \ge\ \Big(\sum_j x_j\Big)\,\frac1n \sum_{j \le n} (1-x)^{j-1},$$
#
# the last step by Chebyshev's sum inequality (both sequences decrease), so
# $\bar U_{\text{step}} / \sum_j u_j \ge \rho_n(x) \ge \rho_b(x)$ ($\rho_n$ falls with $n$): for
# $\alpha \ge 0$ a share is at least $\alpha\,u_i\,\rho_b$; for $\alpha < 0$ the union is at most the
# sum and the share is at least $\alpha\,u_i$. Every request takes part in every round until it
# finishes, its transitions depend only on the $k$ it is given, and the other requests' outcomes are
# independent of its own: seen from one request, any joint policy is a randomised, history-dependent
# batch-1 policy, whose expected relaxed cost is at least the batch-1 Oracle's optimum $V'_i(0)$ under
# $c'$ (which may even choose $k$ per request). Hence
#
# $$\mathbb E\,T(\pi) \ \ge\ \sum_i V'_i(0)$$
#
# for every policy $\pi$ whose rounds hold at most $b$ requests: every static $K$, every batch-size→$K$
# table, the exact $b = 2$ Oracle. At $b = 1$, $c'$ is the batch-1 model and the bound is the batch-1
# Oracle. It is loose where the relaxation gives something away: the per-request choice of $k$, the
# cheapest share at every $n$ (a request alone at the end of a batch is priced as if shared), and
# $\rho_b$ at the largest window; the section measures the slack against the exact $b = 2$ Oracle.
#
# **Static $K$ and tables.** A static $K$ drafts $K$ for every request; a batch-size table drafts
# $K(n)$ with $n$ the requests still active. Both are evaluated exactly with exact references (one
# simulation of the closed batch) and at $b \le 2$ (the pair equation with the table's $k$); at $b > 2$
# under the probabilistic surrogate by Monte Carlo (seeded, with a 95% interval). The best table is
# found by coordinate descent from the best static $K$ (a coordinate-wise optimum), searched on one seed's
# draws and reported on another's.
#
# (methods-contract)=
# ## The trace directory
#
# A trace is a directory with `meta.json` and Parquet tables; each table may be one file or a
# folder of part files with that name (the harness writes parts as it goes, so an interrupted sweep
# stays readable). `speclimits validate TRACE` checks everything below and names the file, the
# column and the first offending rows of every defect. The tables, from the package's schema:

# %% tags=["remove-cell"]
import textwrap

import speclimits.book_support as bs

page = bs.setup()

# %% tags=["parameters", "remove-cell"]
trace = None
smoke = False
seed = 0

# %% tags=["remove-input"]
page.table(bs.schema_table("rounds"), "tbl-methods-rounds",
           "Columns of the `rounds` table: one row per speculative round (the harness's record); from `speclimits.trace.schema`.")

# %% tags=["remove-input"]
page.table(bs.schema_table("oracle"), "tbl-methods-oracle",
           "Columns of the `oracle` table: dense per-position data of the reference sequences (what the Oracle reads); from `speclimits.trace.schema`.")

# %% tags=["remove-input"]
page.table(bs.schema_table("tokens"), "tbl-methods-tokens",
           "Columns of the `tokens` table: token text and routing per position (what the linguistic study reads); from `speclimits.trace.schema`.")

# %% tags=["remove-input"]
page.table(bs.schema_table("steps"), "tbl-methods-steps",
           "Columns of the `steps` table (batch traces only, `speclimits trace --batch`): one row per engine step of a traced batch; rounds then also carry `b` and `batch_id`, joined to steps on (`batch_id`, `step`); from `speclimits.trace.schema`.")

# %% [markdown]
# `meta.json` must name the keys below. `source` is `vllm` for a measurement or `simulator` for a
# simulated trace (then `simulated: true` as well, and the planted truth under `truth`); every page
# of the book states which one it ran on.

# %% tags=["remove-input"]
print(textwrap.fill(", ".join(bs.META_REQUIRED), 88))

# %% [markdown]
# (methods-labels)=
# ## Linguistic labels
#
# The simulator plants, and the rule-based labeller reads back from token text, one vocabulary
# (`speclimits.vocabulary`): the modes, the context labels and the finer labels below. The rules
# are in `speclimits.linguistic.labels`; section {ref}`sec-linguistic` describes them.

# %% tags=["remove-input"]
page.table(bs.vocabulary_table(), "tbl-methods-vocabulary",
           "The shared vocabulary: context labels with the mode each belongs to, and the finer labels "
           "(`speclimits.vocabulary`).")

# %% [markdown]
# ## Versions

# %% tags=["remove-input"]
bs.version_report(page.load(trace))
