"""The simulator: a seeded simulated MoE of the paper's setting that writes SIMULATED traces with a
planted truth (:mod:`~speclimits.simulate.moe`), and its command, ``speclimits simulate``
(:mod:`~speclimits.simulate.cli`)."""

from speclimits.simulate.moe import (PRESETS, BatchSim, SimConfig, config_from_meta, expected_new_experts,
                                     make_batch_meta, make_meta, paper_cost_model, preset, simulate, simulate_batch)

__all__ = ["PRESETS", "BatchSim", "SimConfig", "config_from_meta", "expected_new_experts", "make_batch_meta",
           "make_meta", "paper_cost_model", "preset", "simulate", "simulate_batch"]
