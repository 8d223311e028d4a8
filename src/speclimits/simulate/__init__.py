"""The simulator: a seeded digital twin of the paper's setting that writes traces with a planted
truth (:mod:`~speclimits.simulate.twin`), and its command, ``speclimits simulate``
(:mod:`~speclimits.simulate.cli`)."""

from speclimits.simulate.twin import (PRESETS, SimConfig, config_from_meta, expected_new_experts, make_meta,
                                      paper_cost_model, preset, simulate)

__all__ = ["PRESETS", "SimConfig", "config_from_meta", "expected_new_experts", "make_meta", "paper_cost_model",
           "preset", "simulate"]
