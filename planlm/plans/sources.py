"""Plan sources: one interface that gives the action paths of any set of sentence boundaries.

A ``PlanSource`` maps split-global sentence indices ``sentences (N,)`` to ``Plans``: ``action_paths
(N, K, T)`` long and ``path_mask (N, K, T)`` bool, the plan of boundary s (the paths for sentences s, s+1,
..., s+T-1); for plans in expectation (``PlanSpec.expectation``) ``action_paths (N, K, T, M)`` holds each
step's M most likely actions and ``action_probs (N, K, T, M)`` their probabilities, renormalised. Training (``planlm.data.windows``), evaluation (plan vectors per sentence), plan usage
(``ShuffledPlans``) and generation read plans through it, whatever their kind:

- ``FixedPlans``: one constant action everywhere (the Fixed baseline);
- ``OraclePlans``: the true actions of the same article, masked past its end;
- ``CachedPlans``: rows of a plan cache (``planlm sample-plans``), or of plans a planner has just
  computed for the boundaries a command needs (``planner_plans``).

``plan_source(spec, ...)`` builds the source of a resolved ``PlanSpec``. It checks K and T against
the cache or the planner once; the sources themselves trust their arrays.

Letters: N sentences asked for, N_sent sentences of the split, K paths, T horizon.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Optional, Protocol

import numpy as np
import torch

from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.plans.spec import PlanKind, PlanSpec
from planlm.utils import PlanlmError


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
    renormalised to sum to 1 at every step, float32."""
    probs = probs.half().float()
    return probs / probs.sum(-1, keepdim=True).clamp(min=1e-12)


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
    (N_sent,) (an adaptive path policy) only the first path_counts[s] paths of row s are, the others are
    masked out (boundaries with different K in one batch)."""

    def __init__(self, plans: np.ndarray, num_paths: int, horizon: int, path_counts: Optional[np.ndarray] = None,
                 action_probs: Optional[np.ndarray] = None):
        step_dims = 0 if action_probs is None else 1  # the M axis of plans in expectation
        one_path = plans.ndim == 2 + step_dims  # an argmax path per row, repeated K times
        self.repeat = num_paths if one_path else 1
        self.plans = plans[:, None] if one_path else plans  # (N_sent, K or 1, T[, M])
        self.action_probs = action_probs[:, None] if action_probs is not None and one_path else action_probs
        self.num_paths, self.horizon = num_paths, horizon
        self.path_counts = None if path_counts is None or one_path else np.asarray(path_counts, dtype=np.int64)

    def __call__(self, sentences: np.ndarray) -> Plans:
        sentences = np.asarray(sentences, dtype=np.int64)
        paths = self._rows(self.plans, sentences, np.int64)  # (N, K, T[, M])
        probs = None
        if self.action_probs is not None:
            probs = step_probs(self._rows(self.action_probs, sentences, np.float32))  # (N, K, T, M)
        shape = (len(sentences), self.num_paths, self.horizon)
        if self.path_counts is None:
            return Plans(paths, torch.ones(shape, dtype=torch.bool), probs)
        from planlm.plans.policy import path_mask_from_counts

        return Plans(paths, path_mask_from_counts(torch.from_numpy(self.path_counts[sentences]), self.num_paths,
                                                  self.horizon), probs)

    def _rows(self, array: np.ndarray, sentences: np.ndarray, dtype) -> torch.Tensor:
        rows = torch.from_numpy(np.asarray(array[sentences], dtype=dtype))  # (N, K or 1, T[, M])
        return rows.expand(-1, self.repeat, *rows.shape[2:]).contiguous() if self.repeat > 1 else rows


def plan_source(spec: PlanSpec, prepared: PreparedDataset, split: PreparedSplit, *,
                sentences: Optional[np.ndarray] = None, device: str | torch.device = "cpu", precision: str = "fp32",
                batch_size: int = 256) -> Optional[PlanSource]:
    """The source of a resolved spec (None for kind none). Planner plans come from ``spec.plans_dir`` when set,
    else the planner of ``spec.planner_dir`` runs now on ``sentences`` (default: every boundary of the split)."""
    if spec.kind == PlanKind.none:
        return None
    spec.check_source()
    if spec.kind == PlanKind.fixed:
        return FixedPlans(spec.fixed_action, spec.num_paths, spec.horizon)
    if spec.kind == PlanKind.oracle:
        return OraclePlans(split, spec.num_paths, spec.horizon)
    if spec.plans_dir:
        return cached_plans(spec, prepared, split)
    sentences = np.arange(split.num_sentences) if sentences is None else np.asarray(sentences, dtype=np.int64)
    return planner_plans(spec, prepared, split, sentences, torch.device(device), precision, batch_size)


def cached_plans(spec: PlanSpec, prepared: PreparedDataset, split: PreparedSplit) -> CachedPlans:
    """The plans of ``split`` in the cache ``spec.plans_dir``, after checking that the cache fits the spec and
    the prepared corpus (codebook, K, T, rows)."""
    from planlm.plans.cache import load_path_counts, load_plans

    check_cache(spec)
    argmax = spec.kind == PlanKind.planner_argmax
    plans = load_plans(spec.plans_dir, split.name, prepared=prepared, argmax=argmax)
    counts = None if argmax else load_path_counts(spec.plans_dir, split.name)  # None: a cache made before policies
    if spec.expectation:
        from planlm.plans.cache import load_expected

        actions, probs = load_expected(spec.plans_dir, split.name, argmax=argmax)
        return CachedPlans(actions, spec.num_paths, spec.horizon, counts, probs)
    return CachedPlans(plans, spec.num_paths, spec.horizon, counts)


def check_cache(spec: PlanSpec, prepared: PreparedDataset | None = None) -> dict:
    """The manifest of the plan cache ``spec.plans_dir``, after checking its horizon and K (and, with
    ``prepared``, its codebook)."""
    from planlm.plans.cache import cache_manifest

    where = Path(spec.plans_dir) / "manifest.json"
    manifest = cache_manifest(spec.plans_dir, prepared)
    if int(manifest["horizon"]) != spec.horizon:
        raise PlanlmError(f"{where}: cached horizon T={manifest['horizon']} but --plans.horizon {spec.horizon}; set "
                          f"horizon: {manifest['horizon']} or sample plans with T={spec.horizon}")
    if spec.kind == PlanKind.planner_sampled and int(manifest["num_paths"]) != spec.num_paths:
        raise PlanlmError(f"{where}: cached K={manifest['num_paths']} paths but --plans.num_paths {spec.num_paths}; "
                          f"set num_paths: {manifest['num_paths']} or sample plans with K={spec.num_paths}")
    _check_cached_expectation(spec, manifest, where)
    return manifest


def _check_cached_expectation(spec: PlanSpec, manifest: dict, where: Path) -> None:
    """A cache of plans in expectation is read only in expectation, with its top_actions, and vice versa."""
    from planlm.plans.cache import cached_top_actions

    cached = cached_top_actions(manifest)
    if spec.expectation and not cached:
        raise PlanlmError(f"{where}: the plan cache holds only sampled actions, not the step distributions "
                          f"--plans.expectation true reads; sample one with `planlm sample-plans --expectation true` "
                          f"(or set --plans.expectation false)")
    if cached and not spec.expectation:
        raise PlanlmError(f"{where}: the plan cache holds plans in expectation (top {cached} actions per step); set "
                          f"--plans.expectation true, or give a cache sampled without --expectation")
    if cached and cached != spec.top_actions:
        raise PlanlmError(f"{where}: the cached plans in expectation keep the top {cached} actions per step, not "
                          f"--plans.top_actions {spec.top_actions}; set top_actions: {cached} or resample with it")


def planner_plans(spec: PlanSpec, prepared: PreparedDataset, split: PreparedSplit, sentences: np.ndarray,
                  device: torch.device, precision: str = "fp32", batch_size: int = 256) -> CachedPlans:
    """Plans the planner of ``spec.planner_dir`` computes now for ``sentences`` (the other rows of the full-size
    arrays stay zero and are never read): the argmax path, or K sampled paths under the spec's path policy."""
    from planlm.models.planner import Planner
    from planlm.plans.sampling import compute_plans

    planner = Planner.for_corpus(spec.planner_dir, prepared, device)
    if spec.expectation:
        return _expected_planner_plans(spec, planner, split, sentences, device, precision, batch_size)
    if spec.kind == PlanKind.planner_argmax:
        argmax = np.zeros((split.num_sentences, spec.horizon), dtype=np.int64)
        greedy = compute_plans(planner, split, 1, spec.horizon, 0.0, spec.seed, batch_size=batch_size,
                               device=str(device), sentences=sentences, precision=precision)  # (N, 1, T)
        argmax[sentences] = greedy[:, 0]
        return CachedPlans(argmax, spec.num_paths, spec.horizon)
    plans = np.zeros((split.num_sentences, spec.num_paths, spec.horizon), dtype=np.int64)
    counts = np.zeros(len(sentences), dtype=np.int64)
    plans[sentences] = compute_plans(planner, split, spec.num_paths, spec.horizon, spec.temperature, spec.seed,
                                     batch_size=batch_size, device=str(device), sentences=sentences,
                                     precision=precision, policy=spec.path_policy, num_paths_out=counts)
    path_counts = np.zeros(split.num_sentences, dtype=np.int64)
    path_counts[sentences] = counts
    return CachedPlans(plans, spec.num_paths, spec.horizon, path_counts)


def _expected_planner_plans(spec: PlanSpec, planner, split: PreparedSplit, sentences: np.ndarray,
                            device: torch.device, precision: str, batch_size: int) -> CachedPlans:
    """Plans in expectation the planner computes now, in the arrays and types of a plan cache (the same vectors as
    from ``sample-plans --expectation true``): the steps of K sampled paths, or of the greedy path."""
    from planlm.plans.cache import expected_action_dtype
    from planlm.plans.sampling import compute_plans

    argmax = spec.kind == PlanKind.planner_argmax
    kept = min(spec.top_actions, planner.config.num_actions)
    shape = (split.num_sentences, *(() if argmax else (spec.num_paths,)), spec.horizon, kept)
    steps = (np.zeros(shape, expected_action_dtype(planner.config.num_actions)), np.zeros(shape, np.float16))
    chosen = tuple(np.zeros((len(sentences), *shape[1:]), x.dtype) for x in steps)
    paths = np.zeros((len(sentences), 1 if argmax else spec.num_paths, spec.horizon), dtype=np.int64)
    greedy = np.zeros((len(sentences), spec.horizon), dtype=np.int64) if argmax else None
    compute_plans(planner, split, 1 if argmax else spec.num_paths, spec.horizon, spec.temperature, spec.seed,
                  batch_size=batch_size, device=str(device), sentences=sentences, out=paths, argmax_out=greedy,
                  precision=precision, top_actions=spec.top_actions, expected_out=None if argmax else chosen,
                  argmax_expected_out=chosen if argmax else None)
    for full, rows in zip(steps, chosen):
        full[sentences] = rows
    return CachedPlans(steps[0], spec.num_paths, spec.horizon, action_probs=steps[1])


class ShuffledPlans:
    """A source whose sentence s gets the plan ``source`` gives sentence ``permutation[s]`` (plan usage)."""

    def __init__(self, source: PlanSource, permutation: np.ndarray):
        self.source, self.permutation = source, np.asarray(permutation, dtype=np.int64)
        self.num_paths, self.horizon = source.num_paths, source.horizon

    def __call__(self, sentences: np.ndarray):
        return self.source(self.permutation[np.asarray(sentences, dtype=np.int64)])


__all__ = ["Plans", "PlanSource", "FixedPlans", "OraclePlans", "CachedPlans", "ShuffledPlans", "plan_source",
           "cached_plans", "check_cache", "planner_plans"]
