"""LM training windows, and batches of them with the plans that condition them.

Letters: B windows in a batch, L tokens per window, N unique sentences of a batch, K paths,
T horizon.

- ``article_windows`` cuts every article into windows of at most ``context_length`` tokens that
  never cross articles; with stride = context_length - 1 consecutive windows overlap by one token,
  so every token of an article but its first is predicted exactly once (labels are shifted inside
  the model; a window's first token is only context).
- A ``PlanSource`` (``planlm.plans.sources``) maps split-global sentence indices (N,) to ``Plans``:
  ``action_paths (N, K, T)`` and ``path_mask (N, K, T)`` (in expectation also ``action_probs``), the plan
  of boundary s.
- ``collate_windows`` builds a batch: token tensors plus the plans of the batch's *unique*
  sentences (``plan_index (B, L)`` points into them; -1 = no plan), so the adapter runs once per
  sentence, not once per token. Token t is conditioned on the plan of ``token_plan_sentence[t]``
  (the alignment of ``planlm.data.artifacts``: the last token of a sentence already carries the next sentence's plan).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from planlm.data.artifacts import PreparedSplit
from planlm.errors import PlanlmError

if TYPE_CHECKING:  # the protocol only names the argument's type: data sits below plans and never calls into it
    from planlm.plans.sources import PlanSource

IGNORE_INDEX = -100
"""The target every loss leaves out (PyTorch's and Hugging Face's convention): padding of an LM window, a planner's
step beyond its article's end. Defined here alone; the losses and the planner's targets import it."""


def article_windows(split: PreparedSplit, context_length: int = 128, stride: int = 127) -> np.ndarray:
    """(W, 3) int64 windows ``(article, start, end)`` of split-global token indices, never crossing articles, in
    article order (a numpy array: 24 bytes a window, whatever the corpus's size).

    An article of n >= 2 tokens gives windows starting every ``stride`` tokens from its first, each of at most
    ``context_length`` tokens, until one reaches its end: 1 + ceil((n - context_length) / stride) of them (one when
    n <= context_length). Articles with fewer than 2 tokens (nothing to predict) give no window."""
    if not 1 <= stride <= context_length - 1:
        raise PlanlmError(f"--stride {stride} must be in [1, context_length - 1 = {context_length - 1}] "
                          f"(a larger stride would skip tokens)")
    offsets = np.asarray(split.token_offsets, dtype=np.int64)  # (N_art + 1,)
    lengths = np.diff(offsets)  # (N_art,)
    past_first = -(-(lengths - context_length) // stride)  # ceil; <= 0 when the first window holds the article
    counts = np.where(lengths >= 2, 1 + np.maximum(past_first, 0), 0)  # (N_art,) windows per article
    article = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)  # (W,)
    step = np.arange(len(article), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)  # (W,) in article
    start = offsets[article] + step * stride  # (W,)
    end = np.minimum(start + context_length, offsets[article + 1])  # (W,)
    return np.stack([article, start, end], axis=1)


def beyond_window_share(token_offsets: np.ndarray, context_length: int = 128) -> float:
    """Share of the tokens with more of their article before them than a ``context_length`` window holds.

    The window shows a token at most ``context_length - 1`` tokens before it, so the token at article position
    p (from 0) has context beyond it when p >= context_length. Only there can a plan made from the whole
    article so far tell the LM something its window does not: the planner's possible edge."""
    lengths = np.diff(np.asarray(token_offsets, dtype=np.int64))  # (N_art,)
    total = int(lengths.sum())
    return float(np.maximum(lengths - context_length, 0).sum() / total) if total else 0.0


def collate_windows(split: PreparedSplit, windows: Sequence, source: PlanSource | None,
                    pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """A batch of windows (rows ``(article, start, end)`` of ``article_windows``), right-padded to the longest.

    Returns input_ids, attention_mask, labels (B, L) and, with a source, plan_index (B, L) into the
    batch's unique sentences plus their action_paths / path_mask (N, K, T) (in expectation also action_probs)."""
    longest = max(end - start for _, start, end in windows)
    num_windows = len(windows)
    input_ids = np.full((num_windows, longest), pad_token_id, dtype=np.int64)  # (B, L)
    attention_mask = np.zeros((num_windows, longest), dtype=np.int64)  # (B, L)
    plan_sentence = np.full((num_windows, longest), -1, dtype=np.int64)  # (B, L) split-global, -1 = padding
    for row, (_, start, end) in enumerate(windows):
        length = end - start
        input_ids[row, :length] = split.input_ids[start:end]
        attention_mask[row, :length] = 1
        plan_sentence[row, :length] = split.token_plan_sentence[start:end]
    labels = np.where(attention_mask == 1, input_ids, IGNORE_INDEX)  # (B, L)
    batch = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention_mask),
             "labels": torch.from_numpy(labels)}
    if source is None:
        batch["plan_index"] = torch.full((num_windows, longest), -1, dtype=torch.long)
        return batch
    real = plan_sentence >= 0
    sentences, inverse = np.unique(plan_sentence[real], return_inverse=True)  # (N,), index of each real token
    plan_index = np.full((num_windows, longest), -1, dtype=np.int64)
    plan_index[real] = inverse
    batch.update(plan_index=torch.from_numpy(plan_index), **source(sentences).inputs())  # (N, K, T[, M]) each
    return batch


class WindowCollator:
    """``collate_fn`` for a DataLoader over the windows of ``article_windows`` (picklable for worker processes)."""

    def __init__(self, split: PreparedSplit, source: PlanSource | None, pad_token_id: int = 0):
        self.split, self.source, self.pad_token_id = split, source, pad_token_id

    def __call__(self, windows: Sequence) -> dict[str, torch.Tensor]:
        return collate_windows(self.split, windows, self.source, self.pad_token_id)
