"""Seed power of a paired contrast: how many training seeds its interval needs to exclude 0.

The interval is the one ``planlm.evaluate.bootstrap.seeded_paired_interval`` reports: the mean of S per-seed
differences +- sqrt((t_{S-1} s_seed / sqrt(S))^2 + (t_{G-1} se_doc)^2), s_seed the spread of the per-seed
differences and se_doc the standard error over the G test documents. Every seed scores the same test documents,
so their error is shared: it does not average out over seeds, and it caps the power whatever S is (only more
test documents lift that ceiling).

- ``document_se`` backs se_doc out of a published interval and its per-seed values (inverting the half-width);
- ``power_curve`` simulates the evaluation at each S: S per-seed differences ~ N(effect, seed_sd), one document
  error ~ N(0, doc_se) shared by all of them, and counts how often the interval excludes 0 on either side;
- ``seeds_needed`` reads the smallest S whose power reaches a target (80%).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from planlm.evaluate.bootstrap import CONFIDENCE, _half_widths, t_quantiles, quadrature_half_width

TARGET_POWER = 0.8
SEED_RANGE = tuple(range(2, 17))


def half_width(confidence: float, seed_var: float, num_seeds: int, document_var: float, documents: int) -> float:
    """The interval's half-width with a symmetric document part: t_{S-1}^2 seed_var + t_{G-1}^2 document_var, square
    rooted (the simulation draws normal document errors, where the bootstrap-t's skew correction is 1). seed_var:
    the variance of the seed mean (the per-seed variance over S)."""
    return _half_widths(confidence, seed_var, num_seeds, document_var, documents)[0]


def document_se(per_seed: Sequence[float], low: float, high: float, documents: int, confidence: float = CONFIDENCE,
                documents_only: bool = False) -> float:
    """The document standard error that the half-width turns into the interval [low, high], given its per-seed
    values: document_var = (half^2 - t_{S-1}^2 seed_var) / t_{G-1}^2 (0 where the seed part alone exceeds the
    half-width). ``documents_only`` (or a single seed): a percentile interval over documents, read as
    +- z se."""
    half = (high - low) / 2
    if documents_only or len(per_seed) < 2:
        from scipy.stats import norm

        return half / float(norm.ppf(0.5 + confidence / 2))
    num_seeds = len(per_seed)
    seed_var = float(np.var(per_seed, ddof=1)) / num_seeds
    seed_t, document_t = t_quantiles(confidence, num_seeds, documents)
    return float(np.sqrt(max(half ** 2 - seed_t ** 2 * seed_var, 0.0) / document_t ** 2))


def power_curve(effect: float, seed_sd: float, doc_se: float, documents: int, seeds: Sequence[int] = SEED_RANGE,
                draws: int = 4000, confidence: float = CONFIDENCE, rng_seed: int = 0) -> list[dict]:
    """For each S of ``seeds``: {seeds, half_width (the mean over draws), half_width_at_sd (at the true seed sd),
    power (the share of draws whose interval excludes 0, below or above)}.

    Each draw is one evaluation: S per-seed differences ~ N(effect, seed_sd) plus one document error
    ~ N(0, doc_se) shared by every seed; the interval is their mean +- ``half_width`` with the sample variance of
    the S values over S and doc_se^2 (the bootstrap's estimate, taken as exact). The same draws serve every S
    (common random numbers), so the curve is smooth in S."""
    rng = np.random.default_rng(rng_seed)
    seed_draws = rng.normal(effect, seed_sd, size=(draws, max(seeds)))  # (draws, S_max)
    document_draws = rng.normal(0.0, doc_se, size=draws)  # (draws,) one error for all the seeds of a draw
    rows = []
    for num_seeds in seeds:
        values = seed_draws[:, :num_seeds]
        mean = values.mean(1) + document_draws
        seed_var = values.var(1, ddof=1) / num_seeds
        seed_t, document_t = t_quantiles(confidence, num_seeds, documents)
        half = quadrature_half_width(seed_t, seed_var, document_t, doc_se ** 2)  # half_width, over the draws
        rows.append({"seeds": num_seeds, "half_width": float(half.mean()),
                     "half_width_at_sd": half_width(confidence, seed_sd ** 2 / num_seeds, num_seeds, doc_se ** 2,
                                                    documents),
                     "power": float(np.mean(np.abs(mean) > half))})
    return rows


def seeds_needed(curve: list[dict], target: float = TARGET_POWER) -> Optional[int]:
    """The smallest S of ``curve`` whose power reaches ``target`` (None: none does)."""
    return next((row["seeds"] for row in curve if row["power"] >= target), None)


__all__ = ["half_width", "document_se", "power_curve", "seeds_needed", "TARGET_POWER", "SEED_RANGE"]
