"""The lookahead corpus: its words announce the types to come, and its exact optimum agrees with Monte Carlo."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.lookahead_corpus import (ANNOUNCE, GRAY, TOKENS_PER_SENTENCE, TOPICS, ideal_split_nll,
                                          ideal_token_nll, make_articles, make_lookahead_prepared, max_context_length,
                                          sample_types)
from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError

pytestmark = pytest.mark.lab  # the corpus of experiments/bench_lookahead.py: `pytest -m lab`


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


def importance_nll(article: dict, context_length: int, lag: int, plan: str, horizon: int, particles: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(tokens - 1,) Monte Carlo -log p(token | its window, the plan) and the variance of each estimate, by
    importance sampling of the types from the generator's lag rule, fresh particles per token.

    Each word is chosen by one type (``word_sets``), so the window's words restrict each type to a set; the plan
    pins types: ``oracle`` the next T real types, ``planner`` (K -> infinity) the types ``lag`` before each of the
    next T sentences (its posterior, two successors, is a one-to-one function of them). Under the lag rule the
    types j, j + lag, j + 2 lag, ... form a chain that is independent of the other residues, with uniform
    marginals and steps of +1 or +2, so it reads backwards with steps of -1 or -2. Each particle draws the
    deciding type's chain backwards from its last restricted element (uniform), each type restricted to its set;
    its weight is the product of the restricted masses."""
    words = [w for sentence in article["sentences"] for w in sentence[:-1].split() + ["."]]
    num_sentences, stride = len(article["sentences"]), context_length - 1
    truth = np.asarray(article["types"])
    nll, variance = np.zeros(len(words) - 1), np.zeros(len(words) - 1)
    rows = np.arange(particles)
    for position in range(1, len(words)):
        sentence, slot = divmod(position, TOKENS_PER_SENTENCE)
        options = word_sets(truth, sentence, slot)
        if options is None:
            continue
        allowed = np.ones((len(truth), 8), dtype=bool)  # what the window and the plan leave of each type
        for seen in range((position - 1) // stride * stride, position):
            seen_sentence, seen_slot = divmod(seen, TOKENS_PER_SENTENCE)
            if word_sets(truth, seen_sentence, seen_slot) is not None:
                allowed[seen_sentence + deciding(seen_slot)] &= allows_word(truth, seen_sentence, seen_slot,
                                                                            words[seen])
        for known in range(sentence, sentence + horizon if plan != "none" else sentence):
            pinned = known if plan == "oracle" else known - lag
            if (plan == "oracle" and known < num_sentences) or (plan == "planner" and pinned >= 0):
                allowed[pinned] &= np.arange(8) == truth[pinned]
        target = sentence + deciding(slot)
        chain = np.arange(target % lag, len(truth), lag)
        last = max(i for i in chain if i == target or not allowed[i].all())
        chain = chain[chain <= last][::-1]  # backwards from its last restricted element
        weights, value = np.ones(particles), None
        for index in chain:
            if value is None:
                step = np.full((particles, 8), 1 / 8)
            else:  # the lag rule read backwards: t - 1 or t - 2 of the type lag sentences later
                step = np.zeros((particles, 8))
                step[rows, (value - 1) % 8] += 0.5
                step[rows, (value - 2) % 8] += 0.5
            step *= allowed[index]
            mass = step.sum(1)
            weights *= mass
            cumulative = np.cumsum(step, axis=1) / np.maximum(mass, 1e-300)[:, None]
            value = np.minimum((cumulative < rng.random((particles, 1))).sum(1), 7)
            value = np.where(mass > 0, value, 0)
            if index == target:
                hits = allows_word(truth, sentence, slot, words[position])[value].astype(float)
        estimate = (weights * hits).sum() / weights.sum()
        nll[position - 1] = -np.log(estimate / len(options))
        # self-normalised importance sampling, delta method: var(log estimate) ~ sum w^2 (h - e)^2 / (sum w)^2 / e^2
        variance[position - 1] = (weights ** 2 * (hits - estimate) ** 2).sum() / weights.sum() ** 2 / estimate ** 2
    return nll, variance


def deciding(slot: int) -> int:
    """How many sentences ahead is the type that chooses the word of a (non-fixed) slot."""
    return 0 if slot in (0, 1, 3) else ANNOUNCE[slot - 4][0]


def allows_word(truth: np.ndarray, sentence: int, slot: int, word: str) -> np.ndarray:
    """(8,) whether each value of the type that decides (sentence, slot) lets the generator write ``word``."""
    ahead = deciding(slot)
    return np.array([word in word_sets(np.where(np.arange(len(truth)) == sentence + ahead, t, truth), sentence, slot)
                     for t in range(8)])


@pytest.mark.parametrize("plan, horizon", [("none", 1), ("planner", 1), ("planner", 3), ("planner", 5),
                                           ("oracle", 3)])
def test_exact_optimum_at_the_benchmarks_setting_matches_importance_sampling(plan, horizon):
    """The benchmark's own setting (lag 6, the 23-token window, articles of 12-20 sentences): the exact optimum
    against a Monte Carlo estimate within 4 of its standard errors (the ideal planner's posterior and the register
    word's evidence, which the 7-token window at lag 4 never holds, both enter)."""
    lag = 6
    context_length = max_context_length(lag)
    assert context_length == 23
    rng = np.random.default_rng(0)
    exact, estimate, variance = [], [], []
    for article in make_articles(2, 12, 20, lag, seed=3):
        types, num_sentences = np.asarray(article["types"]), len(article["sentences"])
        exact.append(ideal_token_nll(types, num_sentences, context_length, lag, [(plan, horizon)])[(plan, horizon)])
        nll, var = importance_nll(article, context_length, lag, plan, horizon, 2000, rng)
        estimate.append(nll)
        variance.append(var)
    exact, estimate, variance = np.concatenate(exact), np.concatenate(estimate), np.concatenate(variance)
    error = np.sqrt(variance.sum()) / len(exact)  # tokens' estimates are independent (fresh particles)
    gap = exact.mean() - estimate.mean()
    assert abs(gap) < 4 * error, f"exact {exact.mean():.4f}, Monte Carlo {estimate.mean():.4f} +- {error:.4f}"
    assert error < 0.004  # tight enough to see a shift of 0.013 (the register word's evidence dropped)


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
