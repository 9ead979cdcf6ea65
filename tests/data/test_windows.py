"""LM windows (never across articles, every token predicted once) and their batches (one plan per sentence)."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

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


def _loop_windows(token_offsets: np.ndarray, context_length: int, stride: int) -> list[tuple[int, int, int]]:
    """The windows as article_windows cut them one at a time, as a list of tuples (the reference)."""
    windows = []
    for article in range(len(token_offsets) - 1):
        first, last = int(token_offsets[article]), int(token_offsets[article + 1])
        start = first
        while last - start >= 2:
            end = min(start + context_length, last)
            windows.append((article, start, end))
            if end == last:
                break
            start += stride
    return windows


@pytest.mark.parametrize("context_length, stride", [(16, 15), (16, 1), (16, 8), (2, 1), (128, 127)])
def test_windows_are_the_one_at_a_time_cut_in_the_same_order(context_length, stride):
    """Articles of 0, 1, 2 tokens, at and around the window and its multiples, and random ones: the same windows in
    the same order (a changed order would change every LM batch)."""
    lengths = [0, 1, 2, 3, context_length - 1, context_length, context_length + 1, 2 * context_length,
               context_length + stride, context_length + stride + 1, 5 * stride + 3]
    lengths += np.random.default_rng(0).integers(0, 4 * context_length, size=40).tolist()
    split = SimpleNamespace(token_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    windows = article_windows(split, context_length, stride)
    assert windows.dtype == np.int64 and windows.shape[1] == 3
    assert [tuple(w) for w in windows.tolist()] == _loop_windows(split.token_offsets, context_length, stride)


PINNED_WINDOWS = "d147fde597aaa21a"  # article_windows(train, 16, 15) of synthetic_random: 557 windows


def test_windows_of_the_synthetic_split_are_pinned(synthetic_random):
    """The windows of a prepared split, pinned by their hash: what the LM's batches are made of."""
    split = PreparedDataset(synthetic_random)["train"]
    windows = article_windows(split, 16, 15)
    assert [tuple(w) for w in windows.tolist()] == _loop_windows(split.token_offsets, 16, 15)
    assert hashlib.sha256(np.ascontiguousarray(windows, dtype="<i8").tobytes()).hexdigest()[:16] == PINNED_WINDOWS


def test_the_training_loader_batches_the_windows_in_the_epoch_order(synthetic_random):
    """Each epoch's batches are the windows (as the one-at-a-time cut lists them) in the order of (seed, epoch)."""
    from planlm.seeds import derive_seed
    from planlm.train.lm import _loader

    split = PreparedDataset(synthetic_random)["train"]
    loader = _loader(split, article_windows(split, 16, 15), None, 32, True, 0, 0, seed=4)
    reference = _loop_windows(split.token_offsets, 16, 15)
    for epoch in (0, 1):
        loader.sampler.set_epoch(epoch)
        order = np.random.default_rng((derive_seed(4, "data_order"), epoch)).permutation(len(reference))
        batches = list(loader)
        assert len(batches) == -(-len(reference) // 32)
        for number, batch in enumerate(batches):
            expected = collate_windows(split, [reference[i] for i in order[number * 32:(number + 1) * 32]], None)
            assert all(torch.equal(batch[key], expected[key]) for key in expected)

