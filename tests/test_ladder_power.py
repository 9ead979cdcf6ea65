"""experiments/ladder_power.py: the slope's power analysis of the LM ladder (docs/ladder.md), on cases with a known
answer. Seconds."""

from __future__ import annotations

import pytest

from experiments.ladder_power import RUNGS, non_embedding, rung_seconds, slope_power

pytestmark = pytest.mark.lab  # a research script of experiments/: `pytest -m lab`

X = [0.0, 0.9, 1.14, 1.8]


def test_a_flat_ladder_is_decided_about_5_percent_of_the_time_and_the_interval_covers():
    flat = slope_power(X, 0.0, seed_sd=0.24, doc_se=0.09, seeds=4, draws=8000)
    assert 0.02 < flat["power"] < 0.08 and 0.93 < flat["coverage"] < 0.98


def test_power_grows_with_the_slope_and_the_seeds():
    assert slope_power(X, -0.4, 0.24, 0.09, 3)["power"] < slope_power(X, -0.4, 0.24, 0.09, 6)["power"]
    assert slope_power(X, -0.8, 0.24, 0.09, 4)["power"] > 0.95


def test_rungs_span_more_than_tenfold_compute_and_cost_more_when_wider():
    assert non_embedding(2, 128) == 396_800  # 2 x (12 d^2 + 13 d) + 2 d
    assert RUNGS[-1].compute / RUNGS[0].compute > 10
    assert rung_seconds(RUNGS[-1], 4)[1] > rung_seconds(RUNGS[1], 4)[1]
