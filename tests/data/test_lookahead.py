"""The lookahead corpus: its words announce the types to come, and its exact optimum agrees with Monte Carlo."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planlm.data.artifacts import PreparedDataset
from planlm.data.lookahead import (ANNOUNCE, GRAY, TOKENS_PER_SENTENCE, TOPICS, ideal_split_nll, ideal_token_nll,
                                   make_articles, make_lookahead_prepared, max_context_length, sample_types)
from planlm.utils import PlanlmError


def word_sets(types: np.ndarray, sentence: int, slot: int) -> list:
    """The words the generator may write in (sentence, slot) of an article with these types (read from the tables,
    not from the module's own bookkeeping); None for a fixed word."""
    if slot in (0, 1, 3):
        return TOPICS[types[sentence]][{0: 0, 1: 1, 3: 2}[slot]]
    if slot in (2, TOKENS_PER_SENTENCE - 1):
        return None
    ahead, bit, *choices = ANNOUNCE[slot - 4]
    return choices[(GRAY[types[sentence + ahead]] >> bit) & 1]


def monte_carlo_nll(article: dict, context_length: int, lag: int, plan_horizon: int, samples: np.ndarray) -> np.ndarray:
    """(tokens - 1,) -log p(token | its window, the true types of the next plan_horizon sentences) estimated by
    keeping the type sequences drawn from the generator that agree with what the LM knows (0: no plan)."""
    words = [w for sentence in article["sentences"] for w in sentence[:-1].split() + ["."]]
    num_sentences, stride = len(article["sentences"]), context_length - 1
    truth = np.asarray(article["types"])
    nll = []
    for position in range(1, len(words)):
        sentence, slot = divmod(position, TOKENS_PER_SENTENCE)
        keep = np.ones(len(samples), dtype=bool)
        for known in range(sentence, min(sentence + plan_horizon, num_sentences)):
            keep &= samples[:, known] == truth[known]
        for seen in range((position - 1) // stride * stride, position):  # the window before the token
            if word_sets(truth, *divmod(seen, TOKENS_PER_SENTENCE)) is not None:
                keep &= _allows(samples, seen, words[seen])
        options = word_sets(truth, sentence, slot)
        if options is None:
            nll.append(0.0)
            continue
        hits = _allows(samples[keep], position, words[position]).mean()
        nll.append(-np.log(hits / len(options)))
    return np.asarray(nll)


def _allows(samples: np.ndarray, seen: int, word: str) -> np.ndarray:
    """(samples,) whether each sampled type sequence lets the generator write `word` at token `seen`."""
    sentence, slot = divmod(seen, TOKENS_PER_SENTENCE)
    ahead = 0 if slot in (0, 1, 3) else ANNOUNCE[slot - 4][0]
    allowed = np.array([word in word_sets(np.full(sentence + ahead + 1, t), sentence, slot) for t in range(8)])
    return allowed[samples[:, sentence + ahead]]


@pytest.mark.parametrize("plan_horizon", [0, 1, 2])
def test_exact_optimum_matches_monte_carlo(plan_horizon):
    lag, context_length = 4, max_context_length(4)
    rng = np.random.default_rng(0)
    articles = make_articles(3, 5, 6, lag, seed=1)
    exact, estimate = [], []
    for article in articles:
        types, num_sentences = np.asarray(article["types"]), len(article["sentences"])
        samples = sample_types(rng, 100_000, len(types), lag)
        key = ("none", 1) if plan_horizon == 0 else ("oracle", plan_horizon)
        exact.append(ideal_token_nll(types, num_sentences, context_length, lag, [key])[key])
        estimate.append(monte_carlo_nll(article, context_length, lag, plan_horizon, samples))
    exact, estimate = np.concatenate(exact), np.concatenate(estimate)
    assert abs(exact.mean() - estimate.mean()) < 0.02
    assert np.abs(exact - estimate).max() < 0.1


def test_words_announce_the_types_ahead(tmp_path):
    prepared_dir = make_lookahead_prepared(tmp_path / "look", {"train": 4, "validation": 2, "test": 3}, (8, 10))
    split = PreparedDataset(prepared_dir).split("test")
    types = json.loads((prepared_dir / "test" / "types.json").read_text())
    for article in split.articles:
        words = article["text"].replace(".", " .").split()
        truth = np.asarray(types[article["id"]])
        for position, word in enumerate(words):
            options = word_sets(truth, *divmod(position, TOKENS_PER_SENTENCE))
            assert options is None or word in options
    assert (np.diff(split.token_offsets) == TOKENS_PER_SENTENCE * np.diff(split.sentence_offsets)).all()
    optima = ideal_split_nll(split, types, max_context_length(6), 6)
    # each plan step tells more; the true types tell more than the planner's posterior
    assert optima[("none", 1)] > optima[("oracle", 1)] > optima[("oracle", 2)] > optima[("oracle", 3)] > \
        optima[("oracle", 5)]
    assert optima[("planner", 1)] > optima[("planner", 3)] > optima[("oracle", 3)]


def test_a_window_that_reaches_the_deciding_sentence_is_refused():
    article = make_articles(1, 12, 12, 6, seed=0)[0]
    with pytest.raises(PlanlmError, match="--context_length 24: .* use at most 23"):
        ideal_token_nll(np.asarray(article["types"]), 12, 24, 6)
