"""Oracle tests of the seeded intervals' document part, of compare's clustering with seeds, and of Fieller's
interval (each checked against a computation made here, independently of the code under test)."""

import json

import numpy as np
import pytest
from scipy import stats

from planlm.evaluate.bootstrap import (compare_evaluations, oracle_gain_share, seeded_interval,
                                       seeded_paired_interval, source_of, write_per_article)


def _pieces(documents, pieces):
    """Article ids of ``documents`` source documents cut into ``pieces`` pieces each ("doc0#0", "doc0#1", ...)."""
    return [f"doc{d}#{p}" for d in range(documents) for p in range(pieces)]


def test_the_document_part_of_a_seeded_interval_is_the_standard_error_over_documents():
    """For a mean with a fixed denominator the document bootstrap has a closed form: over G documents drawn with
    replacement its variance is (G - 1) / G of s_doc^2 / G (s_doc the sample standard deviation, ddof 1, of the
    documents' means), so with the G / (G - 1) correction its standard deviation is the textbook standard error
    s_doc / sqrt(G). At G = 4 the correction is 15% of the standard error."""
    rng = np.random.default_rng(0)
    documents, pieces, seeds = 4, 3, 2
    ids = _pieces(documents, pieces)
    clusters = [source_of(i) for i in ids]
    level = rng.normal(0, 1.0, documents)  # pieces of one document share its level: they are correlated
    values = level[np.arange(len(ids)) // pieces] + rng.normal(0, 0.3, (seeds, len(ids)))  # (S, N_art)
    result = seeded_interval(lambda w, s: w @ values[s] / len(ids), seeds, len(ids), num_samples=20000, seed=3,
                             clusters=clusters)
    document_means = values.mean(0).reshape(documents, pieces).mean(1)  # seed mean, then each document's mean
    assert result["documents"] == documents
    assert result["document_se"] == pytest.approx(document_means.std(ddof=1) / np.sqrt(documents), rel=0.03)


def test_the_document_part_of_the_seeded_paired_interval_matches_a_resampling_loop_by_hand():
    """seeded_paired_interval's document_se against a cluster bootstrap written here (own generator): draw the G
    documents with replacement with all their pieces, recompute the seed mean of the per-seed perplexity
    differences, and scale the variance by G / (G - 1)."""
    rng = np.random.default_rng(1)
    documents, pieces, seeds = 4, 3, 2
    ids = _pieces(documents, pieces)
    doc = np.arange(len(ids)) // pieces
    tokens = rng.integers(50, 150, len(ids)).astype(float)
    nll_a = (3.0 + rng.normal(0, 0.2, documents)[doc] + rng.normal(0, 0.02, (seeds, len(ids)))) * tokens
    nll_b = nll_a - (0.1 + rng.normal(0, 0.1, documents)[doc] + rng.normal(0, 0.01, (seeds, len(ids)))) * tokens
    result = seeded_paired_interval(nll_a, nll_b, tokens, num_samples=20000, seed=5,
                                    clusters=[source_of(i) for i in ids])

    draws = rng.integers(0, documents, (20000, documents))  # (R, G) the documents of each resample
    weights = np.stack([np.bincount(row, minlength=documents) for row in draws])[:, doc]  # (R, N_art)
    drawn_tokens = weights @ tokens
    diffs = np.mean([np.exp(weights @ b / drawn_tokens) - np.exp(weights @ a / drawn_tokens)
                     for a, b in zip(nll_a, nll_b)], axis=0)  # (R,)
    by_hand = np.sqrt(diffs.var(ddof=1) * documents / (documents - 1))
    assert result["documents"] == documents
    assert result["document_se"] == pytest.approx(by_hand, rel=0.04)


def _seeded_folders(root, ids, nll_a, nll_b, tokens):
    """eval/a and eval/b of a run with seeds: seed<s>/per_article.csv of each (sources from the piece ids)."""
    for name, nll in (("a", nll_a), ("b", nll_b)):
        for s, row in enumerate(nll):
            folder = root / name / f"seed{s}"
            folder.mkdir(parents=True)
            write_per_article(folder / "per_article.csv", [{"article": i, "id": a, "nll_sum": n, "tokens": t}
                                                           for i, (a, n, t) in enumerate(zip(ids, row, tokens))])
            (folder / "metrics.json").write_text(json.dumps({"conditioning": name, "protocol": "test"}))
    return root / "a", root / "b"


def test_compare_with_seeds_resamples_documents_with_all_their_pieces(tmp_path):
    """Eight documents of six pieces whose gain is the document's; two seeds that (almost) agree. The seed-noise
    interval of compare must then be at least as wide as the document-clustered interval of the seed-mean NLL
    (its seed part only adds to it), and far wider than the same interval with pieces resampled as independent."""
    rng = np.random.default_rng(2)
    documents, pieces = 8, 6
    ids = _pieces(documents, pieces)
    doc = np.arange(len(ids)) // pieces
    tokens = np.full(len(ids), 100)
    nll_a = np.stack([(3.0 + rng.normal(0, 0.1, documents)[doc]) * tokens] * 2)
    gain = 0.05 + rng.normal(0, 0.05, documents)[doc]  # shared by every piece of a document
    nll_b = np.stack([nll_a[0] - (gain + shift) * tokens for shift in (0.0, 0.0005)])
    result = compare_evaluations(*_seeded_folders(tmp_path, ids, nll_a, nll_b, tokens), num_samples=1000)
    assert result["interval"] == "seeds and articles"
    seeded = result["ci_high"] - result["ci_low"]
    assert seeded >= result["article_ci_high"] - result["article_ci_low"]
    pieces_alone = seeded_paired_interval(nll_a, nll_b, tokens, num_samples=1000)  # clusters=None
    assert seeded > 1.5 * (pieces_alone["ci_high"] - pieces_alone["ci_low"])
    assert result["articles"] == len(ids) and result["documents"] == documents  # "48 articles of 8 documents"


def test_fieller_bounds_are_where_the_interval_of_gain_minus_r_times_oracle_gain_reaches_zero():
    """Fieller's interval is every r for which the interval of gain - r * oracle_gain covers 0, so at each bound
    that interval (``seeded_interval`` of the statistic gain - r * oracle_gain on the same document resamples) just
    touches 0, and at the share it is centred on 0. One seed (documents alone), and a condition whose gain follows
    the oracle's document by document, so the covariance of the two gains matters."""
    rng = np.random.default_rng(3)
    documents, pieces = 10, 3
    ids = _pieces(documents, pieces)
    clusters = [source_of(i) for i in ids]
    doc = np.arange(len(ids)) // pieces
    tokens = rng.integers(80, 120, len(ids)).astype(float)
    fixed = (3.0 + rng.normal(0, 0.2, documents)[doc]) * tokens
    oracle_gain = 0.3 + rng.normal(0, 0.1, documents)[doc]
    oracle = fixed - oracle_gain * tokens
    condition = fixed - (0.4 * oracle_gain + rng.normal(0, 0.01, len(ids))) * tokens  # correlated gains
    kwargs = dict(num_samples=2000, confidence=0.95, seed=7, clusters=clusters)
    result = oracle_gain_share(fixed, condition, oracle, tokens, **kwargs)
    assert result["note"] is None and result["ci_low"] < result["share"] < result["ci_high"]

    def ppl(nll, w):
        return np.exp(w @ nll / (w @ tokens))

    def interval_of_contrast(r):
        def statistic(w, s):
            return (ppl(condition, w) - ppl(fixed, w)) - r * (ppl(oracle, w) - ppl(fixed, w))
        return seeded_interval(statistic, 1, len(ids), **kwargs)

    centred = interval_of_contrast(result["share"])
    assert centred["mean"] == pytest.approx(0, abs=1e-9)
    t = stats.t.ppf(0.975, documents - 1)  # Fieller is normal-theory: the symmetric mean +- t_{G-1} document_se
    scale = 2 * t * centred["document_se"]
    low, high = interval_of_contrast(result["ci_low"]), interval_of_contrast(result["ci_high"])
    # the contrast is oracle_gain * (share - r), oracle_gain < 0 (the oracle is better): below the share it is
    # negative and its interval's high end touches 0, above the share positive and its low end touches 0
    assert result["oracle_gain"] < 0
    assert low["mean"] < 0 and low["mean"] + t * low["document_se"] == pytest.approx(0, abs=1e-6 * scale)
    assert high["mean"] > 0 and high["mean"] - t * high["document_se"] == pytest.approx(0, abs=1e-6 * scale)
