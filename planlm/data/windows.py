"""LM training windows and the action sources that condition them.

Letters: B windows in a batch, L tokens per window, N unique sentences of a batch, K paths,
T horizon.

- ``article_windows`` cuts every article into windows of at most ``context_length`` tokens that
  never cross articles; with stride = context_length - 1 consecutive windows overlap by one token,
  so every token of an article but its first is predicted exactly once (labels are shifted inside
  the model; a window's first token is only context).
- An ``ActionSource`` maps split-global sentence indices (N,) to ``action_paths (N, K, T)`` and
  ``path_mask (N, K, T)``: the plan of boundary s (the paths for sentences s, s+1, ..., s+T-1).
- ``collate_windows`` builds a batch: token tensors plus the plans of the batch's *unique*
  sentences (``plan_index (B, L)`` points into them; -1 = no plan), so the adapter runs once per
  sentence, not once per token. Token t is conditioned on the plan of ``token_plan_sentence[t]``
  (the ANCHORS alignment: the last token of a sentence already carries the next sentence's plan).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from planlm.data.artifacts import PreparedSplit
from planlm.utils import PlanlmError

IGNORE_INDEX = -100


class ActionSource(Protocol):
    num_paths: int
    horizon: int

    def __call__(self, sentences: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """sentences (N,) split-global -> action_paths (N, K, T) long, path_mask (N, K, T) bool."""
        ...


class FixedActions:
    """The Fixed baseline: every step of every path is one constant action (no information)."""

    def __init__(self, fixed_action: int, num_paths: int, horizon: int):
        self.fixed_action, self.num_paths, self.horizon = fixed_action, num_paths, horizon

    def __call__(self, sentences: np.ndarray):
        shape = (len(sentences), self.num_paths, self.horizon)
        return torch.full(shape, self.fixed_action, dtype=torch.long), torch.ones(shape, dtype=torch.bool)


class OracleActions:
    """The true actions of sentences s..s+T-1 of the same article, masked past its end, repeated over K."""

    def __init__(self, split: PreparedSplit, num_paths: int, horizon: int):
        self.num_paths, self.horizon = num_paths, horizon
        self.actions = np.asarray(split.actions)
        self.article_end = np.asarray(split.sentence_offsets)[1:][split.sentence_article]  # (N_sent,)

    def __call__(self, sentences: np.ndarray):
        sentences = np.asarray(sentences, dtype=np.int64)
        steps = sentences[:, None] + np.arange(self.horizon)  # (N, T)
        valid = steps < self.article_end[sentences][:, None]  # (N, T)
        paths = self.actions[np.where(valid, steps, sentences[:, None])]  # (N, T)
        paths = torch.from_numpy(paths).unsqueeze(1).expand(-1, self.num_paths, -1)  # (N, K, T)
        mask = torch.from_numpy(valid).unsqueeze(1).expand(-1, self.num_paths, -1)  # (N, K, T)
        return paths.contiguous(), mask.contiguous()


class CachedPlans:
    """Rows of a plan cache: sampled paths (N_sent, K, T) or argmax paths (N_sent, T) repeated over K.

    A planner does not know where the article ends, so every step of a path is valid; with ``path_counts``
    (N_sent,) (an adaptive path policy) only the first path_counts[s] paths of row s are, the others are
    masked out (boundaries with different K in one batch)."""

    def __init__(self, plans: np.ndarray, num_paths: int, horizon: int, what: str = "plan cache",
                 path_counts: np.ndarray | None = None):
        if plans.ndim == 2:  # argmax paths (N_sent, T)
            plans = plans[:, None, :]
            repeat = num_paths
        else:
            repeat = 1
        cached_paths, cached_horizon = plans.shape[1], plans.shape[2]
        if repeat == 1 and cached_paths != num_paths:
            raise PlanlmError(f"{what}: holds K={cached_paths} paths per boundary but num_paths={num_paths} was "
                              f"asked; set num_paths: {cached_paths} or sample a cache with K={num_paths}")
        if cached_horizon != horizon:
            raise PlanlmError(f"{what}: holds paths of horizon T={cached_horizon} but horizon={horizon} was asked; "
                              f"set horizon: {cached_horizon} or sample a cache with T={horizon}")
        self.plans, self.repeat, self.num_paths, self.horizon = plans, repeat, num_paths, horizon
        self.path_counts = None if path_counts is None or repeat > 1 else np.asarray(path_counts, dtype=np.int64)

    def __call__(self, sentences: np.ndarray):
        sentences = np.asarray(sentences, dtype=np.int64)
        paths = torch.from_numpy(np.asarray(self.plans[sentences], dtype=np.int64))
        paths = paths.expand(-1, self.repeat, -1).contiguous() if self.repeat > 1 else paths  # (N, K, T)
        if self.path_counts is None:
            return paths, torch.ones_like(paths, dtype=torch.bool)
        from planlm.plans.policy import path_mask_from_counts

        return paths, path_mask_from_counts(torch.from_numpy(self.path_counts[sentences]), self.num_paths, self.horizon)


def make_action_source(conditioning: str, split: PreparedSplit, *, num_paths: int, horizon: int,
                       fixed_action: int = 0, plans: np.ndarray | None = None,
                       argmax_plans: np.ndarray | None = None,
                       path_counts: np.ndarray | None = None) -> ActionSource | None:
    """The action source of a conditioning kind (None for "none"); ``path_counts`` (N_sent,): the paths of each
    boundary of sampled plans under an adaptive path policy (None: all K)."""
    if conditioning == "none":
        return None
    if conditioning == "fixed":
        return FixedActions(fixed_action, num_paths, horizon)
    if conditioning == "oracle":
        return OracleActions(split, num_paths, horizon)
    if conditioning in ("planner_sampled", "planner_argmax"):
        array = plans if conditioning == "planner_sampled" else argmax_plans
        if array is None:
            raise PlanlmError(f"conditioning {conditioning} needs a plan cache: set plans_dir or planner_dir")
        if len(array) != split.num_sentences:
            raise PlanlmError(f"plan cache for split {split.name!r} has {len(array)} rows but {split.path} has "
                              f"{split.num_sentences} sentences; the plans were sampled for another prepared corpus: "
                              f"resample them with `planlm sample-plans --prepared_dir {split.path.parent}`")
        return CachedPlans(array, num_paths, horizon, what=f"plan cache ({conditioning}, split {split.name})",
                           path_counts=path_counts if conditioning == "planner_sampled" else None)
    raise PlanlmError(f"--conditioning {conditioning!r}: choose none, fixed, oracle, planner_argmax, planner_sampled")


def article_windows(split: PreparedSplit, context_length: int = 128, stride: int = 127) -> list[tuple[int, int, int]]:
    """(article, start, end) windows of split-global token indices, never crossing articles.

    Articles with fewer than 2 tokens (nothing to predict) give no window."""
    if not 1 <= stride <= context_length - 1:
        raise PlanlmError(f"--stride {stride} must be in [1, context_length - 1 = {context_length - 1}] "
                          f"(a larger stride would skip tokens)")
    offsets = np.asarray(split.token_offsets)
    windows = []
    for article in range(split.num_articles):
        first, last = int(offsets[article]), int(offsets[article + 1])
        start = first
        while last - start >= 2:
            end = min(start + context_length, last)
            windows.append((article, start, end))
            if end == last:
                break
            start += stride
    return windows


def collate_windows(split: PreparedSplit, windows: list[tuple[int, int, int]], source: ActionSource | None,
                    pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """A batch of windows, right-padded to the longest.

    Returns input_ids, attention_mask, labels (B, L) and, with a source, plan_index (B, L) into the
    batch's unique sentences plus their action_paths / path_mask (N, K, T)."""
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
    action_paths, path_mask = source(sentences)  # (N, K, T) each
    batch.update(plan_index=torch.from_numpy(plan_index), action_paths=action_paths, path_mask=path_mask)
    return batch


class WindowCollator:
    """``collate_fn`` for a DataLoader over a list of windows (picklable for worker processes)."""

    def __init__(self, split: PreparedSplit, source: ActionSource | None, pad_token_id: int = 0):
        self.split, self.source, self.pad_token_id = split, source, pad_token_id

    def __call__(self, windows: list[tuple[int, int, int]]) -> dict[str, torch.Tensor]:
        return collate_windows(self.split, windows, self.source, self.pad_token_id)
