"""LM windows (never across articles, every token predicted once) and their batches (one plan per sentence)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from planlm.data.artifacts import PreparedDataset
from planlm.data.windows import WindowCollator, article_windows, beyond_window_share, collate_windows
from planlm.errors import PlanlmError
from planlm.plans.sources import OraclePlans


def test_windows_never_cross_articles_and_predict_every_token_once(synthetic_random):
    split = PreparedDataset(synthetic_random)["validation"]
    windows = article_windows(split, context_length=16, stride=15)
    predicted = np.zeros(split.num_tokens, dtype=int)
    for article, start, end in windows:
        tokens = split.token_range(article)
        assert tokens.start <= start < end <= tokens.stop and end - start <= 16
        predicted[start + 1:end] += 1  # the first token of a window is context only
    firsts = np.asarray(split.token_offsets[:-1])
    expected = np.ones(split.num_tokens, dtype=int)
    expected[firsts] = 0
    np.testing.assert_array_equal(predicted, expected)
    with pytest.raises(PlanlmError, match="--stride"):
        article_windows(split, context_length=16, stride=16)


def test_collate_dedupes_sentences_and_follows_the_alignment(synthetic_random):
    split = PreparedDataset(synthetic_random)["validation"]
    windows = article_windows(split, context_length=16, stride=15)[:5]
    source = OraclePlans(split, num_paths=2, horizon=3)
    batch = WindowCollator(split, source)(windows)
    assert set(batch) == {"input_ids", "attention_mask", "labels", "plan_index", "action_paths", "path_mask"}
    num_sentences = batch["action_paths"].shape[0]
    assert batch["action_paths"].shape == batch["path_mask"].shape == (num_sentences, 2, 3)
    assert num_sentences == len(torch.unique(batch["plan_index"][batch["plan_index"] >= 0]))  # deduplicated
    for row, (_, start, end) in enumerate(windows):
        length = end - start
        np.testing.assert_array_equal(batch["input_ids"][row, :length], split.input_ids[start:end])
        assert (batch["labels"][row, length:] == -100).all() and (batch["plan_index"][row, length:] == -1).all()
        # The first step of token t's plan is the action of token_plan_sentence[t] (ANCHORS convention).
        first_step = batch["action_paths"][batch["plan_index"][row, :length], 0, 0]
        np.testing.assert_array_equal(first_step, split.token_actions[start:end])
    none_batch = collate_windows(split, windows, None)
    assert "action_paths" not in none_batch and (none_batch["plan_index"] == -1).all()


def test_beyond_window_share_counts_the_tokens_past_the_window():
    offsets = np.array([0, 100, 400, 400, 450])  # articles of 100, 300, 0 and 50 tokens
    assert beyond_window_share(offsets, 128) == pytest.approx((300 - 128) / 450)
    assert beyond_window_share(offsets, 50) == pytest.approx((50 + 250) / 450)  # position p >= 50 sees past it
    assert beyond_window_share(offsets, 300) == 0.0 and beyond_window_share(np.array([0]), 128) == 0.0
