"""The two-level percentile bootstrap over training seeds and source documents: the interval planlm reported
before ``seeded_paired_interval``, kept here so that the coverage simulations can compare the two."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from planlm.errors import PlanlmError
from planlm.evaluate.bootstrap import _check, _paired_summary, _resample_counts, perplexity


def seeded_paired_bootstrap(nll_a: np.ndarray, nll_b: np.ndarray, token_counts: np.ndarray,
                            num_samples: int = 1000, confidence: float = 0.95, seed: int = 0,
                            clusters: Optional[Sequence] = None) -> dict[str, float]:
    """Paired two-level percentile bootstrap of ppl(B) - ppl(A) over training seeds and source documents.

    nll_a, nll_b (S, N_art): each seed's per-article NLL sums; token_counts (N_art,); clusters (N_art,) each
    article's source document (None: articles resampled alone). The statistic is the difference of the
    perplexities of the seed-mean NLL; each resample draws S seeds and the documents with replacement (the
    same document draw for every drawn seed). Needs S >= 2. At 2-3 seeds it undercovers (it cannot reach past
    the per-seed range): ``planlm.evaluate.bootstrap.seeded_paired_interval`` is the interval the product reports."""
    _check(num_samples, confidence)
    nll_a, nll_b = np.asarray(nll_a, np.float64), np.asarray(nll_b, np.float64)
    token_counts = np.asarray(token_counts, np.float64)
    num_seeds = nll_a.shape[0]
    if num_seeds < 2:
        raise PlanlmError("a seed-noise interval needs >= 2 training seeds")
    seed_counts = _resample_counts(num_seeds, num_samples, seed + 1)  # (R, S)
    counts = _resample_counts(len(token_counts), num_samples, seed, clusters)  # (R, N_art)
    tokens = counts @ token_counts  # (R,)
    keep = tokens > 0

    def resampled_ppl(nll: np.ndarray) -> np.ndarray:
        per_seed = counts[keep] @ nll.T  # (R', S) each drawn article set's NLL under each seed
        return np.exp((seed_counts[keep] * per_seed).sum(1) / num_seeds / tokens[keep])  # (R',)

    observed = perplexity(nll_b.mean(0), token_counts) - perplexity(nll_a.mean(0), token_counts)
    return _paired_summary(resampled_ppl(nll_b) - resampled_ppl(nll_a), observed, confidence)
