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
# (sec-regimes)=
# # When the expert cost binds: two regimes
#
# The paper's thesis is physical: a verification pass of an MoE reads the weights of every unique
# expert it routes to, so its time grows with $\bar U$, and that growth is what limits speculation.
# Whether it binds depends on the machine and the model, not on the method. This page measures it
# on two targets with **the same function**:
#
# - the **bundled target** as trained (16 layers, 32 experts, top-4, experts of 64 intermediate units,
#   98 KB each in float32; 6.3 MB of routed experts in all): on the AMD EPYC that measured the bundled
#   traces (L3 32 MB) the whole model is about the size of the last-level cache, so a pass costs mostly
#   per-layer framework work. We call this regime *cache-resident*;
# - its **memory-bound twin** (`speclimits models twin`): every expert widened to 1,024 units by extra
#   rows of the gate and up projections and as many zero columns of the down projection. Each expert's
#   output is unchanged, so routing, greedy outputs and the EAGLE-3 head's acceptance stay those of
#   the trained pair, while every routed expert now streams 16 times the bytes (805 MB of routed experts:
#   25 times the EPYC's L3, 2.6 times the 300 MB L3 of the Intel Xeon of the last part of this page).
#   This is the paper's regime, *memory-bound*.
#
# The paper could only regress $T_T$ on $\bar U$ across rounds, where $\bar U$ moves with $m$ and with
# what the text routes to ("the regression itself does not establish causality"). Here the routing can
# be **planted**: at a fixed width $m$, every pass of a designed experiment routes by a planted routing
# whose unique experts per layer are drawn pass by pass from top-$k$ to $\min(m\cdot k, E)$, in the real
# engine (`speclimits trace --plant-routing`, `scripts/make_regime.sh`). The line
# $T_T = \beta_0(m) + \alpha(m)\,\bar U$ fitted per $m$ is then a causal estimate of what one more unique
# expert costs.

# %% tags=["remove-cell"]
import textwrap

import speclimits.book_support as bs
from speclimits import figures, paths, regime
from speclimits.machine import describe
from speclimits.book.views import regime as views
from speclimits.trace import read_meta, read_table, read_trace

# %% tags=["parameters", "remove-cell"]
trace = None
smoke = False
seed = 0
results = None

# %% tags=["remove-cell"]
page = bs.setup(results)

# %% tags=["hide-input"]
designed = regime.designed_traces()
fits = regime.designed_fits(designed)
natural_u = regime.decode_rounds(read_table(paths.BUNDLED_TRACE, "rounds")).groupby("m")["u_bar"].mean()
share = regime.share_by_width(fits, natural_u)
machine = describe(read_meta(next(iter(designed.values())))["cpu"])
print(textwrap.fill(f"designed experiments at expert widths {list(designed)}; measured on {machine}, one thread", 76))

# %% [markdown]
# ## The per-expert cost, by experiment
#
# {numref}`fig-regimes-designed-alpha` gives $\alpha(m)$ for every expert width (the dashed line: the
# paper's regression $\alpha$ on an A100, for scale only, since its 48 layers and 9.4 MB experts differ
# from ours). At $m = 1$ every pass touches exactly top-$k$ experts, so $\alpha(1)$ is not identified.

# %% tags=["hide-input"]
page.figure(figures.designed_alpha_chart(fits), "fig-regimes-designed-alpha",
            f"α(m) from the designed experiment (planted routing, real vLLM engine, float32, on {machine}), per "
            "expert width, with 95% HC3 intervals; log scale. Look for α growing in proportion to the width "
            "(streaming) and staying flat in m. Data: measured designed-experiment traces `designed-w*`.")

# %% [markdown]
# {numref}`tbl-regimes-widths` pools $\alpha(m)$ over $m \ge 5$ and gives the share of a pass that the
# expert term explains at the target's **own** routing, $\alpha(m)\,\bar U(m) / (\beta_0(m) + \alpha(m)\,\bar U(m))$,
# with $\bar U(m)$ the mean of the trained pair's rounds (the twin routes exactly as its source). The
# paper's A100 puts this share at about one half to three quarters for $m \ge 5$; the twin's width was
# chosen from this table.

# %% tags=["hide-input"]
page.table(views.width_table(fits, share), "tbl-regimes-widths",
           "Per expert width: α pooled over m ≥ 5 (inverse-variance mean, 95% interval), the mean pass time at "
           "m = 1, and the expert share of a pass at the target's own Ū. Data: measured designed-experiment "
           "traces `designed-w*`.")

# %% tags=["hide-input"]
page.figure(figures.expert_share_chart(share), "fig-regimes-share",
            "Share of a verification pass explained by the expert term at the target's own Ū, by expert width "
            "(log₂ axis), one line per m; the band is one half to three quarters. Data: measured "
            "designed-experiment traces `designed-w*`, Ū from `measured-eagle3`.")

# %% [markdown]
# A dense fallback in the MoE kernel, one that read every expert whatever the routing, would show a
# flat $T_T$ in $\bar U$ at fixed $m$: the intervals above exclude zero at every width, so vLLM's CPU
# MoE path reads only the routed experts.
#
# ## The two targets, measured
#
# Both targets were traced with the same harness, prompts and sweep ({ref}`sec-tracing`; the twin's
# trace adds twelve long-context prompts of about 1,400 tokens, spread among the others, so that the context slope $c$ is
# identified). {numref}`tbl-regimes-targets` sets their pass times side by side.

# %% tags=["hide-input"]
targets = {"bundled": paths.BUNDLED_TRACE, "twin": paths.TWIN_TRACE}
targets = {k: v for k, v in targets.items() if (v / "rounds.parquet").exists()}
page.table(views.targets_by_m(targets), "tbl-regimes-targets",
           "Mean target time T_T and mean Ū by m over the decode rounds of each measured trace: the bundled "
           "(cache-resident) target and its memory-bound twin. The two were measured on different days: "
           "compare shapes across targets, absolute times only within one. Data: measured traces "
           "`measured-eagle3` and `twin-eagle3`.")

# %% [markdown]
# ## The context slope: flat on the paper's GPU, growing with $m$ on a CPU
#
# The paper's model prices context with one coefficient $c$ per context token, and its per-$K$ fits
# agree to within 0.9% (1.098–1.107 × 10⁻³ ms/token). The only work of a pass that grows with the
# context is attention. On a GPU a verification pass of a few rows is bound by reading the KV cache,
# which its $m$ query rows share, so $c$ does not depend on $m$. On the EPYC the KV cache of even
# the longest context fits in cache, and the attention work itself (every query row against every
# key, $m \cdot L$ products) is what grows: the slope on $L$ of a pass of $m$ rows should then be
# $c(m) = c_0 + c_1 m$ (inferred here from the rounds; {ref}`sec-regimes-context-design` plants the context
# length to measure it by design, and names the attention kernel that ran).
# {numref}`fig-regimes-context-slope` and {numref}`tbl-regimes-context-slope` test both descriptions on
# the per-$K$ fits of $T_T = \beta_0 + \alpha\,\bar U + c\,L$ (the robustness section's "c across the
# per-K fits"). On the twin, whose long-context prompts reach about 1,500 tokens, $c$ is well
# determined at every $K$. A constant is rejected, and the line in $m$ explains most of the spread. On
# the bundled trace, whose contexts stay under 200 tokens, the per-$K$ estimates are mostly noise.
# The paper's criterion of one $c$ for every $K$ therefore cannot hold on the EPYC, whatever the
# trace. What a trace can show is $c(m)$, and a user reading $c$ off a CPU trace should read it at the $m$
# they will run.

# %% tags=["hide-input"]
labels = {"bundled": "bundled (cache-resident)", "twin": "twin (memory-bound)"}
slopes = {labels[name]: regime.context_slope(read_table(folder, "rounds")) for name, folder in targets.items()}
page.figure(figures.context_slope_chart({n: s.by_k for n, s in slopes.items()}), "fig-regimes-context-slope",
            "Context slope c of the per-K fits T_T ~ Ū + L (generation-clustered 95% intervals) against m = K + 1, "
            "per target, with each target's weighted line in m (dashed); gray rule: the paper's c, the same at every K on "
            "an A100. Look for a flat row of points (one c, the paper's model) or a rising one (attention per "
            "query row). Data: measured traces `measured-eagle3` and `twin-eagle3`.")

# %% tags=["hide-input"]
page.table(views.context_slope_table(slopes), "tbl-regimes-context-slope",
           "Context slope across K (10⁻³ ms per context token): the per-K range and its max/min ratio, the "
           "p-value of a constant c (inverse-variance homogeneity test), the weighted line c = c0 + c1·m with "
           "95% intervals (widened by the residual dispersion when above 1), the p-value of the line's residuals "
           "and the per-K spread left about the line. Data: measured traces `measured-eagle3` and `twin-eagle3`.")

# %% [markdown]
# ## The experiment against the regression
#
# The regression's $\alpha(m)$ (Eq. 4 on a target's own rounds, {ref}`sec-final-model`) attributes to
# $\bar U$ whatever moves with it; the designed experiment on the same target does not.
# {numref}`tbl-regimes-causal-twin` and {numref}`tbl-regimes-causal-bundled` set the two side by side.
# On the twin the two agree to about 10% at every $m$ and to 1% pooled over $m \ge 5$ (0.83 ms against 0.84),
# although at most $m$ the experiment's estimate lies just outside the regression's interval: the two were
# measured 45 minutes apart, and the experiment draws $\bar U$ uniformly over its whole range while the
# text's own routing stays near its mean. On the trained target the regression's $\alpha$ is a multiple of
# the experiment's: there the expert term is small, and whatever else grows with $\bar U$ across rounds
# (and a different day's machine state: the bundled trace was recorded on 2026-11-29 with other processes
# running, the experiment on 2026-12-04 alone) is read as expert cost.

# %% tags=["hide-input"]
for name, folder, width in (("twin", paths.TWIN_TRACE, max(designed)), ("bundled", paths.BUNDLED_TRACE, min(designed))):
    if not (folder / "rounds.parquet").exists():
        continue
    observed = regime.regression_alpha(read_table(folder, "rounds"))
    page.table(views.experiment_vs_regression(fits[fits["width"] == width], observed),
               f"tbl-regimes-causal-{name}",
               f"α(m) of the {'memory-bound twin' if name == 'twin' else 'trained (cache-resident) target'} "
               f"(expert width {width}): the designed experiment (planted routing, HC3) beside the observational "
               f"regression (Eq. 4, generation-clustered), 95% intervals. Data: measured traces "
               f"`designed-w{width}` and `{folder.name}`.")

# %% [markdown]
# (sec-regimes-machines)=
# ## The same twin on three CPUs
#
# The paper names cross-hardware transfer as untested: "the model requires recalibration when the
# environment changes". Machines of this project's kind differ, so the twin's sweep was measured with the
# same command, prompts and models on three of them: **AMD EPYC A**, which made the other twin traces of
# this book (`twin-eagle3`; its kernel flags include AVX-VNNI), **AMD EPYC B**, another EPYC of the same
# name without AVX-VNNI and with a 32 MB L3, which also ran the context experiment below
# (`twin-eagle3-epyc-b`), and an **Intel Xeon with AMX** and a 300 MB L3 (`twin-eagle3-xeon-amx`). Each
# trace's README gives its provenance; all run vLLM's CPU build in float32 with one thread, nothing else
# heavy running. {numref}`fig-regimes-machines` and {numref}`tbl-regimes-machines` set the cost physics side
# by side; {numref}`tbl-regimes-transfer` asks what EPYC A's cost model says about the others' rounds.

# %% tags=["hide-input"]
machine_traces = {label: path for label, path in paths.TWIN_TRACES_BY_CPU.items() if (path / "rounds.parquet").exists()}
machines = regime.compare_machines(machine_traces, n_boot=19 if smoke else 199, seed=seed)
reference = next(iter(machines.cpus))
for label, cpu in machines.cpus.items():
    print(textwrap.fill(f"{label} ({machine_traces[label].name}): {describe(cpu)}", 76, subsequent_indent="  "))
for label, (equal, matched) in machines.outputs.items():
    print(f"{label}: greedy outputs equal to {reference}'s in {equal} of {matched} generations")
for note in machines.notes:
    print(textwrap.fill(note, 76, subsequent_indent="  "))

# %% tags=["hide-input"]
page.figure(figures.machines_chart(machines.passes, machines.shares), "fig-regimes-machines",
            "The memory-bound twin's K sweep on each CPU: mean target time T_T by m (left) and the regression's α(m) "
            "(right), generation-clustered 95% intervals. Look for one shape at several speeds. Data: measured traces "
            + ", ".join(f"`{p.name}` ({label})" for label, p in machine_traces.items()) + ", the same command.")

# %% tags=["hide-input"]
page.table(views.machines_table(machines), "tbl-regimes-machines",
           "The same analysis on each CPU: pass times, the per-expert cost and its share of a pass, the context line, "
           "the cost model's fit, and the Oracle (greedy references; 95% intervals over cost-model refits on resampled "
           "generations). Caches are shown where the trace recorded them (the Xeon's were added from its README). "
           "Data: measured traces " + ", ".join(f"`{p.name}`" for p in machine_traces.values()) + ".")

# %% [markdown]
# The work is the same on every CPU (the lines above compare the greedy outputs token by token), the shape
# of its cost is similar and the speed is not. On every CPU the expert term explains about half of a pass
# or more at $m \ge 5$, so the twin is memory-bound on all three, even under the Xeon's 300 MB cache (its
# 805 MB of experts still stream). But what one more unique expert costs differs about twofold between
# machines, and two EPYCs of the same name differ nearly as much as an EPYC and a Xeon: the name of a CPU
# says little about the memory system a virtual machine gets. The per-row context slope $c_1$ is of one
# size on all three, with overlapping intervals (the next part says why); the Oracle's best static K moves
# with the machine, while its gain over that K stays within a few per cent.
#
# **What transfers without recalibration.** {numref}`tbl-regimes-transfer` prices each other CPU's rounds
# with EPYC A's fitted cost model. Its error is first one factor, the machines' speed ratio, which no model
# fitted on one CPU can know; after that one scale a shape error remains that moves with $m$. The
# Oracle's decisions carry over better than its milliseconds, as the lines below show: the per-round
# policy solved with EPYC A's costs and replayed at another CPU's keeps most of that CPU's Oracle gain over
# its own best static K, while EPYC A's best static K can be a poor static choice elsewhere. A per-state
# policy adapts to what each round offers; a single static K encodes one machine's price ratio.

# %% tags=["hide-input"]
page.table(views.transfer_table(machines), "tbl-regimes-transfer",
           f"{reference}'s cost model (Eq. 4 fitted on `{machine_traces[reference].name}`) pricing the other CPUs' "
           "decode rounds, by m: predicted / measured mean T_T (generation-clustered 95% interval) and the ratio left "
           "after one scale for every m. Data: measured traces " + ", ".join(f"`{p.name}`" for p in machine_traces.values())
           + ".")

# %% tags=["hide-input"]
for label, d in machines.decisions.items():
    print(f"{label}, the Oracle's policy solved with {reference}'s costs:\n"
          f"  keeps {d['share_of_gain']:.1%} [{d['share_lo']:.1%}; {d['share_hi']:.1%}] of this CPU's Oracle gain "
          f"over its best static K = {d['best_static_k']}\n"
          f"  ({reference}'s best static K = {d['transferred_static_k']} is {d['static_loss']:.1%} slower here)")

# %% [markdown]
# (sec-regimes-context-design)=
# ## The context cost by design
#
# The per-$K$ fits read $c$ off whatever contexts the prompts happened to reach. As for $\alpha$, a
# designed experiment sets the regressor itself: the twin at $K = 0, 1, 3, 5, 7, 10$ over prompts cut to
# planted lengths (the first $L$ tokens of each of the twelve long-context prompts, $L$ = 64, 448, 832,
# 1,216), with planted routing so that $\bar U$ is drawn pass by pass apart from $L$
# (`scripts/make_context_experiment.sh`, trace `designed-context-w1024`, on AMD EPYC B). Each prompt is a
# block whose four lengths run back to back in a random order, and each block gets its own intercept: a
# first run without blocks showed the machine's pass time drifting by up to 10 ms over a few seconds,
# which a random order alone leaves in the estimate. At each fixed $m$ the slope of $T_T$ on $L$ within
# blocks is then $c(m)$ by design; the engine records which attention path it ran.

# %% tags=["hide-input"]
context_trace = read_trace(paths.CONTEXT_TRACE) if (paths.CONTEXT_TRACE / "rounds.parquet").exists() else None
if context_trace is None:
    page.cannot_show("the context cost by design", "the experiment's trace `designed-context-w1024` is not in this "
                     "checkout (scripts/make_context_experiment.sh makes it)")
else:
    designed_c = regime.designed_context(context_trace.rounds)
    designed_line = regime.slope_line(designed_c)
    designed_c["c_line"] = designed_line["c0"] + designed_line["c1"] * designed_c["m"]
    print(textwrap.fill(context_trace.source_label, 76))
    print(f"attention path(s) vLLM ran: {', '.join(context_trace.meta['engine'].get('attention') or ['not recorded'])}")

# %% tags=["hide-input"]
design_label = "AMD EPYC B, designed (planted L)"
if context_trace is not None:
    page.figure(figures.context_slope_chart({design_label: designed_c,
                                             **{f"{label}, twin rounds": s.by_k for label, s in machines.slopes.items() if s is not None}},
                                            legend="estimate"), "fig-regimes-context-design",
                "Context slope c(m): the designed experiment (planted context lengths and routing, block intercepts, "
                "generation-clustered 95% intervals) beside the per-K fits of the twin's rounds on each CPU, each with its "
                "weighted line in m (dashed). Look for lines that agree. Data: measured traces `designed-context-w1024` "
                "and " + ", ".join(f"`{p.name}`" for p in machine_traces.values()) + ".")

# %% tags=["hide-input"]
if context_trace is not None:
    page.table(views.context_line_table({design_label: designed_line,
                                         **{f"{label}, twin rounds": s.line for label, s in machines.slopes.items() if s is not None}}),
               "tbl-regimes-context-design",
               "The line c(m) = c0 + c1·m (10⁻³ ms per context token, 95% intervals) from the designed experiment and "
               "from each CPU's twin rounds. Data: measured traces `designed-context-w1024` and "
               + ", ".join(f"`{p.name}`" for p in machine_traces.values()) + ".")

# %% [markdown]
# **Which attention path ran, and why the CPUs share a per-row slope.** vLLM's CPU attention chooses an
# instruction-set path per engine: in vLLM 0.32 (`_get_attn_isa` in its `cpu_attn.py`) it takes the AMX
# path only for **bfloat16** models with a block size that is a multiple of 32, and otherwise the `vec`
# path of AVX-512. Every trace here runs float32, so the Xeon with AMX ran the same `vec` kernel as the
# EPYCs (the engine's record on EPYC B above says `CPU_ATTN (isa vec)`; the older traces predate that
# record, and for them the choice is read from vLLM's source). The wider AMX tile was never in play: with
# one kernel on every CPU, the per-row work $c_1$ (each of the $m$ query rows against every key) comes out
# alike, while the per-token intercept $c_0$ and the per-expert cost $\alpha$ follow each machine. The
# designed experiment agrees with the rounds' lines; its per-row slope is the least precise of its
# estimates, so it confirms the size of $c(m)$ rather than sharpening $c_1$. A bfloat16 trace on the Xeon
# would take the AMX path and is the experiment that would show the tile.

# %% [markdown]
# ## Every section in both regimes
#
# The book's sections run on one trace each build. When it is one of the two measured targets, every
# key-results box, and the gathered table of the introduction ({numref}`tbl-intro-key-results`), sets
# beside each number the same quantity on the other target, from a build of the book on it
# (`data/regime/contrast`, written by `scripts/make_contrast.sh`).

# %% [markdown]
# ## Versions

# %% tags=["remove-input"]

for folder in [*designed.values(), *targets.values(), *machine_traces.values(), paths.CONTEXT_TRACE]:
    if (folder / "meta.json").exists():
        bs.version_report(read_trace(folder))
