"""Plan sources: one interface that gives the action paths of any set of sentence boundaries.

A ``PlanSource`` maps split-global sentence indices ``sentences (N,)`` to ``Plans``: ``action_paths
(N, K, T)`` long and ``path_mask (N, K, T)`` bool, the plan of boundary s (the paths for sentences s, s+1,
..., s+T-1); for plans in expectation (``PlanConfig.expectation``) ``action_paths (N, K, T, M)`` holds each
step's M most likely actions and ``action_probs (N, K, T, M)`` their probabilities, renormalised. Training (``planlm.data.windows``), evaluation (plan vectors per sentence), plan usage
(``ShuffledPlans``) and generation read plans through it, whatever their kind:

- ``FixedPlans``: one constant action everywhere (the Fixed baseline);
- ``OraclePlans``: the true actions of the same article, masked past its end;
- ``CachedPlans``: rows of a plan cache (``planlm sample-plans``), or of plans a planner has just
  computed for the boundaries a command needs (in the cache's layout);
- ``TablePlans``: plans a kind made once for the boundaries a command needs (a registered kind's default);
- ``ShuffledPlans``: another source's plans, shuffled across sentences (plan usage).

``planlm.plans.kinds.plan_source(plans, ...)`` builds the source of a resolved ``PlanConfig`` (its kind's
``source``). It checks K and T against the cache or the planner once; the sources themselves trust their arrays.

Letters: N sentences asked for, N_sent sentences of the split, K paths, T horizon.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Protocol

import numpy as np
import torch

from planlm.data.artifacts import PreparedSplit
from planlm.errors import PlanlmError
from planlm.plans.policy import path_mask_from_counts


class Plans(NamedTuple):
    """The plans of N boundaries, as the adapter reads them (``PlannedLM.plan_vectors(*plans)``)."""

    action_paths: torch.Tensor
    """(N, K, T) long: the actions of every path; in expectation (N, K, T, M): each step's M most likely actions."""
    path_mask: torch.Tensor
    """(N, K, T) bool: the real steps."""
    action_probs: Optional[torch.Tensor] = None
    """In expectation: (N, K, T, M) float32, the probabilities of ``action_paths``, summing to 1 at every step."""

    def to(self, device: str | torch.device) -> Plans:
        return Plans(*(None if x is None else x.to(device) for x in self))

    def inputs(self) -> dict[str, torch.Tensor]:
        """The keyword arguments of ``PlannedLM.forward`` (action_probs only in expectation)."""
        return {name: value for name, value in self._asdict().items() if value is not None}


def step_probs(probs: torch.Tensor) -> torch.Tensor:
    """The top actions' probabilities (..., M) as the adapter reads them: at a plan cache's precision (float16),
    renormalised to sum to 1 at every step, float32. With a gradient (joint training) the rounding passes it
    unchanged: the plans a cache would give forward, the planner's own gradient backward."""
    rounded = probs.half().float()
    if probs.requires_grad:
        rounded = probs + (rounded - probs).detach()  # the same values: rounded - probs is exact
    return rounded / rounded.sum(-1, keepdim=True).clamp(min=1e-12)


class PlanSource(Protocol):
    num_paths: int
    horizon: int

    def __call__(self, sentences: np.ndarray) -> Plans:
        """sentences (N,) split-global -> the plans of those boundaries."""
        ...


class FixedPlans:
    """The Fixed baseline: every step of every path is one constant action (no information)."""

    def __init__(self, fixed_action: int, num_paths: int, horizon: int):
        self.fixed_action, self.num_paths, self.horizon = fixed_action, num_paths, horizon

    def __call__(self, sentences: np.ndarray):
        shape = (len(sentences), self.num_paths, self.horizon)
        return Plans(torch.full(shape, self.fixed_action, dtype=torch.long), torch.ones(shape, dtype=torch.bool))


class OraclePlans:
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
        return Plans(paths.contiguous(), mask.contiguous())


class CachedPlans:
    """Rows of plan arrays: sampled paths (N_sent, K, T), or argmax paths (N_sent, T) repeated K times; in
    expectation (``action_probs``) each step's top actions (N_sent, K or -, T, M) and their probabilities.

    A planner does not know where the article ends, so every step of a path is valid; with ``path_counts``
    (N_sent,) (an adaptive path policy) only the first path_counts[s] paths of sentence s are, the others are
    masked out (boundaries with different K in one batch). ``rows`` (N_sent,) gives the array row of each sentence
    (arrays of some boundaries only; -1: not computed); None: row s is sentence s."""

    def __init__(self, plans: np.ndarray, num_paths: int, horizon: int, path_counts: Optional[np.ndarray] = None,
                 action_probs: Optional[np.ndarray] = None, rows: Optional[np.ndarray] = None):
        step_dims = 0 if action_probs is None else 1  # the M axis of plans in expectation
        one_path = plans.ndim == 2 + step_dims  # an argmax path per row, repeated K times
        self.repeat = num_paths if one_path else 1
        self.plans = plans[:, None] if one_path else plans  # (N_rows, K or 1, T[, M])
        self.action_probs = action_probs[:, None] if action_probs is not None and one_path else action_probs
        self.num_paths, self.horizon, self.rows = num_paths, horizon, rows
        self.path_counts = None if path_counts is None or one_path else np.asarray(path_counts, dtype=np.int64)

    def __call__(self, sentences: np.ndarray) -> Plans:
        sentences = np.asarray(sentences, dtype=np.int64)
        rows = sentences if self.rows is None else self._known_rows(sentences)
        paths = self._rows(self.plans, rows, np.int64)  # (N, K, T[, M])
        probs = None
        if self.action_probs is not None:
            probs = step_probs(self._rows(self.action_probs, rows, np.float32))  # (N, K, T, M)
        shape = (len(sentences), self.num_paths, self.horizon)
        if self.path_counts is None:
            return Plans(paths, torch.ones(shape, dtype=torch.bool), probs)
        return Plans(paths, path_mask_from_counts(torch.from_numpy(self.path_counts[sentences]), self.num_paths,
                                                  self.horizon), probs)

    def _known_rows(self, sentences: np.ndarray) -> np.ndarray:
        rows = self.rows[sentences]
        if (rows < 0).any():
            raise PlanlmError(f"plans asked for sentence {int(sentences[rows < 0][0])}, which this source did not "
                              f"plan; give every boundary to plan_source(sentences=...)")
        return rows

    def _rows(self, array: np.ndarray, rows: np.ndarray, dtype) -> torch.Tensor:
        rows = torch.from_numpy(np.asarray(array[rows], dtype=dtype))  # (N, K or 1, T[, M])
        return rows.expand(-1, self.repeat, *rows.shape[2:]).contiguous() if self.repeat > 1 else rows


class TablePlans:
    """Plans made once for ``sentences`` (N,) of a split, read back by sentence (``PlanKind.source``)."""

    def __init__(self, plans: Plans, sentences: np.ndarray, num_sentences: int):
        self.plans = plans  # (N, K, T[, M]) each
        self.num_paths, self.horizon = plans.path_mask.shape[1:]
        self.rows = np.full(num_sentences, -1, dtype=np.int64)
        self.rows[np.asarray(sentences, dtype=np.int64)] = np.arange(len(sentences))

    def __call__(self, sentences: np.ndarray) -> Plans:
        rows = self.rows[np.asarray(sentences, dtype=np.int64)]
        if (rows < 0).any():
            raise PlanlmError("plans asked for a sentence this source did not plan; give every boundary to "
                              "plan_source(sentences=...)")
        index = torch.from_numpy(rows)
        return Plans(*(None if x is None else x[index] for x in self.plans))


class ShuffledPlans:
    """A source whose sentence s gets the plan ``source`` gives sentence ``permutation[s]`` (plan usage)."""

    def __init__(self, source: PlanSource, permutation: np.ndarray):
        self.source, self.permutation = source, np.asarray(permutation, dtype=np.int64)
        self.num_paths, self.horizon = source.num_paths, source.horizon

    def __call__(self, sentences: np.ndarray):
        return self.source(self.permutation[np.asarray(sentences, dtype=np.int64)])


__all__ = ["Plans", "PlanSource", "FixedPlans", "OraclePlans", "CachedPlans", "TablePlans", "ShuffledPlans",
           "step_probs"]
