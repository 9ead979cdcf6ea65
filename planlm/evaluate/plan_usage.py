"""Plan usage: how much an LM reads its plans.

The same LM scores the same windows twice: with its own plans, and with the plans shuffled across the
sentences of the split (sentence s gets the plan of sentence perm[s], a fixed permutation drawn from a
fixed seed, so every condition and every rerun shuffles alike). The plans keep their distribution and
lose only their alignment with the text, so the loss gained by shuffling is what the plans tell the LM
about *this* text: about 0 for an LM that ignores them (or reads only their average, like the Fixed
baseline), large for one that reads them. ``train-lm`` logs it at every validation
(``val/plan_usage``, nats per token) and ``evaluate`` writes it to metrics.json with a paired
bootstrap interval over articles.
"""

from __future__ import annotations

import numpy as np

from planlm.errors import PlanlmError
from planlm.evaluate.bootstrap import paired_bootstrap
from planlm.evaluate.metrics import PlanUsage

SHUFFLE_SEED = 0


def plan_permutation(num_sentences: int, seed: int = SHUFFLE_SEED) -> np.ndarray:
    """(num_sentences,) the sentence whose plan each sentence gets once the plans are shuffled."""
    return np.random.default_rng(seed).permutation(num_sentences)


def check_has_plans(plans, where: str) -> None:
    """A plan-usage request on a model that reads no plan (a resolved ``PlanConfig``) is a mistake, not a zero."""
    if not plans.has_plans:
        raise PlanlmError(f"{where}: plan usage asked of a model with plans kind none (it reads no plan); "
                          f"set plan_usage: false (or leave it unset) for it")


def plan_usage_metrics(nll_own: np.ndarray, nll_shuffled: np.ndarray, tokens: np.ndarray, num_samples: int = 1000,
                       confidence: float = 0.95, clusters=None) -> PlanUsage:
    """Per-article NLL sums (N_art,) with own and shuffled plans -> the gap in nats per token and in
    perplexity (shuffled - own, positive: the LM reads its plans) with a paired bootstrap interval over the
    articles' source documents ``clusters`` (N_art,)."""
    total = float(np.sum(tokens))
    paired = paired_bootstrap(nll_own, nll_shuffled, tokens, num_samples, confidence, clusters=clusters)
    return PlanUsage(plan_usage_nats=float(np.sum(nll_shuffled) - np.sum(nll_own)) / total,
                     ppl_shuffled_plans=paired["ppl_b"], plan_usage_ppl=paired["diff"],
                     plan_usage_ci_low=paired["ci_low"], plan_usage_ci_high=paired["ci_high"])
