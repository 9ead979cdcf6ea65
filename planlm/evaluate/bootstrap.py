"""Bootstrap confidence intervals over source documents, and the ``compare`` command (paired bootstrap).

Perplexity is a ratio estimator, exp(sum of NLL / sum of scored tokens), so the articles are
resampled with replacement and the ratio is recomputed on every resample (not a mean of
per-article perplexities). Two evaluations of the same articles are compared by resampling the
same article indices for both (paired bootstrap): most article-to-article variance cancels.

The unit of resampling is the source document, not the article: a long document is cut into pieces
(``planlm.data.pieces``, ids ``<doc id>#<n>``), and the pieces of one document are correlated (one
author, one topic), so resampling pieces as if independent makes intervals too narrow. Every bootstrap
here takes ``clusters`` (N_art,), the source document of each article (``per_article.csv``'s ``source``
column), and draws documents with all their pieces (a cluster bootstrap); ``None`` treats every article
as its own document. Resamples are drawn as multinomial counts over documents, expanded to their
pieces, (R, N_art) integers, so one resample is one matrix-vector product.

Runs with several training seeds add a second source of noise: the same recipe trained again gives
another model. With 2 or 3 seeds a percentile bootstrap over seeds never reaches past the range of the
per-seed results, so it undercovers.
``seeded_paired_interval`` is the interval ``compare`` and the report show: the mean over seeds of the
per-seed differences, d = mean_s d_s, with half-width sqrt((t_{S-1} * s_seed / sqrt(S))^2 +
(t_{G-1} * se_doc)^2), where s_seed is the standard deviation of the per-seed differences, se_doc the
standard deviation of d over document resamples (one draw shared by every seed: the test documents are the
same for all of them) and G the number of documents: each source of noise with the t quantile of its own
degrees of freedom, added in quadrature. Per-document gains may be skewed (a few documents gain much more
than the rest), and then the symmetric document part undercovers on the side of the skew; so on that side its
t_{G-1} is lengthened by the skew of a bootstrap-t over documents (studentised by the jackknife within each
resample), and the interval is never shorter than the symmetric one. docs/evaluation.md ("Assumptions of the
interval") shows its coverage by simulation, within and beyond the normal model. With one seed, seed noise
cannot be estimated and the interval is over documents alone.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from planlm.errors import PlanlmError
from planlm.evaluate.metrics import PerplexityMetrics
from planlm.jsonio import write_json

PER_ARTICLE = "per_article.csv"
PER_ARTICLE_FIELDS = ("article", "id", "source", "nll_sum", "tokens")
CONFIDENCE = 0.95
"""The level of the intervals every command reports."""
_PIECE_ID = re.compile(r"^(.+)#\d+$")


def source_of(article_id: str) -> str:
    """The source document of an article id: ``<doc id>`` for a piece ``<doc id>#<n>`` (``planlm.data.pieces``),
    else the id itself. Reads per_article.csv files written before they had a ``source`` column."""
    match = _PIECE_ID.match(str(article_id))
    return match.group(1) if match else str(article_id)


def cluster_index(clusters: Sequence) -> np.ndarray:
    """(N,) the document number of each article, numbered in order of first appearance (all distinct: 0..N-1)."""
    _, first, inverse = np.unique(np.asarray(clusters).astype(str), return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    return rank[inverse.reshape(-1)]


def _resample_counts(num_items: int, num_samples: int, seed: int, clusters: Optional[Sequence] = None) -> np.ndarray:
    """(R, N) how often each item is drawn in each of R resamples: N items drawn with replacement, or, with
    ``clusters`` (N,) (each item's document), as many documents as there are, every item as often as its document."""
    rng = np.random.default_rng(seed)
    if clusters is None:
        return rng.multinomial(num_items, np.full(num_items, 1.0 / num_items), size=num_samples)
    index = cluster_index(clusters)
    if len(index) != num_items:
        raise PlanlmError(f"clusters give a document for {len(index)} articles, not {num_items}")
    num_clusters = int(index.max()) + 1 if len(index) else 0
    if num_clusters == 0:
        return np.zeros((num_samples, 0), dtype=np.int64)
    drawn = rng.multinomial(num_clusters, np.full(num_clusters, 1.0 / num_clusters), size=num_samples)  # (R, G)
    return drawn[:, index]  # (R, N) a piece is drawn as often as its document


def _interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(values, [alpha, 1.0 - alpha])
    return float(low), float(high)


def _check(num_samples: int, confidence: float) -> None:
    if num_samples < 1:
        raise PlanlmError(f"--bootstrap_samples must be >= 1 (got {num_samples})")
    if not 0.0 < confidence < 1.0:
        raise PlanlmError(f"confidence must be in (0, 1) (got {confidence})")


def perplexity(nll_sums: np.ndarray, token_counts: np.ndarray) -> float:
    """exp(total NLL / total scored tokens)."""
    return float(np.exp(np.sum(nll_sums) / np.sum(token_counts)))


def bootstrap_perplexity(nll_sums: np.ndarray, token_counts: np.ndarray, num_samples: int = 1000,
                         confidence: float = 0.95, seed: int = 0,
                         clusters: Optional[Sequence] = None) -> dict[str, float]:
    """Perplexity and its percentile bootstrap CI over source documents (ratio estimator).

    nll_sums (N_art,) summed NLL of each article; token_counts (N_art,) scored tokens of each; clusters
    (N_art,) each article's source document (None: every article its own).
    """
    _check(num_samples, confidence)
    nll_sums = np.asarray(nll_sums, dtype=np.float64)
    token_counts = np.asarray(token_counts, dtype=np.float64)
    if len(nll_sums) == 0 or token_counts.sum() == 0:
        raise PlanlmError("no scored tokens: the evaluation split (or --max_articles) selects no article with >= 2 tokens")
    counts = _resample_counts(len(nll_sums), num_samples, seed, clusters)  # (R, N_art)
    with np.errstate(invalid="ignore", divide="ignore"):
        ppl = np.exp((counts @ nll_sums) / (counts @ token_counts))  # (R,)
    ppl = ppl[np.isfinite(ppl)]  # a resample of only token-less articles has no ratio
    low, high = _interval(ppl, confidence)
    return {"ppl": perplexity(nll_sums, token_counts), "ci_low": low, "ci_high": high,
            "confidence": confidence, "bootstrap_samples": num_samples}


def bootstrap_mean(values: np.ndarray, num_samples: int = 1000, confidence: float = 0.95,
                   seed: int = 0, clusters: Optional[Sequence] = None) -> dict[str, float]:
    """Mean of ``values`` (N,) with a percentile bootstrap CI that resamples their source documents ``clusters``
    (N,) with all their items (None: every item its own document)."""
    _check(num_samples, confidence)
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        raise PlanlmError("nothing to average: no evaluated item")
    counts = _resample_counts(len(values), num_samples, seed, clusters)
    means = counts @ values / counts.sum(axis=1)  # a resample of documents holds as many items as they have
    low, high = _interval(means, confidence)
    return {"mean": float(values.mean()), "ci_low": low, "ci_high": high, "confidence": confidence,
            "bootstrap_samples": num_samples}


def paired_bootstrap(nll_a: np.ndarray, nll_b: np.ndarray, token_counts: np.ndarray, num_samples: int = 1000,
                     confidence: float = 0.95, seed: int = 0, clusters: Optional[Sequence] = None) -> dict[str, float]:
    """Paired bootstrap of ppl(B) - ppl(A) over the same articles, resampling their source documents
    ``clusters`` (N_art,) with all their pieces (None: every article its own document); negative: B is better.

    ``p_value`` is the two-sided fraction of resamples whose difference has the other sign than
    the observed one (doubled, capped at 1): a bootstrap p-value-ish number, not an exact test.
    """
    _check(num_samples, confidence)
    nll_a, nll_b = np.asarray(nll_a, np.float64), np.asarray(nll_b, np.float64)
    token_counts = np.asarray(token_counts, np.float64)
    counts = _resample_counts(len(token_counts), num_samples, seed, clusters)  # (R, N_art)
    tokens = counts @ token_counts  # (R,)
    keep = tokens > 0
    ppl_a = np.exp(counts[keep] @ nll_a / tokens[keep])
    ppl_b = np.exp(counts[keep] @ nll_b / tokens[keep])
    observed = perplexity(nll_b, token_counts) - perplexity(nll_a, token_counts)
    return {"ppl_a": perplexity(nll_a, token_counts), "ppl_b": perplexity(nll_b, token_counts),
            **_paired_summary(ppl_b - ppl_a, observed, confidence)}


def _paired_summary(diff: np.ndarray, observed: float, confidence: float) -> dict[str, float]:
    """The interval, the p-value-ish number and the share of resamples where B is better, of the resampled
    differences ``diff`` (R,) around the ``observed`` one."""
    low, high = _interval(diff, confidence)
    if observed == 0:
        p_value = 1.0
    else:
        p_value = min(1.0, 2.0 * float(np.mean(np.sign(diff) != np.sign(observed))))
    return {"diff": observed, "ci_low": low, "ci_high": high, "p_value": p_value,
            "fraction_b_better": float(np.mean(diff < 0)), "confidence": confidence, "bootstrap_samples": len(diff)}


def _document_resamples(nlls: list[np.ndarray], token_counts: np.ndarray, num_samples: int, seed: int,
                        clusters: Optional[Sequence], counts: Optional[np.ndarray] = None
                        ) -> tuple[np.ndarray, np.ndarray, int]:
    """Each condition's per-seed perplexity, observed (C, S) and on every document resample (C, R, S) (one draw
    shared by all conditions and seeds), and the number of documents. nlls: C arrays (S, N_art); ``counts``
    (R, N_art): the draw of ``_resample_counts`` when the caller already made it (its resamples without a scored
    token are left out here too)."""
    if counts is None:
        counts = _resample_counts(len(token_counts), num_samples, seed, clusters)  # (R, N_art)
    tokens = counts @ token_counts  # (R,)
    keep = tokens > 0
    observed = np.stack([np.exp(nll.sum(1) / token_counts.sum()) for nll in nlls])  # (C, S)
    resampled = np.stack([np.exp(counts[keep] @ nll.T / tokens[keep, None]) for nll in nlls])  # (C, R', S)
    documents = len(token_counts) if clusters is None else int(cluster_index(clusters).max()) + 1
    return observed, resampled, documents


def _seed_and_document_covariance(per_seed: np.ndarray, resampled: np.ndarray, documents: int
                                  ) -> tuple[np.ndarray, np.ndarray]:
    """Covariances (k, k) of the seed mean of k statistics: over seeds, of per_seed (S, k) divided by S (zero with
    one seed), and over document resamples, of the seed mean of resampled (R, S, k), times G / (G - 1) (the
    bootstrap's variance of a mean over G documents is (G - 1) / G of the unbiased one)."""
    num_seeds, k = per_seed.shape
    seed_cov = np.cov(per_seed, rowvar=False, ddof=1).reshape(k, k) / num_seeds if num_seeds > 1 else np.zeros((k, k))
    document_cov = np.cov(resampled.mean(1), rowvar=False, ddof=1).reshape(k, k) * documents / max(documents - 1, 1)
    return seed_cov, document_cov


def t_quantiles(confidence: float, num_seeds: int, documents: int) -> tuple[float, float]:
    """Two-sided t quantiles at ``confidence`` on S - 1 (the seeds) and G - 1 (the documents) degrees of freedom
    (``stdtrit`` is what ``scipy.stats.t.ppf`` computes, without its argument checks: ``_p_value`` calls it often)."""
    from scipy.special import stdtrit

    level = 0.5 + confidence / 2
    return (float(stdtrit(num_seeds - 1, level)) if num_seeds > 1 else 0.0,
            float(stdtrit(documents - 1, level)) if documents > 1 else 0.0)


def _half_widths(confidence: float, seed_var: float, num_seeds: int, document_var: float, documents: int,
                 studentized: Optional[np.ndarray] = None) -> tuple[float, float]:
    """The half-widths below and above the estimate: sqrt((t_{S-1} * seed_se)^2 + (q * document_se)^2), the seed
    part at the t quantile of S - 1 degrees of freedom, the document part at q = t_{G-1} * max(1, r), r the skew of
    the bootstrap-t distribution on that side: its quantile on that side over its half-range, (q_hi - q_lo) / 2.
    So the document part is the normal-theory t_{G-1} on the short side and lengthened by the skew on the long side
    (never shortened: the bootstrap-t's own scale is noisy and wide at a few documents; its shape is what it adds).
    ``studentized`` (R',): the sorted bootstrap-t statistics of the document resamples (``_studentized``); None or
    empty: t_{G-1} on both sides (the normal-theory interval)."""
    seed_t, document_t = t_quantiles(confidence, num_seeds, documents)
    below = above = document_t
    if studentized is not None and len(studentized) and documents > 1:
        low, high = _sorted_quantiles(studentized, (0.5 - confidence / 2, 0.5 + confidence / 2))
        spread = (high - low) / 2
        if spread > 0:  # the bootstrap-t interval is d - q * se: its upper quantile sets the part below d
            below, above = document_t * max(1.0, high / spread), document_t * max(1.0, -low / spread)
    return (float(quadrature_half_width(seed_t, seed_var, below, document_var)),
            float(quadrature_half_width(seed_t, seed_var, above, document_var)))


def quadrature_half_width(seed_t, seed_var, document_t, document_var):
    """sqrt((seed_t * seed_se)^2 + (document_t * document_se)^2): the seeds' and the documents' parts of a half-width,
    each at its own t quantile, added in quadrature (the interval of ``seeded_paired_interval``, of
    ``slope_half_width`` and of the power simulations of ``planlm.evaluate.power``). Arrays broadcast."""
    return np.sqrt(seed_t ** 2 * seed_var + document_t ** 2 * document_var)


def slope_half_width(weights: np.ndarray, seed_vars: np.ndarray, num_seeds: Sequence[int], document_var,
                     documents: int, confidence: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The half-width of the interval of a least-squares slope through several runs' seed means (slope = sum_r w_r y_r,
    ``weights`` (runs,) the w_r): sqrt(t_df^2 var_seed + t_{G-1}^2 var_doc). var_seed = sum_r w_r^2 var_r, var_r the
    variance of run r's seed mean (its seeds' variance over their number S_r); df its Welch-Satterthwaite degrees of
    freedom, var_seed^2 / sum_r (w_r^2 var_r)^2 / (S_r - 1), over the runs of two or more seeds; var_doc the slope's
    variance over the G test documents. ``seed_vars`` (..., runs) and ``document_var`` (...) broadcast: one slope,
    or many simulated ladders at once. Returns (half-width, var_seed, df) over the leading axes; where no run has seed
    noise, df is NaN and the interval is over documents alone."""
    from scipy.special import stdtrit

    num_seeds = np.asarray(num_seeds)
    terms = np.asarray(weights, np.float64) ** 2 * np.asarray(seed_vars, np.float64)  # (..., runs)
    seed_var = terms.sum(-1)
    denominator = np.where(num_seeds > 1, terms ** 2 / np.maximum(num_seeds - 1, 1), 0.0).sum(-1)
    noisy = (seed_var > 0) & (denominator > 0)
    dof = np.where(noisy, seed_var ** 2 / np.where(noisy, denominator, 1.0), np.nan)
    seed_t = np.where(noisy, stdtrit(np.where(noisy, dof, 1.0), 0.5 + confidence / 2), 0.0)
    document_t = t_quantiles(confidence, 2, documents)[1]
    return quadrature_half_width(seed_t, seed_var, document_t, document_var), seed_var, dof


def _sorted_quantiles(values: np.ndarray, levels: Sequence[float]) -> list[float]:
    """Quantiles of the sorted ``values`` (R,) at ``levels``, interpolated linearly (``np.quantile``'s default
    method, without sorting again: ``_p_value`` asks for many)."""
    out = []
    for level in levels:
        position = (len(values) - 1) * level
        below = int(np.floor(position))
        above = min(below + 1, len(values) - 1)
        out.append(float(values[below] + (position - below) * (values[above] - values[below])))
    return out


def _document_index(num_articles: int, clusters: Optional[Sequence]) -> tuple[np.ndarray, int]:
    """(N_art,) the document of each article and the number of documents G (None: every article its own)."""
    index = np.arange(num_articles) if clusters is None else cluster_index(clusters)
    return index, int(index.max()) + 1 if len(index) else 0


def _drawn_documents(counts: np.ndarray, index: np.ndarray, documents: int) -> np.ndarray:
    """(R, G) how often each document is drawn, from the article counts (R, N_art) of ``_resample_counts``."""
    _, first = np.unique(index, return_index=True)  # an article of each document 0 .. G - 1: all drawn alike
    return counts[:, first]


def _studentized(resampled: np.ndarray, observed: float, jackknife: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """The bootstrap-t statistics (resampled - observed) / se* of the document resamples, sorted, se* the jackknife
    standard error within each resample: its G drawn copies of documents left out one at a time.

    resampled (R,) the statistic on each resample; jackknife (R, G) it with one drawn copy of document g left out
    (read only where g is drawn); drawn (R, G) how often each document is drawn. A resample whose se* is 0 or not
    finite (a single document drawn G times) has no such statistic and is left out."""
    documents = drawn.shape[1]
    with np.errstate(invalid="ignore", over="ignore"):
        jackknife = np.where(drawn > 0, jackknife, 0.0)
        centre = (drawn * jackknife).sum(1) / documents  # (R,)
        variance = (documents - 1) / documents * (drawn * (jackknife - centre[:, None]) ** 2).sum(1)
        se = np.sqrt(variance)
        keep = np.isfinite(se) & (se > 0) & np.isfinite(resampled)
        return np.sort((resampled[keep] - observed) / se[keep])


def _paired_jackknife(nll_a: np.ndarray, nll_b: np.ndarray, token_counts: np.ndarray, counts: np.ndarray,
                      index: np.ndarray, documents: int) -> np.ndarray:
    """(R, G) the seed mean of ppl(B_s) - ppl(A_s) on each resample (counts (R, N_art)) with one drawn copy of
    document g left out: the resample's sums less that document's. Blocks of resamples keep it to a few MB."""
    def document_sums(values: np.ndarray) -> np.ndarray:  # (S, N_art) -> (G, S)
        sums = np.zeros((documents, values.shape[0]))
        np.add.at(sums, index, values.T)
        return sums

    sums_a, sums_b = document_sums(nll_a), document_sums(nll_b)
    document_tokens = np.bincount(index, weights=token_counts, minlength=documents)  # (G,)
    block = max(1, 250_000 // (documents * nll_a.shape[0]))
    out = []
    for start in range(0, len(counts), block):
        rows = counts[start:start + block]
        tokens = (rows @ token_counts)[:, None] - document_tokens[None]  # (r, G)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            ppl_a = np.exp(((rows @ nll_a.T)[:, None, :] - sums_a[None]) / tokens[..., None])  # (r, G, S)
            ppl_b = np.exp(((rows @ nll_b.T)[:, None, :] - sums_b[None]) / tokens[..., None])
        out.append((ppl_b - ppl_a).mean(2))
    return np.concatenate(out) if out else np.zeros((0, documents))


def _statistic_jackknife(statistic: Callable[[np.ndarray, int], np.ndarray], num_seeds: int, counts: np.ndarray,
                         index: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """(R, G) the seed mean of ``statistic`` on each resample (counts (R, N_art)) with one drawn copy of document g
    left out (NaN where g is not drawn): ``seeded_interval``'s statistic, called with those weights."""
    out = np.full(drawn.shape, np.nan)
    for document in range(drawn.shape[1]):
        rows = np.flatnonzero(drawn[:, document] > 0)
        if len(rows):
            weights = counts[rows] - (index == document)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[rows, document] = np.mean([statistic(weights, s) for s in range(num_seeds)], 0)
    return out


def seeded_paired_interval(nll_a: np.ndarray, nll_b: np.ndarray, token_counts: np.ndarray,
                           num_samples: int = 1000, confidence: float = 0.95, seed: int = 0,
                           clusters: Optional[Sequence] = None) -> dict[str, float]:
    """ppl(B) - ppl(A) averaged over training seeds, with an interval that holds its coverage at 2-3 seeds.

    nll_a, nll_b (S, N_art): each seed's per-article NLL sums; token_counts (N_art,); clusters (N_art,) each
    article's source document. d_s = ppl(B_s) - ppl(A_s) is each seed's difference and ``diff`` = mean_s d_s.
    The interval is diff +- sqrt((t_{S-1} * s / sqrt(S))^2 + (t_{G-1} * se_doc)^2): s the standard deviation of
    d_s over seeds, se_doc the standard deviation of the seed-mean difference over document resamples (one draw
    for every seed: they scored the same documents, so that noise does not average out over seeds), G the
    number of documents. Each source of noise gets the t quantile of its own degrees of freedom, and their
    half-widths add in quadrature (docs/evaluation.md: why not Welch-Satterthwaite, and the coverage). On the
    side where the documents' bootstrap-t distribution is skewed, t_{G-1} is lengthened by that skew
    (``_half_widths``), so the interval may reach further on one side; it is never shorter than the symmetric
    one. ``p_value`` is 1 - the largest confidence whose interval excludes 0. Needs S >= 2."""
    _check(num_samples, confidence)
    nll_a, nll_b = np.atleast_2d(np.asarray(nll_a, np.float64)), np.atleast_2d(np.asarray(nll_b, np.float64))
    token_counts = np.asarray(token_counts, np.float64)
    num_seeds = nll_a.shape[0]
    if num_seeds < 2:
        raise PlanlmError("a seed-noise interval needs >= 2 training seeds")
    counts = _resample_counts(len(token_counts), num_samples, seed, clusters)  # (R, N_art)
    observed, resampled, documents = _document_resamples([nll_a, nll_b], token_counts, num_samples, seed, clusters,
                                                         counts)
    per_seed = observed[1] - observed[0]  # (S,)
    seed_cov, document_cov = _seed_and_document_covariance(per_seed[:, None],
                                                           (resampled[1] - resampled[0])[..., None], documents)
    seed_var, document_var = float(seed_cov[0, 0]), float(document_cov[0, 0])
    diff = float(per_seed.mean())
    counts = counts[counts @ token_counts > 0]  # the resamples _document_resamples kept
    index, _ = _document_index(len(token_counts), clusters)
    drawn = _drawn_documents(counts, index, documents)
    studentized = _studentized((resampled[1] - resampled[0]).mean(1), diff,
                               _paired_jackknife(nll_a, nll_b, token_counts, counts, index, documents), drawn)
    below, above = _half_widths(confidence, seed_var, num_seeds, document_var, documents, studentized)
    return {"diff": diff, "ci_low": diff - below, "ci_high": diff + above,
            "p_value": _p_value(diff, seed_var, num_seeds, document_var, documents, studentized),
            "confidence": confidence, "bootstrap_samples": num_samples, "seed_std": float(per_seed.std(ddof=1)),
            "seed_se": float(np.sqrt(seed_var)), "document_se": float(np.sqrt(document_var)), "documents": documents}


def _p_value(diff: float, seed_var: float, num_seeds: int, document_var: float, documents: int,
             studentized: Optional[np.ndarray] = None) -> float:
    """1 - the confidence at which the interval of ``_half_widths`` just reaches 0 (bisection: it widens with it);
    the half-width on the side of 0."""
    if diff == 0:
        return 1.0
    side = 0 if diff > 0 else 1  # below the estimate when it is positive

    def half(confidence: float) -> float:
        return _half_widths(confidence, seed_var, num_seeds, document_var, documents, studentized)[side]

    if half(1 - 1e-12) < abs(diff):
        return 0.0
    low, high = 0.0, 1 - 1e-12  # confidences whose half-width is below / reaches |diff|
    for _ in range(60):
        middle = (low + high) / 2
        if half(middle) < abs(diff):
            low = middle
        else:
            high = middle
    return float(1 - high)


def seeded_interval(statistic: Callable[[np.ndarray, int], np.ndarray], num_seeds: int, num_articles: int,
                    num_samples: int = 1000, confidence: float = 0.95, seed: int = 0,
                    clusters: Optional[Sequence] = None) -> dict:
    """Any statistic of per-article results, averaged over training seeds, with the interval of
    ``seeded_paired_interval``: t_{S-1} times its spread over seeds, in quadrature with t_{G-1} times its standard
    deviation over document resamples (one draw shared by every seed), t_{G-1} lengthened on the side of the
    documents' skew (a bootstrap-t, the statistic recomputed with each drawn document left out in turn).

    ``statistic(weights, s)``: the statistic of seed s with the articles weighted by ``weights`` (R, N_art) (a
    resample's counts; a row of ones is the observed value) -> (R,). Resamples where some seed's statistic is not
    finite (no sentence drawn) are dropped. With one seed the interval is over documents alone."""
    _check(num_samples, confidence)
    counts = _resample_counts(num_articles, num_samples, seed, clusters)  # (R, N_art)
    observed = np.array([float(statistic(np.ones((1, num_articles)), s)[0]) for s in range(num_seeds)])  # (S,)
    with np.errstate(invalid="ignore", divide="ignore"):
        resampled = np.stack([statistic(counts, s) for s in range(num_seeds)], 1)  # (R, S)
    finite = np.isfinite(resampled).all(1)
    resampled, counts = resampled[finite], counts[finite]
    index, documents = _document_index(num_articles, clusters)
    seed_cov, document_cov = _seed_and_document_covariance(observed[:, None], resampled[..., None], documents)
    mean = float(observed.mean())
    drawn = _drawn_documents(counts, index, documents)
    studentized = _studentized(resampled.mean(1), mean,
                               _statistic_jackknife(statistic, num_seeds, counts, index, drawn), drawn)
    below, above = _half_widths(confidence, float(seed_cov[0, 0]), num_seeds, float(document_cov[0, 0]), documents,
                                studentized)
    return {"mean": mean, "ci_low": mean - below, "ci_high": mean + above, "seeds": observed.tolist(),
            "seed_se": float(np.sqrt(seed_cov[0, 0])), "document_se": float(np.sqrt(document_cov[0, 0])),
            "documents": documents, "confidence": confidence, "bootstrap_samples": num_samples}


def oracle_gain_share(nll_fixed: np.ndarray, nll_condition: np.ndarray, nll_oracle: np.ndarray,
                      token_counts: np.ndarray, num_samples: int = 1000, confidence: float = 0.95, seed: int = 0,
                      clusters: Optional[Sequence] = None) -> dict:
    """The share of the oracle's gain that a condition captures: (ppl_cond - ppl_fixed) / (ppl_oracle - ppl_fixed).

    nll_* (S, N_art) or (N_art,): each seed's per-article NLL sums of the three conditions, on the same articles;
    clusters (N_art,) each article's source document. Numerator and denominator are seed means of per-seed
    differences (``gain``, ``oracle_gain``) with the covariances of ``seeded_paired_interval``: over seeds, and
    over document resamples shared by the three conditions. The interval is Fieller's, with that interval's
    quantiles: every r with (gain - r * oracle_gain)^2 <= t_{S-1}^2 * var_seed(gain - r * oracle_gain)
    + t_{G-1}^2 * var_doc(gain - r * oracle_gain). It is bounded only when the oracle's own gain over fixed is
    distinguishable from 0 at this confidence; otherwise ``ci_low``/``ci_high`` are None and ``note`` says so
    (a ratio whose denominator may be 0 has no bounded interval, and near that edge the bounds are wide and
    unstable). With one seed the seed part is zero (an interval over documents alone)."""
    _check(num_samples, confidence)
    nlls = [np.atleast_2d(np.asarray(n, np.float64)) for n in (nll_fixed, nll_condition, nll_oracle)]
    token_counts = np.asarray(token_counts, np.float64)
    num_seeds = nlls[0].shape[0]
    observed, resampled, documents = _document_resamples(nlls, token_counts, num_samples, seed, clusters)
    per_seed = np.stack([observed[1] - observed[0], observed[2] - observed[0]], 1)  # (S, 2) gain, oracle gain
    seed_cov, document_cov = _seed_and_document_covariance(
        per_seed, np.stack([resampled[1] - resampled[0], resampled[2] - resampled[0]], -1), documents)
    gain, oracle_gain = (float(x) for x in per_seed.mean(0))
    result = {"share": gain / oracle_gain if oracle_gain != 0 else None, "ci_low": None, "ci_high": None,
              "gain": gain, "oracle_gain": oracle_gain, "confidence": confidence, "seeds": num_seeds,
              "documents": documents, "interval": "Fieller", "note": None}
    seed_t, document_t = t_quantiles(confidence, num_seeds, documents)
    cov = seed_t ** 2 * seed_cov + document_t ** 2 * document_cov  # (2, 2) quantile-weighted
    a = oracle_gain ** 2 - cov[1, 1]
    if a <= 0:
        result["note"] = (f"the oracle's gain over fixed ({oracle_gain:+.3g}) is not distinguishable from 0 at "
                          f"{confidence:.0%}, so its share has no bounded interval")
        return result
    b, c = gain * oracle_gain - cov[0, 1], gain ** 2 - cov[0, 0]
    root = float(np.sqrt(max(b * b - a * c, 0.0)))  # >= 0: the quadratic is <= 0 at r = share
    result.update(ci_low=float((b - root) / a), ci_high=float((b + root) / a))
    return result


def write_per_article(path: str | Path, rows: list[dict]) -> None:
    """per_article.csv: one row per article; a row without ``source`` gets ``source_of`` its id."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=PER_ARTICLE_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row[k] if k != "source" else row.get(k, source_of(row["id"]))
                             for k in PER_ARTICLE_FIELDS})


def read_per_article(eval_dir: str | Path) -> dict[str, np.ndarray]:
    """The per-article table of an evaluation folder as arrays (article, id, source, nll_sum, tokens).

    ``source`` is each article's source document, the unit the bootstraps resample; files written before that
    column (their manifest hashes them as they are) get it from the id: ``source_of``."""
    from planlm.stage.integrity import fix_for, reading, stage_manifest

    path = Path(eval_dir) / PER_ARTICLE
    stage_manifest(eval_dir)  # the cheap check of a finished evaluation folder: one line per damaged file
    if not path.is_file():
        raise PlanlmError(f"{path}: missing; give an evaluation folder written by `planlm evaluate`")
    with reading(path, fix_for(eval_dir)), open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    lacking = set(PER_ARTICLE_FIELDS) - {"source"} - set(rows[0]) if rows else set()
    if lacking:
        raise PlanlmError(f"{path}: columns {sorted(rows[0])} lack {sorted(lacking)}; rerun `planlm evaluate`")
    try:
        return {"article": np.array([int(r["article"]) for r in rows], dtype=np.int64),
                "id": np.array([r["id"] for r in rows], dtype=object),
                "source": np.array([r.get("source") or source_of(r["id"]) for r in rows], dtype=object),
                "nll_sum": np.array([float(r["nll_sum"]) for r in rows], dtype=np.float64),
                "tokens": np.array([int(r["tokens"]) for r in rows], dtype=np.int64)}
    except (TypeError, ValueError) as e:
        raise PlanlmError(f"{path}: malformed row ({e}); rerun `planlm evaluate`") from e


def _metrics(eval_dir: Path) -> PerplexityMetrics:
    """The metrics of an evaluation folder (every field None when it has no metrics.json)."""
    return PerplexityMetrics.load(eval_dir) if (eval_dir / "metrics.json").is_file() else PerplexityMetrics.from_dict({})


def seed_folders(eval_dir: str | Path, marker: str = PER_ARTICLE) -> dict[int, Path]:
    """{seed: folder} of the ``seed<N>/`` folders of a run with seeds that hold ``marker`` (by default the
    evaluations); {} for a single one."""
    folders = {}
    for folder in Path(eval_dir).glob("seed*"):
        if folder.name[4:].isdigit() and (folder / marker).is_file():
            folders[int(folder.name[4:])] = folder
    return dict(sorted(folders.items()))


def paired_tables(dir_a: Path, dir_b: Path) -> tuple[dict, dict]:
    """The per-article tables of two evaluations, after checking that they score the same tokens."""
    table_a, table_b = read_per_article(dir_a), read_per_article(dir_b)
    if len(table_a["id"]) != len(table_b["id"]) or not (table_a["id"] == table_b["id"]).all():
        mismatch = next((i for i, (x, y) in enumerate(zip(table_a["id"], table_b["id"])) if x != y),
                        min(len(table_a["id"]), len(table_b["id"])))
        raise PlanlmError(f"{dir_b / PER_ARTICLE}: not the same articles as {dir_a / PER_ARTICLE} (first difference at "
                          f"row {mismatch}: {len(table_a['id'])} vs {len(table_b['id'])} articles); evaluate both on "
                          f"the same --split and --max_articles")
    if not (table_a["tokens"] == table_b["tokens"]).all():
        row = int(np.flatnonzero(table_a["tokens"] != table_b["tokens"])[0])
        raise PlanlmError(f"{dir_b / PER_ARTICLE}: article {table_b['id'][row]} (row {row}) has {table_b['tokens'][row]} "
                          f"scored tokens vs {table_a['tokens'][row]} in {dir_a}; compare evaluations with the same "
                          f"tokenizer and --stride")
    return table_a, table_b


def check_seeds_scored_alike(folders: dict[int, Path], tables: list[dict]) -> None:
    """Every seed's table (``tables``, in the order of ``folders``: {seed: evaluation folder}) holds the same
    articles with the same scored tokens as the first seed's, whose token counts the pooled difference uses."""
    (first, first_dir), reference = next(iter(folders.items())), tables[0]
    for (seed, folder), table in zip(list(folders.items())[1:], tables[1:]):
        ids, tokens = table["id"], table["tokens"]
        if len(ids) != len(reference["id"]) or not (ids == reference["id"]).all():
            row = next((i for i, (x, y) in enumerate(zip(reference["id"], ids)) if x != y),
                       min(len(ids), len(reference["id"])))
            theirs = ids[row] if row < len(ids) else "none (it ends there)"
            ours = reference["id"][row] if row < len(reference["id"]) else "none (it ends there)"
            raise PlanlmError(f"{folder}: seed {seed} scored other articles than seed {first} ({first_dir}): first "
                              f"difference at row {row}, article {theirs} vs {ours} ({len(ids)} vs "
                              f"{len(reference['id'])} articles); evaluate every seed on the same --split and "
                              f"--max_articles (rerun seed {seed}'s evaluation)")
        if not (tokens == reference["tokens"]).all():
            row = int(np.flatnonzero(tokens != reference["tokens"])[0])
            raise PlanlmError(f"{folder}: seed {seed}'s article {ids[row]} (row {row}) has {tokens[row]} scored tokens "
                              f"vs {reference['tokens'][row]} in seed {first} ({first_dir}); evaluate every seed with "
                              f"the same tokenizer, --stride and --context_length (rerun seed {seed}'s evaluation)")


def _compare_tables(dir_a: Path, dir_b: Path, table_a: dict, table_b: dict, num_samples: int, confidence: float,
                    seed: int) -> dict:
    """The paired bootstrap of two evaluations' per-article tables, with what the folders' metrics say."""
    result = paired_bootstrap(table_a["nll_sum"], table_b["nll_sum"], table_a["tokens"], num_samples, confidence, seed,
                              clusters=table_a["source"])
    metrics_a, metrics_b = _metrics(dir_a), _metrics(dir_b)
    return {"a": str(dir_a), "b": str(dir_b), "articles": int(len(table_a["id"])),
            "documents": int(cluster_index(table_a["source"]).max()) + 1 if len(table_a["id"]) else 0,
            "tokens": int(table_a["tokens"].sum()), "protocol": metrics_a.protocol,
            "conditioning_a": metrics_a.conditioning, "conditioning_b": metrics_b.conditioning,
            **result}


def compare_evaluations(a: str | Path, b: str | Path, num_samples: int = 1000, confidence: float = 0.95,
                        seed: int = 0, seed_noise: bool = True) -> dict:
    """ppl(B) - ppl(A) of two evaluation folders with a paired bootstrap over source documents (nothing printed).

    Folders of runs with seeds (``seed<N>/`` inside) are paired seed by seed, over the seeds both have, after
    checking that every seed scored the same articles with the same tokens: ``seeds`` holds each seed's
    comparison, ``diff_mean``/``diff_std``/``diff_min``/``diff_max`` the spread of the difference over seeds.
    With ``seed_noise`` and >= 2 seeds, ``diff`` is ``diff_mean`` and ``ci_low``/``ci_high`` the interval of
    ``seeded_paired_interval`` (seed noise with a t quantile on S - 1 degrees of freedom, documents
    resampled; ``interval`` says so); else ``diff`` is the difference of the perplexities of the NLL averaged
    over seeds with the bootstrap over documents alone, which ``article_ci_low``/``article_ci_high`` always
    hold. With one seed and ``seed_noise``, ``note`` says that seed noise cannot be estimated."""
    dir_a, dir_b = Path(a), Path(b)
    seeds_a, seeds_b = seed_folders(dir_a), seed_folders(dir_b)
    if bool(seeds_a) != bool(seeds_b):
        single, seeded = (dir_a, dir_b) if not seeds_a else (dir_b, dir_a)
        raise PlanlmError(f"{single}: a single evaluation, but {seeded} holds one per seed (seed<N>/); compare two "
                          f"runs with seeds, or two seed<N> folders")
    if not seeds_a:
        return _compare_tables(dir_a, dir_b, *paired_tables(dir_a, dir_b), num_samples, confidence, seed)
    common = sorted(set(seeds_a) & set(seeds_b))
    if not common:
        raise PlanlmError(f"{dir_b}: seeds {sorted(seeds_b)} share none with {dir_a}'s {sorted(seeds_a)}; compare runs "
                          f"trained with the same seeds")
    tables = [paired_tables(seeds_a[s], seeds_b[s]) for s in common]  # each seed's tables read once
    check_seeds_scored_alike({s: seeds_a[s] for s in common}, [pair[0] for pair in tables])
    per_seed = {s: _compare_tables(seeds_a[s], seeds_b[s], *pair, num_samples, confidence, seed)
                for s, pair in zip(common, tables)}
    nll_a = np.stack([t[0]["nll_sum"] for t in tables])  # (S, N_art)
    nll_b = np.stack([t[1]["nll_sum"] for t in tables])
    tokens, sources = tables[0][0]["tokens"], tables[0][0]["source"]
    pooled = paired_bootstrap(nll_a.mean(0), nll_b.mean(0), tokens, num_samples, confidence, seed, clusters=sources)
    pooled.update(article_ci_low=pooled["ci_low"], article_ci_high=pooled["ci_high"], interval="articles")
    if seed_noise and len(common) > 1:
        del pooled["fraction_b_better"]  # a share of document resamples: not what the seed-noise interval gives
        pooled.update(seeded_paired_interval(nll_a, nll_b, tokens, num_samples, confidence, seed, clusters=sources),
                      interval="seeds and articles")
    elif seed_noise:
        pooled["note"] = (f"seed noise cannot be estimated from one seed (seed {common[0]}); the interval is over "
                          f"articles alone")
    diffs = np.array([r["diff"] for r in per_seed.values()])
    first = per_seed[common[0]]
    return {**{k: first[k] for k in ("articles", "documents", "tokens", "protocol", "conditioning_a",
                                     "conditioning_b")},
            **pooled, "a": str(dir_a), "b": str(dir_b), "seeds": per_seed, "diff_mean": float(diffs.mean()),
            "diff_std": float(diffs.std(ddof=1)) if len(diffs) > 1 else 0.0, "diff_min": float(diffs.min()),
            "diff_max": float(diffs.max())}


def evaluation_arrays(dirs: list[str | Path]) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, list]:
    """The per-article NLL sums of several evaluations of the same articles, seed by seed: ([(S, N_art) per
    folder], token counts (N_art,), sources (N_art,), seeds). Folders of runs with seeds pair over the seeds they
    all have (``[None]`` for single evaluations), after the checks of ``compare``: every folder and every seed
    scored the same articles with the same tokens."""
    dirs = [Path(d) for d in dirs]
    seeded = [seed_folders(d) for d in dirs]
    if any(seeded) and not all(seeded):
        single = next(d for d, s in zip(dirs, seeded) if not s)
        raise PlanlmError(f"{single}: a single evaluation, but {dirs[0] if seeded[0] else dirs[1]} holds one per seed "
                          f"(seed<N>/); compare runs with seeds, or seed<N> folders")
    if not seeded[0]:
        seeds, folders = [None], [[d] for d in dirs]
    else:
        seeds = sorted(set.intersection(*(set(s) for s in seeded)))
        if not seeds:
            raise PlanlmError(f"{dirs[0]} and {', '.join(map(str, dirs[1:]))}: no seed in common; evaluate them with "
                              f"the same seeds")
        folders = [[s[seed] for seed in seeds] for s in seeded]
    tables = [[paired_tables(folders[0][i], f[i])[1] for i in range(len(seeds))] for f in folders]
    if len(seeds) > 1:
        check_seeds_scored_alike(dict(zip(seeds, folders[0])), tables[0])
    reference = tables[0][0]
    return ([np.stack([t["nll_sum"] for t in per_dir]) for per_dir in tables], reference["tokens"],
            reference["source"], seeds)


def compare(a: str, b: str, num_samples: int = 1000, out_file: str | None = None) -> dict:
    """Compare two evaluations of the same articles with a paired bootstrap.

    Reports ppl(B) - ppl(A) with its 95% confidence interval (negative: B is better) and a bootstrap
    p-value-ish number (how often a resample disagrees with the observed sign). Evaluation folders of
    runs with seeds (``eval/<condition>`` holding ``seed<N>/``) are paired seed by seed: each seed's
    difference is printed, then the difference of the seed-mean NLL with a two-level bootstrap interval
    over training seeds and source documents (seed noise with a t quantile on S - 1 degrees of freedom, so it
    holds its coverage at 2-3 seeds; over documents alone for single evaluations or one seed; the JSON also holds
    the interval over documents alone, ``article_ci_low`` / ``article_ci_high``). Articles are resampled by source
    document, with all their pieces.

    Args:
        a: evaluation folder of the first model (written by ``planlm evaluate``, or a run's eval/<condition>).
        b: evaluation folder of the second model, on the same split, articles and protocol.
        num_samples: bootstrap resamples (seeded: the same result every time).
        out_file: also write the result as JSON here.
    """
    result = compare_evaluations(a, b, num_samples, CONFIDENCE, 0)
    level = int(round(CONFIDENCE * 100))
    for training_seed, one in result.get("seeds", {}).items():
        print(f"seed {training_seed}: B - A = {one['diff']:+.4f} ({level}% CI [{one['ci_low']:+.4f}, "
              f"{one['ci_high']:+.4f}])")
    if "seeds" in result:
        print(f"over {len(result['seeds'])} seeds: B - A mean {result['diff_mean']:+.4f}, "
              f"std {result['diff_std']:.4f}, range [{result['diff_min']:+.4f}, {result['diff_max']:+.4f}]; "
              + ("the mean over seeds, interval over seeds (t on S - 1 degrees of freedom) and documents:"
                 if result["interval"] != "articles" else "NLL averaged over seeds, interval over documents:"))
    if result.get("note"):
        print(f"note: {result['note']}")
    better = ("" if "fraction_b_better" not in result else
              f", B better in {100 * result['fraction_b_better']:.1f}% of resamples")
    print(f"A {result['a']}: ppl {result['ppl_a']:.4f}\nB {result['b']}: ppl {result['ppl_b']:.4f}\n"
          f"B - A = {result['diff']:+.4f} ({level}% CI [{result['ci_low']:+.4f}, {result['ci_high']:+.4f}], "
          f"p~{result['p_value']:.3g}{better}; {result['articles']} articles of {result['documents']} documents, "
          f"{result['tokens']} tokens)")
    if out_file:
        write_json(out_file, result)
    return result
