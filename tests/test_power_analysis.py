"""experiments/power_analysis.py: the seed power analysis of the evidence plan (docs/evidence.md), on cases with a
known answer. Seconds."""

from __future__ import annotations

import pytest

import numpy as np

from experiments.power_analysis import _half_width, document_se, power_curve, seeds_needed

pytestmark = pytest.mark.lab  # a research script of experiments/: `pytest -m lab`


def test_a_huge_effect_needs_two_seeds():
    curve = power_curve(effect=-100.0, seed_sd=1.0, doc_se=0.1, seeds=range(2, 6), draws=500)
    assert seeds_needed(curve) == 2
    assert all(row["power"] == 1.0 for row in curve)


def test_a_zero_effect_never_reaches_80_percent():
    curve = power_curve(effect=0.0, seed_sd=1.0, doc_se=0.3, seeds=range(2, 17), draws=2000)
    assert seeds_needed(curve) is None
    assert max(row["power"] for row in curve) < 0.1  # about the 5% false-positive rate


def test_power_grows_with_seeds_and_levels_off_at_the_document_ceiling():
    curve = power_curve(effect=-1.0, seed_sd=0.5, doc_se=0.4, documents=17, seeds=range(2, 17), draws=4000)
    powers = [row["power"] for row in curve]
    assert powers[-1] > powers[0]
    # the shared document error caps the power: P(|effect + e| > t_16 * se), whatever S
    from scipy.stats import norm, t
    ceiling = norm.cdf((1.0 - t.ppf(0.975, 16) * 0.4) / 0.4) + norm.cdf((-1.0 - t.ppf(0.975, 16) * 0.4) / 0.4)
    assert powers[-1] < ceiling + 0.03


def test_document_se_inverts_the_products_half_width():
    per_seed, doc_se, documents = (-1.0, -1.4), 0.3, 17
    seed_var = float(np.var(per_seed, ddof=1)) / 2
    half = _half_width(0.95, seed_var, 2, doc_se ** 2, documents)
    mean = float(np.mean(per_seed))
    assert np.isclose(document_se(per_seed, mean - half, mean + half, documents), doc_se)
