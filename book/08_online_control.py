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
# (sec-online-control)=
# # Online control against the bound
#
# The paper stops at the bound and calls it "a reference point for designing future adaptive online
# heuristics". This section builds such heuristics and runs them **inside stock vLLM** (the CPU build,
# through a worker extension: no fork), against the Oracle of {ref}`sec-oracle` on the same prompts.
#
# A policy decides, for each live request and each round, how many tokens to draft — before drafting
# (a cap) and after each draft step (stop or go on), from what a running system has: the draft's top-1
# probability as it is produced, the round costs, a predicted $\bar U$ (mean per verified-row count,
# from the measured rounds), and a running time per token. The same object is evaluated offline on the
# Oracle's inputs and runs in the engine, where the drafter's loop stops once every request in the batch
# has stopped and each request's draft is then cut to its own $k$ (so $k$ is ragged within a batch; a
# request may keep draft steps that were run for the others anyway, when verifying them pays).
#
# **At batch > 1 the Delta rules decide once for the batch.** A step of $b$ requests runs the drafter
# $J$ times for all of them (until the last one stops) and verifies all their rows in one pass, so a
# request that stops early saves no draft step, and a pass is priced by its total width. After each
# draft step the rule searches every $J$ from the steps drafted to $K_{\max}$ and every number $n$ of
# draft tokens kept in all: the step costs $b\,a\,J + V(n)$, with $V$ the profiled pass at the next
# width the profile timed (with AMX the CPU kernels run rows in tiles of 16: on an Intel Xeon a pass of 32
# rows at batch 8 ran faster than one of 24; the profiled medians of each run are printed below), and gains $\lambda_i P_{i,t}$ for each kept token $t$ of request $i$ ($P$ the running
# product of calibrated confidences, extrapolated past the last drafted step); it drafts on while some
# longer round is better, then keeps the $n$ most probable tokens. Each request priced alone (the
# earlier form) is kept as `delta:alone` and `delta-fixed:alone`. The other rules are reproduced as
# published (per request). At batch > 1 the offline prediction replays the greedy references through
# the engine's own round driver, a batch of them at a time, with each step priced by its shape.
#
# **Where each quantity comes from.** In the engine the round costs are *measured on the serving
# machine*: for its first 140 rounds the controller drafts $k = 0, \dots, K_{\max}$ in turn (at $k = 0$
# no draft is kept: a pass of one row per request) and times the verification pass per width $m$, the drafter per step and the time outside both
# (scheduler, sampling, Python), then prices every round in those wall-clock milliseconds and rescales
# the prices by the measured-over-priced ratio of the rounds it runs (an exponentially weighted
# refresh, so a machine that slows down is followed). The offline fit supplies only what timing cannot:
# the confidence calibration map, the dimensionless thresholds ($\tau$, and $\lambda$ as a ratio to the
# best static $K$'s time per token), the $\bar U$ predictor and the expert slope $\alpha(m)$ at batch 1.
#
# **Reading the confidence cheaply.** Right after the drafter's forward every torch call runs cold
# (about 7–20 µs each on the AMD EPYC that measured these runs, whatever its size), so the rules that read the draft's top-1
# probability do as few as they can: the top-1 comes from the EAGLE-3 head's own 4,096 logits (the
# 8,192 target-vocabulary logits vLLM returns are the same values among $-\infty$; checked once per
# engine), and on a step whose top-1 the rule reads, one compiled call (`speclimits.control.top1op`: a
# C++ function built once per machine through torch's `load_inline`) gives both the top-1 and the draft
# token in one pass over each row, in place of vLLM's `argmax` (its token exactly: the first maximum).
# Where it cannot be built (no C++ compiler), one softmax and one max in torch do the same (the same token
# except where two logits round to the same probability; the target verifies every draft, so the output
# cannot change either way). On the other steps vLLM's `argmax` runs. Time spent deciding is reported net
# of the `argmax` the compiled call replaces (its median over the first 8 read steps per batch width, which
# run vLLM's `argmax` timed in place), the gross time beside it. (Earlier runs also timed two exact
# equivalents of the `argmax` and kept the fastest; vLLM's own was the fastest at almost every width, the
# others at most 4 µs faster, and that choice was removed.)
# On those steps the controller also skips vLLM's scatter of the head's logits into the target vocabulary
# (a $-\infty$ tensor of the target's width and an indexed copy), whose only reader was the `argmax`.
# The rules with memory (running $\lambda$, EMA, Cascade, throughput-aware) learn each round's outcome one
# round late in the engine: the tokens a round emitted reach the host in vLLM's own bookkeeping, after
# that step's drafting, and the controller reads them there at the next step instead of copying the
# sampled tensor a second time (10 µs right after a forward). The offline replay hands them each outcome
# at the same point (the round driver holds a request's last round until its next one is verified), so
# an engine run's recorded inputs replay to its $k$ in every round.
#
# Policies:
#
# * **static K** — every $K \le K_{\max}$; offline the best one in hindsight is the reference, in the engine
#   stock vLLM at every $K$ (the best one chosen on half of the blocks);
# * **confidence threshold** (SpecDec++/DISCO-style): draft while $\prod_{i \le j} p_i \ge \tau$;
# * **Delta rule** (the paper's boundary, online): extend while the predicted marginal cost is below
#   $\lambda$ times the marginal expected progress, with calibrated confidence; $\lambda$ fixed or running;
# * **EMA of accepted length** (SGLang-style, reimplemented from its description) and **utility
#   test-and-set** (Cascade-style): published baselines that choose $k$ per request from observed rounds;
# * **throughput-aware** (SGLang's proposed controller, reimplemented from its description): each round
#   $k^\star = \arg\max_k E[\text{tokens}\mid k]/\hat C(k)$, with the acceptance of each draft position
#   counted over the recent rounds (decayed; a prior from the fit) and $\hat C$ the profiled round; at
#   batch > 1 the batch's counts are pooled and every request drafts the same $k$. It reads no
#   confidences, so it decides as cheaply as the EMA rule.
#
# $\tau$, $\lambda$, the calibration map and the $\bar U$ predictor are fitted (`speclimits control fit`)
# on a seeded half of the **greedy** references; everything below is on the other half. A policy's
# **share of an Oracle's gain** is the part of that Oracle's gain over the best static $K$ it recovers,
# $(1 - T/T_{\text{static}})/(1 - T_{\text{Oracle}}/T_{\text{static}})$, against the exact-greedy Oracle
# (it knows the outcomes) or the surrogate Oracle (it knows the match probabilities); every share below
# says which, and where the times come from: **offline** (the held-out references replayed, or their
# expected time under the surrogate, priced by the cost model or by a run's profiled costs) or **in the
# engine** (the measured paired ratio $r$ to the best stock $K$, as $(1 - 1/r)/(1 - 1/G)$ with $G$ the
# exact Oracle's gain offline on the run's references). Section 6's key result is the offline share of
# the exact Oracle's gain on the same references ({ref}`sec-oracle`).

# %% tags=["remove-cell"]
from textwrap import indent

import pandas as pd
from IPython.display import Markdown, display

import speclimits.book_support as bs
from speclimits.book.views import control as view
from speclimits.book.views import sampled
from speclimits.control.fit import fit_policy, greedy_setup
from speclimits.control.decompose import gap_decomposition
from speclimits.control.offline import k_chosen_along, offline_table
from speclimits.control.rules import PolicyFit
from speclimits.arms import POLICY_NAMES
from pathlib import Path

from speclimits.book.views.control_runs import engine_table, gap_lines, share_long
from speclimits.book.views.oracle import wrap
from speclimits.paths import BUNDLED_TRACE, TWIN_TRACE
from speclimits.trace import Trace, read_meta
from speclimits.figures import control as control_figures
from speclimits.costmodel import CostModel
from speclimits.machine import describe
from speclimits.oracle.prepare import oracle_data_missing, priced_k_max
from speclimits.stats import fit_trace_cost_model

# %% tags=["parameters", "remove-cell"]
trace = None
smoke = False
seed = 0
k_max = 6
test_share = 0.5
n_rollouts = 64
n_boot = 999
cost_model = None
results = None

# %% tags=["remove-input"]
page = bs.setup(results)
key = page.key_results("sec-online-control", "online control")

# %% tags=["hide-input"]
tr = page.load(trace)
oracle_ok = page.shows("the online policies (this whole section: they are fitted and replayed on the Oracle data)", oracle_data_missing(tr))
if oracle_ok:
    print(wrap(tr.source_label))
    n_rollouts, n_boot = bs.smoke_sizes(smoke, n_rollouts=n_rollouts, n_boot=n_boot)
    k_asked = k_max
    k_max, k_note = priced_k_max(CostModel.read(cost_model) if cost_model else fit_trace_cost_model(tr), k_max)
    page.shows(f"the policies with drafts of up to $K_{{\\max}} = {k_asked}$ tokens", k_note)
    fit = fit_policy(tr, k_max=k_max, test_share=test_share, seed=seed, cost_model=cost_model)
    setup = greedy_setup(tr, fit.cost_model)
    k_max = fit.k_max
    print(wrap(f"fitted on {len(fit.train_seq_ids)} greedy references, evaluated on {len(fit.test_seq_ids)}: "
               f"τ = {fit.tau:.4g}, λ = {fit.lambda_:.3f} ms/token (train Oracle: {fit.lambda_oracle:.3f}), "
               f"K_max = {k_max}"))

# %% [markdown]
# ## Offline prediction on the held-out references
#
# *Replay*: the real greedy outcomes of the recorded draft chains (what greedy verification in the
# engine reproduces token for token), priced by the cost model. *Surrogate*: expected time under the
# Oracle's match probabilities (exact policy evaluation for rules without memory, seeded rollouts for
# the others). Intervals: 95% bootstrap over references. {numref}`tbl-control-offline` gives each
# policy's predicted time and the share of each Oracle's gain it captures. The surrogate column is
# {numref}`tbl-oracle-policies` of {ref}`sec-oracle` per token: one fit, one evaluation, one number per policy.

# %% tags=["hide-input"]
if oracle_ok:
    names = [f"static:{k}" for k in range(1, k_max + 1)] + list(POLICY_NAMES)
    offline, bounds = offline_table(fit, setup, list(fit.test_seq_ids), names, n_rollouts=n_rollouts, seed=seed,
                                    n_boot=n_boot)
    page.table(view.offline(offline), "tbl-control-offline",
               f"Offline prediction on the {len(fit.test_seq_ids)} held-out greedy references: time per token replayed and "
               "under the surrogate, and the share of each Oracle's gain over the best static K captured (95% bootstrap "
               f"intervals over references). The Oracle's gain over the best static K (K = {bounds['best_static_k_replay']}): "
               f"exact greedy {bounds['oracle_exact_gain_over_best_static']:.3f}×, surrogate ({bounds['surrogate']}) "
               f"{bounds['oracle_surrogate_gain_over_best_static']:.3f}×.", decimals=3, full=offline)

# %% [markdown]
# ## Measured in the engine, against stock vLLM
#
# `speclimits control bench` builds, in one process, plain decoding, one **stock** vLLM engine per static
# $K$ (`num_speculative_tokens = K`, no extension: what a user would run) and the engine with the control
# extension, where each policy is an arm (and static $K$ = 2, 3, 4, to measure what the extension itself
# costs). Every engine is warmed up first; the controlled one profiles its costs during its warm-up. A
# block is one prompt (batch 1) or one batch of prompts; every arm runs every block, in an order rotated
# from block to block, so that the machine's drift is shared by the arms of a block and cancels in their
# ratio. Speed ratios are paired (the reference's time over the arm's, block by block; geometric mean),
# with 95% bootstrap intervals over blocks; the best stock $K$ is chosen on the even blocks and compared
# on the odd ones, so that it is not flattered by the noise it was chosen on. Beside it, the **workload
# ratio**: the best stock $K$'s time per token over all blocks (all their time over all their tokens,
# the $K$ chosen on those same blocks, which favours the reference) over the arm's, with a paired
# bootstrap interval over blocks: what a user's workload would see. The book does not run
# vLLM: it reads `data/control/bench-*.json` (measured; how each was produced is in its `produced_by`,
# `config`, CPU and per-block load average): `data/control/` for the bundled pair as trained
# (cache-resident on the AMD EPYC that measured them, L3 32 MB) and `data/control/twin/` for its memory-bound twin. A trace without
# benchmark results (a simulated one) has no tables here.

# %% tags=["hide-input"]
if oracle_ok:
    runs, note = view.bench_runs(tr)
    print(wrap(note))
    tables = {batch: engine_table(res) for batch, res in sorted(runs.items())}
    for batch, table in tables.items():
        res = runs[batch]
        cpu = describe(res["engine"]["cpu"])
        loads = pd.DataFrame(res["blocks"])["load1"]
        page.table(view.engine(table), f"tbl-control-engine-batch{batch}",
                   f"Measured in vLLM {res['engine']['vllm']} at batch {batch} on {cpu}, {view.regime_of(res)}: "
                   f"{len(res['prompt_ids'])} held-out "
                   f"prompts × {res['config']['max_tokens']} tokens, {res['config']['blocks']} blocks (`{res['file']}`; "
                   f"1-minute load average {loads.min():.2f}–{loads.max():.2f}); outputs identical to plain decoding: "
                   f"{'yes' if res['lossless'] else 'NO'}. Time per token (median [interquartile range] over blocks); speed "
                   f"relative to the best stock static K ({view.arm_name(res['choice']['best_stock'])}, chosen on "
                   f"{res['choice']['best_stock_chosen_on']}; ratio and 95% interval on the other blocks); the workload "
                   "ratio to the best stock K over all blocks (all its time per token over the arm's, paired 95% interval); "
                   "the pooled "
                   "time per token (every block's time over every block's tokens) and the offline prediction of the same "
                   "arm priced with the costs profiled in this run, with its error against the pooled figure (the replay "
                   "predicts total time over total tokens, not a median of blocks) and the error of the same prediction "
                   "rescaled by the machine's price level that the controller measured during the run (methods); time "
                   "spent deciding as a share of the "
                   "round (for the rules that read the draft's confidence: net of vLLM's argmax, whose token choice they "
                   "make themselves, with the gross time in parentheses).", decimals=3, full=table)

# %% tags=["remove-input"]
if oracle_ok:
    display(Markdown(view.verdict(runs, tables, offline, bounds)))

# %% [markdown]
# ## Where the Oracle's gain goes
#
# The exact Oracle knows which drafts will match; the engine's rule knows only the draft's calibrated
# confidence, one round at a time. Between them, each rung of {numref}`tbl-control-gap` knows a little less,
# on the same held-out references as the engine runs above and with the policy they ran: the **surrogate
# Oracle** (each position's match probability, planned across rounds: the loss is *information*), the best
# rule of the engine's class fed the **true** match probabilities, its one parameter λ chosen in hindsight
# (the loss is the *planning horizon*: one round at a time), the same rule at its fitted λ, the rule reading an
# **acceptance model** fitted on the train references (the loss is *prediction*; offline only: the engine
# does not read it yet, and its request-history features are taken along the reference's walk, so this rung
# is an optimistic estimate), the rule reading the **calibrated confidence** alone (what the engine runs:
# the loss is the *features* the confidence leaves out), and the **engine** (its measured paired ratio to
# the best stock K: *engine overhead*). At batch > 1 the rules are replayed as the engine batched the
# references, each step priced with the run's profiled costs; the Oracles there are per request.

# %% tags=["hide-input"]
if oracle_ok and runs:
    same = {b: r for b, r in runs.items() if Path(str(r["config"]["trace"])).name == Path(str(tr.path)).name}
    gaps = {}
    for batch, res in sorted(same.items()):
        run_fit = PolicyFit.from_dict(res["policy_fit"], origin=res["file"])
        gaps[batch] = gap_decomposition(run_fit, greedy_setup(tr, run_fit.cost_model), bench=res,
                                        n_rollouts=n_rollouts, n_boot=n_boot, seed=seed)
    if gaps:
        page.table(view.decomposition(gaps), "tbl-control-gap",
                   "Where the exact Oracle's gain over the best static K goes, rung by rung (offline replay of the "
                   "recorded greedy outcomes except the engine's row, which is measured: "
                   + ", ".join(f"batch {b} `{r['file']}`" for b, r in sorted(same.items()))
                   + f"; the Delta rule with λ fixed; {view.regime_of(next(iter(same.values())))}, "
                   f"{describe(next(iter(same.values()))['engine']['cpu'])}). Per batch size, the share of the exact "
                   "Oracle's gain over the best static K in hindsight (offline rows) or over the best stock K (engine), "
                   "with 95% bootstrap intervals over references (batch 1) or blocks (batch > 1, rules and engine); no "
                   "interval where the rung is a per-request Oracle at batch > 1. The download adds each rung's speed.",
                   full=view.decomposition(gaps, full=True))
    else:
        print("no engine run fitted on this trace: no decomposition of the Oracle's gain")

# %% [markdown]
# **What each piece of a batch step's price is worth.** At batch > 1 a step's real shape has three parts a
# per-request rule ignores: the drafter runs until the last request stops, each request may then keep a
# prefix of what was drafted, and a request may keep nothing ($k = 0$: one row verified). The batch replay
# adds them one at a time (the held-out references, the engine run's batches, each step priced by its shape
# with the run's profiled passes) and replays each rule twice: reading the draft's calibrated confidences,
# and with **hindsight** (the confidences replaced by the truth: 1 for the drafts before the first miss, 0
# after), which is what the exact Oracle knows. The gap between the two columns is what the confidence
# does not tell.

# %% tags=["hide-input"]
if oracle_ok:
    pieces, pieces_src = view.batch_pieces(tr)
    if pieces is None:
        print(wrap(pieces_src))
    else:
        page.table(pieces, "tbl-control-batch-pieces",
                   f"Offline batch replay (no timing; `{pieces_src}`, written by `benchmarks/batch_replay_sweep.py "
                   "--hindsight`): speed ratio to the best static K of the same replay, the best over λ × 0.5–2 "
                   "(at λ as fitted in parentheses), per piece of the batch decision, with the draft's confidences and "
                   "with hindsight. Where a run profiled no pass of one row per request, that pass is estimated from "
                   "its plain-decoding arm (the file says which).")

# %% [markdown]
# **Where the expert cost lives.** The same benchmark on the other regime, set beside this page's
# (measured on the same kind of machine): the bundled pair as trained, whose passes are cache-resident on
# the AMD EPYC that measured them (a pass of 2 to 7 rows costs nearly the same), and its memory-bound twin, whose passes stream
# the experts they touch from memory (the regimes page). Each row: the best policy against the best stock
# static $K$ at that batch size.

# %% tags=["hide-input"]
if oracle_ok and not runs:
    print("no benchmark results for this trace: nothing to set beside the other regime's")
if oracle_ok and runs:
    other_trace = BUNDLED_TRACE if Path(str(tr.path)).name == TWIN_TRACE.name else TWIN_TRACE
    other, _ = view.bench_runs(Trace(other_trace, read_meta(other_trace))) if (other_trace / "meta.json").exists() else ({}, "")
    other = {b: r for b, r in other.items() if view.regime_of(r) != view.regime_of(next(iter(runs.values())))}
    if other:
        here = view.regime_of(next(iter(runs.values())))
        page.table(view.regime_contrast(runs, other, here, view.regime_of(next(iter(other.values())))),
                   "tbl-control-regimes",
                   f"The best policy against the best stock static K per batch size, {here} (this page) and the other "
                   "regime (measured, on the same kind of machine; blocks: "
                   + ", ".join(f"{view.regime_of(r)} batch {bb} {r['config']['blocks']}"
                               for rr in (runs, other) for bb, r in sorted(rr.items()))
                   + "). Paired ratio on the held-out blocks, workload ratio over all blocks, 95% bootstrap intervals "
                   "over blocks; the share of the exact Oracle's gain over the best static K captured in the engine "
                   "(from the paired ratio; the Oracle's gain offline on the same references, priced with each run's "
                   "profiled costs: "
                   + ", ".join(f"{view.regime_of(r)} batch {bb} "
                               f"{(r.get('oracle') or {}).get('oracle_exact_gain_over_best_static', float('nan')):.3f}×"
                               for rr in (runs, other) for bb, r in sorted(rr.items()))
                   + ").",
                   decimals=3)
    else:
        print("no benchmark results of the other regime to set beside these")

# %% [markdown]
# **Does it replicate?** A ratio whose interval clears 1 once can still be luck of the day on this
# machine. Where `data/control/replication/` holds a second run of the same benchmark command (same
# code, same held-out prompts, another hour), each policy's paired ratio to that run's own best stock
# $K$ (chosen on its own even blocks) is set beside the first run's.

# %% tags=["hide-input"]
if oracle_ok:
    again, again_note = view.bench_runs(tr, "replication")
    if again:
        print(wrap(again_note.replace("benchmark results", "second run")))
        rep = view.replication(tables, runs, {b: engine_table(r) for b, r in again.items()}, again)
        if not rep.empty:
            page.table(rep, "tbl-control-replication",
                       "Each policy's paired speed ratio to the best stock static K [95% interval over held-out blocks] in "
                       "the run above and in a second run of the same command (measured; how: "
                       + "; ".join(f"batch {b}: `{r['produced_by']}`" for b, r in sorted(again.items()))
                       + "). \"Replicated\": both intervals on the same side of 1, or both holding it.")
    else:
        print(wrap("no second run of this benchmark (data/control/replication/, data/control/twin/replication/): "
                   "nothing to set beside the first"))

# %% [markdown]
# **On prompts it never saw.** The runs above use the trace's held-out references, on which the rules' design
# was judged. `data/control/twin/fresh/` holds the same benchmark on 24 prompts written after the rules and the
# acceptance model were settled (`data/prompts/fresh-heldout.jsonl`; not in the trace, so with no offline
# prediction and no Oracle bound), with the Delta rules reading the acceptance model beside their calibrated
# forms.

# %% tags=["hide-input"]
if oracle_ok:
    fresh, fresh_note = view.bench_runs(tr, "fresh")
    if fresh:
        page.table(view.unseen(fresh), "tbl-control-unseen",
                   "Each policy against the best stock static K on prompts no policy was fitted or tuned on "
                   f"(measured; {view.regime_of(next(iter(fresh.values())))}, "
                   f"{describe(next(iter(fresh.values()))['engine']['cpu'])}; "
                   + "; ".join(f"batch {b}: {r['config']['blocks']} blocks" for b, r in sorted(fresh.items()))
                   + "). Paired: on the odd blocks against the stock K chosen on the even ones; workload: all "
                   "blocks' time per token against the stock K best over them (chosen in hindsight); cross-fitted: "
                   "against the stock K chosen on the other half of the blocks (even for odd, odd for even), what a "
                   "user who tunes K on one sample of the work gets; 95% intervals over blocks. "
                   "\"Below 1\": the workload interval lies under 1.")
    else:
        print(wrap("no run on unseen prompts for this trace (data/control/twin/fresh/ is the twin's)"))

# %% [markdown]
# **Where the gain goes on the unseen prompts.** Those prompts are not in the trace the policy was fitted on, so
# `data/control/twin/fresh/trace/` traces them alone (plain decoding and K = 2, with the Oracle's data: each
# position's draft chain and its matches; used for nothing else, no policy is fitted on it). On it the ladder
# above is replayed on the very prompts the engine ran, for one machine's newest run at each
# batch size (the running-λ Delta rule, the one arm all three ran). The third rung is the ceiling of the rule's
# class: fed each drafted position's *true* match probability, with its λ chosen in hindsight. A controller of
# this class that reads better predictions can climb to it, not past it.

# %% tags=["hide-input"]
if oracle_ok:
    ugaps, uruns, unote = view.unseen_gaps(tr, n_rollouts=n_rollouts, n_boot=n_boot, seed=seed)
    if ugaps:
        first = next(iter(uruns.values()))
        page.table(view.decomposition(ugaps, column="speed"), "tbl-control-gap-unseen",
                   "Where the exact Oracle's gain over the best static K goes on prompts no policy was fitted or tuned "
                   "on, rung by rung: offline replays on a trace of those prompts (`data/control/twin/fresh/trace`), "
                   "priced as in the runs (batch 1: the policy's cost model; batch > 1: each run's profiled passes), "
                   "and the engine's row measured ("
                   + ", ".join(f"batch {b} `{r['file']}`" for b, r in sorted(uruns.items()))
                   + f"; the Delta rule with running λ; {view.regime_of(first)}, {describe(first['engine']['cpu'])}). "
                   "Speed over the best static K, 95% bootstrap intervals over references (batch 1) or blocks "
                   "(batch > 1); the engine's speed is its paired ratio to the best stock K; no interval where the "
                   "rung is a per-request Oracle at batch > 1. The download adds each rung's share of the exact "
                   "Oracle's gain.", full=view.decomposition(ugaps, full=True))
        ceiling = {b: g.iloc[2] for b, g in ugaps.items()}
        print(wrap("The ceiling of the rule's class on these prompts (true match probabilities, λ in hindsight): "
                   + "; ".join(f"batch {b}: {r['speed_replay']:.3f}x [{r['speed_replay_lo']:.3f}; "
                               f"{r['speed_replay_hi']:.3f}] the best static K, {r['share_replay']:.2f} of the "
                               f"exact Oracle's gain" for b, r in sorted(ceiling.items()))
                   + ". Between it and the exact Oracle lie the information a real-time rule does not have (which "
                   "drafts will match, and the match probabilities of positions not yet drafted)."))
    else:
        page.cannot_show("where the gain goes on the unseen prompts, and how well the rules' inputs predict a match "
                         "there", unote)

# %% [markdown]
# **Why a per-round choice loses in the benchmark's batches.** A block runs its requests to the end, so its time is
# its slowest request's: after the fast requests finish, the slow ones run on in steps that cost almost a full step
# and emit few tokens. Every rule in the engine decides round by round, and none prices that tail.
# {numref}`tbl-control-batch-tails` measures it on the unseen prompts at batch 8 (`benchmarks/batch_tails.py`).

# %% tags=["hide-input"]
if oracle_ok and Path(str(tr.path)).name == TWIN_TRACE.name and view.BATCH_TAILS.exists():
    tails = view.batch_tails()
    page.table(tails, "tbl-control-batch-tails",
               f"The batch's tail at batch {tails.attrs['batch']} per static K, on the unseen prompts: the share of "
               "decoding time after a batch's first request finished, "
               f"{'SIMULATED' if tails.attrs['simulated'] else 'measured'} (a batch trace, "
               f"`{tails.attrs['trace']}`, {tails.attrs['batches']} batches per K, the engine's timed target and "
               f"drafter steps; the memory-bound twin on {describe(tails.attrs['cpu'])}) and in the replay of the "
               "benchmark's 24 blocks priced "
               "with that run's profile; and each K's measured time per token over K = 2's, in steps with the whole "
               "batch decoding and over whole batches. Per step a longer draft costs little; per batch it costs the "
               "tail.")
else:
    page.cannot_show("the batch's tail", "it is measured for the twin only "
                     "(data/control/twin/fresh/amd-epyc-c/decomposition/batch-tails.json)")

# %% [markdown]
# **A rule that plans for the tail.** Everything the block's end depends on is known when the rule decides: each
# request's tokens left (its max_tokens less its output) and its tokens per round so far, hence its rounds to go
# R. The planner (`benchmarks/batch_tails.py --plan`, offline) scales each request's λ by s·(R / R_max)^γ: the
# request that will end the block keeps the rule's price of a token (times s), the ones ahead of it draft less.
# {numref}`tbl-control-tail-plan` replays it on the benchmark runs' blocks, with (γ, s) chosen on the policy's
# train references and, as its bound, in hindsight on the blocks themselves.

# %% tags=["hide-input"]
plan = view.tail_plan() if (oracle_ok and Path(str(tr.path)).name == TWIN_TRACE.name
                            and view.BATCH_TAILS.exists()) else None
if plan is not None and len(plan):
    best_true = plan[plan["Rule"].str.contains("true")]["Tail planner, best (γ, s) in hindsight"].max()
    page.table(plan, "tbl-control-tail-plan",
               "The Delta rules with and without the tail planner, offline: each run's blocks of unseen prompts "
               "(the memory-bound twin) replayed with that run's profile (measured on the CPU named; the replay is "
               "computed, not timed), speed over the best static K of the same replay. Fed the true match "
               f"probabilities, with (γ, s) in hindsight, the planner reaches at most {best_true:.3f}x the best "
               f"static K. ({plan.attrs['produced_by']})")
    own = plan[~plan["Rule"].str.contains("true")]
    for b, g in own.groupby("Batch"):
        gain = g["Tail planner, (γ, s) from train"] - g["Per round (today)"]
        print(wrap(f"Batch {b}: with (γ, s) from the train references the planner moves the engine's Delta rules "
                   f"from {g['Per round (today)'].min():.3f}–{g['Per round (today)'].max():.3f} to "
                   f"{g['Tail planner, (γ, s) from train'].min():.3f}–{g['Tail planner, (γ, s) from train'].max():.3f}"
                   f" of the best static K ({(gain > 0).sum()} of {len(g)} rule-runs faster, change "
                   f"{gain.min():+.3f} to {gain.max():+.3f})."))
    top = own["Tail planner, (γ, s) from train"].max()
    print(wrap(f"The best of them reaches {top:.3f}x the best static K. "
               + ("It is not in the engine: it keeps the rules under the best static K, and under served load (no "
                  "tail) it would stop pricing tokens that matter." if top < 1 else
                  "Under served load (no tail) it would stop pricing tokens that matter.")))
else:
    page.cannot_show("a rule that plans for the tail", "it is replayed for the twin only "
                     "(batch_tails.py --plan, data/control/twin/fresh/amd-epyc-c/decomposition/batch-tails.json)")

# %% [markdown]
# **How well the rules' inputs predict a match.** The prediction rung of the ladders above is the acceptance
# model (a logistic regression on what the engine knows when it decides, fitted on the train references) against
# the draft's confidence alone (its isotonic calibration). {numref}`tbl-control-acceptance` scores both on the
# held-out references and on the unseen prompts' trace, per draft step that a greedy round reached;
# {numref}`fig-control-prediction-bias` shows, per draft step, how far each model's mean prediction is from the
# observed match rate.

# %% tags=["hide-input"]
if oracle_ok and ugaps:
    acc_scores, acc_bias = view.acceptance_scores(tr, uruns[min(uruns)])
    page.table(acc_scores, "tbl-control-acceptance",
               "The policy's two predictions of a draft match (the policy of the runs on unseen prompts, "
               f"`{uruns[min(uruns)]['file']}`), fitted on the train references of this trace and scored on its "
               "held-out references and on the trace of the unseen prompts: area under the ROC curve, log loss "
               "(nats per step) and Brier score over the draft steps the greedy rounds reached (offline; no timing).")

# %% tags=["hide-input"]
if oracle_ok and ugaps:
    page.figure(control_figures.prediction_bias(acc_bias), "fig-control-prediction-bias",
                "Mean predicted match probability minus the observed match rate per draft step, by model and set "
                "of references (the steps of the table above). Below zero the model expects fewer matches than "
                "there are, and a rule reading it stops early.")

# %% [markdown]
# **Would other signals predict better, and would the rule gain?** The engine's model reads the draft's top-1
# probability and the request's recent matches. The draft's top-1/top-2 margin and entropy and the target's
# top-1 probability at the last verified position were traced again for the same references
# (`data/control/twin/features/`) and offered to the same forward selection. {numref}`tbl-control-features`
# scores the models; {numref}`tbl-control-features-speed` replays the Delta rules fed each model's probabilities
# (each at its own λ, tuned on the train references) and gives the selected model's rule over the engine's,
# paired (offline; no timing).

# %% tags=["hide-input"]
if oracle_ok and Path(str(tr.path)).name == TWIN_TRACE.name and view.FEATURE_STUDY.exists():
    feat_scores, feat_speed = view.feature_study()
    page.table(feat_scores, "tbl-control-features",
               "Acceptance models fitted on the twin's train references, scored per reached draft step on its "
               "held-out references and on the unseen prompts: the engine's features, the forward selection's "
               "choice among them and the three new signals, and the engine's features with each new signal "
               "(`benchmarks/acceptance_features.py`; measured traces, AMD EPYC C; offline).")
    page.table(feat_speed, "tbl-control-features-speed",
               "The Delta rules fed the selected model's probabilities over the same rules fed the engine model's "
               "(> 1: faster), paired, 95 % bootstrap interval over references (batch 1) or the run's blocks "
               "(batch > 1, priced with that run's profile). A sharper prediction moves no decision that pays.")
else:
    page.cannot_show("the study of the acceptance features the engine does not read",
                     "it is stored for the twin only (data/control/twin/features/study.json)")

# %% [markdown]
# **Sampled requests.** Everything above is greedy. `data/traces/twin-eagle3-t07` is the twin traced at
# temperature 0.7 (top-p 1) on one machine, with two sampled references per prompt; along a sampled reference
# a draft matches with the target's probability of it, which is the probability vLLM's rejection sampler
# accepts a greedy draft with (the methods page), so the Oracle keeps its meaning. Table
# {numref}`tbl-sampled-oracle` sets it beside the greedy sweep of the same machine
# (`data/traces/twin-eagle3-t07/README.md`). Sampling costs twice here: the draft matches a sampled
# continuation less often than the greedy one, and the rejection sampler's verification of a sampled row costs
# more than a greedy one's.

# %% tags=["hide-input"]
if oracle_ok and sampled.SAMPLED_TRACE.exists() and Path(str(tr.path)).name == TWIN_TRACE.name:
    beside, machines = sampled.oracle_beside([sampled.GREEDY_TRACE, sampled.SAMPLED_TRACE], k_max=k_max)
    page.table(beside, "tbl-sampled-oracle",
               "Greedy and sampled requests on the memory-bound twin, both traced on one machine "
               f"({machines[-1]}; measured): plain decoding, the best static K, the mean accepted drafts per "
               "round of the static sweeps' references, the Oracle's bound (calibrated probabilities; k >= 1, "
               "and with k = 0 allowed: a round that drafts nothing) over plain decoding, and the largest error "
               "of the Oracle's cost model against the measured static-K sweep.")
else:
    page.cannot_show("the sampled requests (the Oracle at temperature 0.7 and the engine runs below)",
                     "they are measured on the memory-bound twin (data/traces/twin-eagle3-t07 and "
                     "data/control/twin/t07/), so the book built on the twin's trace shows them (the default book)")

# %% [markdown]
# In the engine, the policy fitted on the sampled trace's train prompts runs the 22 held-out ones at temperature
# 0.7, every request with a seed shared by the arms of its block, against plain decoding and stock vLLM at
# K = 1..6 (Table {numref}`tbl-control-sampled`). On CPU every engine of the run, stock ones included, samples
# through vLLM's rejection sampler repaired (vllm-project/vllm#55005: unrepaired, stock sampled speculation
# is not the target's distribution). The texts differ between arms by design; that the controller keeps the
# target's distribution is tested apart (`tests/test_control_distribution.py`).

# %% tags=["hide-input"]
if oracle_ok and Path(str(tr.path)).name == TWIN_TRACE.name:
    t07, t07_note = sampled.sampled_runs()
    if t07:
        page.table(sampled.engine_beside_plain(t07), "tbl-control-sampled",
                   f"The controller on sampled requests (temperature 0.7; {sampled.measured_where(t07)}"
                   + "): the best stock K over all blocks and each policy, ms per token over all blocks, the speed "
                   "over plain decoding and the workload ratio to the best stock K [95% interval over blocks].")
    else:
        print(wrap(t07_note))
else:
    page.cannot_show("the engine runs on sampled requests",
                     "they are measured on the memory-bound twin, so the book built on the twin's trace shows them "
                     "(the default book)")

# %% [markdown]
# **Rounds that draft nothing.** Inside a speculative engine the EAGLE head runs its first step every round,
# also when the rule then keeps no draft, so such a round costs a draft step more than plain decoding. The
# throughput-aware rule with k = 0 allowed (`throughput:zero-k`) prices one token from a plain pass beside
# every draft length, and when every decoding request of the batch plans k = 0 the engine does not run the
# drafter at all (after the prompt's prefill, which is drafted as always). The draft model then never sees those
# tokens: a request that drafts again later drafts from a cache with holes, which costs acceptance, never an
# output, since the target verifies every draft. A speculative vLLM engine also verifies every step, drafts or
# not: it samples through its rejection sampler, which draws recovered tokens over the whole vocabulary for
# drafts that are not there; the controller hands a step in which no request carries a draft to vLLM's plain
# sampler (the same distribution; a seeded request draws exactly as in plain decoding). Table
# {numref}`tbl-control-sampled-skip` measures the rule at temperature 0.7 (before the plain sampler took those
# steps it was 0.95–0.985× plain decoding: the runs in the folder's `rejection-sampler/`).

# %% tags=["hide-input"]
if oracle_ok and Path(str(tr.path)).name == TWIN_TRACE.name:
    skip, skip_note = sampled.sampled_runs(sampled.SKIP_BENCH_DIR)
    if skip:
        page.table(sampled.engine_beside_plain(skip), "tbl-control-sampled-skip",
                   f"Rounds that plan k = 0 skip the drafter (temperature 0.7; {sampled.measured_where(skip)}"
                   + "): the best stock K over all blocks and each policy, as in the table above.")
    else:
        print(wrap(skip_note))

# %% [markdown]
# **Greedy and sampled requests in one batch.** A served engine gets both. The controller then decides each
# request with a policy fitted at its own temperature: `speclimits control combine` writes a set of fits by
# temperature, and in the engine each request is decided by the fit nearest its temperature, read from its
# sampling parameters (the first fit prices what the batch shares: its pass). Table
# {numref}`tbl-control-mixed` runs half of the held-out requests greedy and half at temperature 0.7 in the same
# batches, every arm the same mix; the greedy requests' texts equal plain decoding's in every arm.

# %% tags=["hide-input"]
if oracle_ok and Path(str(tr.path)).name == TWIN_TRACE.name:
    mixed, mixed_note = sampled.sampled_runs(sampled.MIXED_BENCH_DIR)
    if mixed:
        first = next(iter(mixed.values()))
        page.table(sampled.engine_beside_plain(mixed), "tbl-control-mixed",
                   f"A mixed workload ({first['config']['greedy_share']:g} of the requests greedy, the rest at "
                   f"temperature {first['config']['temperature']:g}; {sampled.measured_where(mixed)}"
                   + "), the controller armed with the greedy and the sampled fit: the best stock K over all "
                   "blocks and each policy, as in the tables above.")
    else:
        print(wrap(mixed_note))

# %% [markdown]
# **Served at temperature 0.7.** The served-load benchmark (its greedy runs are in "Under served load" below),
# every request sampled at 0.7 ({numref}`tbl-control-served-sampled`; the controller is the fixed-λ Delta rule
# with the acceptance model, fitted on the sampled trace; it always keeps a draft).

# %% tags=["hide-input"]
if oracle_ok and Path(str(tr.path)).name == TWIN_TRACE.name:
    served07, served07_note = sampled.sampled_serve()
    print(wrap(served07_note))
    if served07 is not None:
        page.table(view.serve_table(served07), "tbl-control-served-sampled",
                   view.serve_caption(served07)
                   + " Speed ratios and aims as in the greedy served-load table further down.")

# %% [markdown]
# The rule that can draft nothing (`throughput:zero-k`) served the same way
# ({numref}`tbl-control-served-skip`). A speculative vLLM engine verifies every step, also a step in which no
# request carries a draft: it builds the verification's metadata and samples through its rejection sampler,
# which draws recovered tokens over the whole vocabulary for drafts that are not there. The controller hands
# such a step to vLLM's plain sampler (the same distribution; a seeded request draws exactly as in plain
# decoding); before it did, this rule served no faster than stock K = 1 (the run in the folder's
# `rejection-sampler/`).

# %% tags=["hide-input"]
if oracle_ok and Path(str(tr.path)).name == TWIN_TRACE.name:
    served_skip, served_skip_note = sampled.sampled_serve(sampled.SERVE_SKIP_DIR)
    print(wrap(served_skip_note))
    if served_skip is not None:
        page.table(view.serve_table(served_skip), "tbl-control-served-skip",
                   view.serve_caption(served_skip) + " Rounds that plan k = 0 skip the drafter; steps without a "
                   "draft are sampled by vLLM's plain sampler.")

# %% [markdown]
# The same rule against the static K the runs above left out ({numref}`tbl-control-served-skip-k`: stock K = 1,
# the best of K = 1..3 there, and K = 4, 5, 6, each its own server in the same repeats), so that "the best stock K"
# at each rate is chosen among every K of the policy's range.

# %% tags=["hide-input"]
if oracle_ok and Path(str(tr.path)).name == TWIN_TRACE.name:
    served_k, served_k_note = sampled.sampled_serve(sampled.SERVE_SKIP_K_DIR)
    print(wrap(served_k_note))
    if served_k is not None:
        page.table(view.serve_table(served_k), "tbl-control-served-skip-k",
                   view.serve_caption(served_k) + " The best stock K is chosen among the K of this run.")

# %% [markdown]
# **Served, greedy and sampled requests mixed.** Half of each run's requests greedy and half at temperature 0.7,
# in one Poisson stream (`bench_serve.py --greedy-share 0.5`: vLLM's client sends each request with its own
# sampling parameters), the controller armed with the set of the greedy and the sampled fit
# ({numref}`tbl-control-served-mixed`), and the two kinds of request apart ({numref}`tbl-control-served-mixed-kind`):
# what each kind waits, and whether the greedy requests' texts equal plain decoding's.

# %% tags=["hide-input"]
if oracle_ok and Path(str(tr.path)).name == TWIN_TRACE.name:
    served_mix, served_mix_note = sampled.sampled_serve(sampled.SERVE_MIXED_DIR)
    print(wrap(served_mix_note))
    if served_mix is not None:
        share = served_mix["config"]["greedy_share"]
        page.table(view.serve_table(served_mix), "tbl-control-served-mixed",
                   view.serve_caption(served_mix) + f" A share {share:g} of each run's requests greedy (the same "
                   "requests in every arm of a repeat), the rest sampled; the controller armed with a policy set.")
        page.table(sampled.serve_by_kind(served_mix), "tbl-control-served-mixed-kind",
                   "The mixed served run's greedy and sampled requests apart: the controller's mean E2E latency and "
                   "its speed in it (> 1: faster; 95% interval over repeats) against plain decoding and against the "
                   "best stock K by all requests' E2E; the share of greedy requests whose text equals plain "
                   "decoding's, per arm.")

# %% tags=["hide-input"]
if oracle_ok:
    if tables:
        page.figure(control_figures.share_captured_by_batch({b: share_long(t, b) for b, t in tables.items()}),
                    "fig-control-share",
                    "Share of the exact Oracle's gain over the best static K captured by each policy, offline (replay "
                    "with the profiled costs, 95% interval over references) and in the engine (from the measured "
                    "paired ratio to the best stock K, 95% interval over blocks), per batch size. Below zero a policy "
                    "is slower than the best static K; 1 would be the exact Oracle.")

# %% [markdown]
# Where the time goes and how far the prediction is from the engine, per batch size (measured): the
# profiled costs, the time the controller spends in its hooks, what the extension costs against stock
# vLLM at the same static $K$, the prediction error of the replay priced with the profiled costs (and
# at the price level the run measured), and the price refresh.

# %% tags=["hide-input"]
if oracle_ok:
    for batch, res in sorted(runs.items()):
        print(f"batch {batch}:")
        print(indent(wrap(gap_lines(res) + ([res["note"]] if res.get("note") else []), width=74), "  "))

# %% [markdown]
# ## Under served load
#
# A user runs the controller inside `vllm serve` with requests arriving on their own schedule, so the batch
# size changes from step to step. `benchmarks/bench_serve.py` measures that as users measure it: one
# OpenAI-compatible server per arm (plain decoding, stock vLLM at each static $K$, and the server with the
# controller, which profiles its costs on a warm-up at a concurrency of 4), vLLM's own benchmark client
# (`vllm bench serve`) sending the policy's held-out prompts with Poisson arrivals at several request rates
# (greedy, 128 tokens each, the same prompts and arrival times for every arm of a repeat), every server and
# client in a loopback-only network namespace. Per repeat each server runs every rate; the arms' order is
# shuffled per repeat. Speeds are paired per repeat (the reference's mean over the arm's, or the arm's
# throughput over the reference's: > 1 means the controller is faster), geometric means over repeats with 95%
# bootstrap intervals over repeats; the best stock $K$ is chosen per rate and metric on the same runs, which
# favours it. Below saturation every arm's output throughput is the offered load, so the latencies tell the
# arms apart there. The book reads the committed runs (`summary.json` and one JSON per run in the
# `vllm bench serve --save-result` format).

# %% tags=["hide-input"]
served = None
if oracle_ok:
    served, served_note = view.serve_summary(tr)
    print(wrap(served_note))
    if served is not None:
        page.table(view.serve_table(served), "tbl-control-served",
                   view.serve_caption(served) + " Speed "
                   "ratios (> 1: the controller is faster) in mean end-to-end latency, mean time per output token and "
                   "output throughput, geometric mean over repeats [95% interval over repeats]; the controller's mean "
                   "concurrency (Little's law); the aims per rate: at least the best stock K's speed and 0.95× plain "
                   "decoding's, in E2E latency.")

# %% tags=["hide-input"]
if served is not None:
    page.figure(control_figures.served_speed(view.serve_long(served)), "fig-control-served",
                "The controller's speed under served load against the best stock K at each rate and against plain "
                "decoding, per metric, over the request rate (measured; 95% intervals over repeats).")

# %% tags=["remove-input"]
if served is not None:
    display(Markdown(view.serve_verdict(served)))

# %% [markdown]
# ## k chosen against k* along one greedy reference
#
# The replayed walk of each policy visits only the states its own rounds reach; the Oracles' $k^*$
# are given at every state ({numref}`fig-control-k-along`).

# %% tags=["hide-input"]
if oracle_ok:
    seq = fit.test_seq_ids[0]
    along = k_chosen_along(fit, setup, seq, ["delta", "threshold"])
    page.figure(control_figures.k_along_reference(along.head(80), ["delta", "threshold"]), "fig-control-k-along",
                f"Draft length chosen by the Delta rule and the confidence threshold along held-out reference `{seq}` "
                "(first 80 states, replayed), against the exact-greedy and surrogate Oracles' $k^*$. Look for where the "
                "rules draft long and the Oracle does not.")

# %% tags=["remove-input"]
key.fill([bs.Result("Online policies against the Oracle", bs.NOT_IDENTIFIED)] if not oracle_ok else
         view.key_rows(runs, tables, offline, bounds, refs={b: f"tbl-control-engine-batch{b}" for b in runs},
                       offline_ref="tbl-control-offline") + view.serve_key_rows(served))

# %% [markdown]
# ## Versions

# %% tags=["remove-input"]
bs.version_report(tr)
