"""The simulator: a seeded digital twin of the paper's setting that writes traces with a planted
truth (:mod:`~speclimits.simulate.twin`), and its command, ``speclimits simulate``
(:mod:`~speclimits.simulate.cli`)."""

from speclimits.simulate.twin import (PRESETS, BatchSim, SimConfig, config_from_meta, expected_new_experts,
                                      make_batch_meta, make_meta, paper_cost_model, preset, simulate, simulate_batch)

__all__ = ["PRESETS", "BatchSim", "SimConfig", "config_from_meta", "expected_new_experts", "make_batch_meta",
           "make_meta", "paper_cost_model", "preset", "simulate", "simulate_batch"]
