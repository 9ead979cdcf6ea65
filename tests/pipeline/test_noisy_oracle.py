"""experiments/noisy_oracle.py: plans with a known information, read through the plan-kind registry."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.noisy_oracle import NoisyOracle, information, noisy_actions, training_unigram
from planlm.data.artifacts import PreparedDataset
from planlm.plans.config import PlanConfig
from planlm.plans.registry import KINDS, plan_source, register_plan_kind

pytestmark = pytest.mark.lab  # a research script of experiments/: `pytest -m lab`


def test_information_rises_with_keep_from_zero_to_the_unigram_entropy(synthetic_random):
    prepared = PreparedDataset(synthetic_random)
    levels = [information(prepared, keep) for keep in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert abs(levels[0]["information"]) < 0.05  # a unigram draw says nothing (up to the split's own frequencies)
    assert all(a["information"] < b["information"] for a, b in zip(levels, levels[1:]))
    assert levels[-1]["nll"] == pytest.approx(0.0) and levels[-1]["agreement"] == 1.0
    assert levels[-1]["information"] == pytest.approx(levels[-1]["unigram_nll"])
    for level in levels[1:-1]:  # kept, or drawn equal to the truth by chance
        assert level["keep"] - 0.1 < level["agreement"] < level["keep"] + 0.2


def test_the_noisy_plans_are_drawn_once_per_split_and_read_as_a_plan_kind(synthetic_random):
    prepared = PreparedDataset(synthetic_random)
    split = prepared["validation"]
    first = noisy_actions(split, training_unigram(prepared), 0.5, seed=0)
    assert np.array_equal(first, noisy_actions(split, training_unigram(prepared), 0.5, seed=0))
    assert not np.array_equal(first, noisy_actions(split, training_unigram(prepared), 0.5, seed=1))
    kind = register_plan_kind(NoisyOracle(0.5)).name
    try:
        plans = PlanConfig(kind=kind, num_paths=1, horizon=1).resolve()
        sentences = np.arange(split.num_sentences)
        made = plan_source(plans, prepared, split, sentences=sentences)(sentences)
        assert np.array_equal(made.action_paths[:, 0, 0].numpy(), first) and made.path_mask.all()
    finally:
        KINDS.pop(kind)
