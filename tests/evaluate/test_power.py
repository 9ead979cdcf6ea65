"""The seed power of a paired contrast (``planlm.evaluate.power``) on cases with a known answer: the half-width is
the one ``seeded_paired_interval`` reports, the document error is shared by every seed (so it caps the power
whatever S is), and an interval excludes 0 on either side."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm, t

from planlm.evaluate.bootstrap import seeded_paired_interval
from planlm.evaluate.power import document_se, half_width, power_curve, seeds_needed


def test_the_half_width_is_the_seeded_paired_interval_s():
    """seeded_paired_interval's interval around its mean is the half-width of its seed and document parts (a
    symmetric document distribution: the bootstrap-t's skew adds nothing)."""
    rng = np.random.default_rng(0)
    seeds, documents = 3, 12
    tokens = np.full(documents, 100.0)
    level = rng.normal(3.0, 0.2, documents)
    nll_a = np.stack([level * tokens] * seeds)
    nll_b = nll_a - (0.2 + rng.normal(0, 0.05, (seeds, 1)) + rng.normal(0, 0.05, documents)) * tokens
    result = seeded_paired_interval(nll_a, nll_b, tokens, num_samples=4000, seed=1)
    half = half_width(0.95, result["seed_se"] ** 2, seeds, result["document_se"] ** 2, documents)
    assert min(result["diff"] - result["ci_low"], result["ci_high"] - result["diff"]) == pytest.approx(half,
                                                                                                        rel=1e-6)


def test_document_se_inverts_the_half_width():
    per_seed, doc_se, documents = (-1.0, -1.4), 0.3, 17
    half = half_width(0.95, float(np.var(per_seed, ddof=1)) / 2, 2, doc_se ** 2, documents)
    mean = float(np.mean(per_seed))
    assert document_se(per_seed, mean - half, mean + half, documents) == pytest.approx(doc_se)
    # a seed part wider than the interval leaves no document error; one seed: a percentile interval, +- 1.96 se
    assert document_se((-1.0, -3.0), -2.1, -1.9, documents) == 0.0
    assert document_se((-1.0,), -1.0 - 1.96 * 0.2, -1.0 + 1.96 * 0.2, documents) == pytest.approx(0.2, rel=1e-3)


@pytest.mark.parametrize("effect", [-100.0, 100.0])
def test_a_huge_effect_of_either_sign_needs_two_seeds(effect):
    curve = power_curve(effect=effect, seed_sd=1.0, doc_se=0.1, documents=17, seeds=range(2, 6), draws=500)
    assert seeds_needed(curve) == 2
    assert all(row["power"] == 1.0 for row in curve)


def test_a_zero_effect_is_excluded_at_most_as_often_as_the_level_allows_on_both_sides():
    """At effect 0 the 95% interval excludes 0 in about 3.4% of the evaluations (two t quantiles in quadrature are
    a little conservative): half of that on each side; one side alone would give about 1.7%."""
    curve = power_curve(effect=0.0, seed_sd=1.0, doc_se=0.3, documents=17, seeds=range(2, 17), draws=20000)
    assert seeds_needed(curve) is None
    powers = np.array([row["power"] for row in curve])
    assert powers.max() < 0.05 and powers.mean() > 0.025


def test_the_shared_document_error_caps_the_power_whatever_the_seeds():
    """Seeds average their own noise out, not the test documents' error: at many seeds the power tends to
    P(|effect + e_doc| > t_{G-1} se_doc) with e_doc ~ N(0, se_doc), far below 1."""
    effect, doc_se, documents = -1.0, 0.4, 17
    curve = power_curve(effect=effect, seed_sd=0.5, doc_se=doc_se, documents=documents, seeds=(2, 4, 64),
                        draws=20000)
    quantile = t.ppf(0.975, documents - 1) * doc_se
    ceiling = norm.cdf((-effect - quantile) / doc_se) + norm.cdf((effect - quantile) / doc_se)
    powers = [row["power"] for row in curve]
    assert powers[0] < powers[1] < powers[2]
    assert powers[2] == pytest.approx(ceiling, abs=0.02) and ceiling < 0.7


def test_the_half_widths_shrink_to_the_document_part():
    curve = power_curve(effect=-1.0, seed_sd=0.5, doc_se=0.4, documents=17, seeds=(2, 8, 64), draws=2000)
    document_part = t.ppf(0.975, 16) * 0.4
    assert curve[0]["half_width_at_sd"] > curve[1]["half_width_at_sd"] > curve[2]["half_width_at_sd"]
    assert curve[2]["half_width_at_sd"] == pytest.approx(document_part, rel=0.02)
    assert curve[1]["half_width"] == pytest.approx(curve[1]["half_width_at_sd"], rel=0.1)
