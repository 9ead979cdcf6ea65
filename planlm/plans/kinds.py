"""The kinds of plans: ``PlanKind``, what one kind of plans is and needs, and the kinds planlm ships.

A ``PlanKind`` says how one kind of plans is made: the fields of a resolved ``PlanConfig`` it decides and checks
(``normalise``, ``check``), the plans of a batch of sentence boundaries (``plan``) and the source a split's plans
are read from (``source``). Every method reads the resolved config as ``plans`` (``planlm.plans.config``: the
same values as the ``--plans.*`` flags). The registry (``planlm.plans.registry``) finds a kind by its name or its
import path. Built in:

- ``none`` (``NoneKind``): no plans (the plain LM, no adapter);
- ``fixed`` (``FixedKind``): every step of every path is one constant action (the Fixed baseline: no information);
- ``oracle`` (``OracleKind``): the true actions of the next T sentences (an upper bound);
- ``planner_argmax`` (``PlannerArgmaxKind``): the planner's greedy path, repeated K times (Cornille et al. at
  T = K = 1);
- ``planner_sampled`` (``PlannerSampledKind``): K paths sampled at temperature tau (ours), as many per boundary
  as the path policy gives (``planlm.plans.policy``).

The planner kinds (``PlannerKind``) ``draw`` (``Draw``: the paths the planner computed, before the argmax path is
repeated K times): the plan cache stores draws (``planlm.plans.sampling``), and a live source draws the boundaries
a command asks for into arrays of the same layout (``planlm.plans.draws``, one seeded walk over the split either
way). In joint training (``planlm train-lm --train.joint true``) they also make ``joint_plans``: the same draws,
with step probabilities that carry the planner's gradient.

A new kind subclasses ``PlanKind`` (``plan`` at least) in your own module (docs/extending.md adds one).

Letters: B boundaries, K paths (K' drawn: 1 for the argmax path), T horizon, M top actions, N boundaries asked
for, N_sent sentences of the split.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Optional

import numpy as np
import torch

from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.errors import PlanlmError
from planlm.models.dynamics import top_distribution
from planlm.plans.cache import check_cache, load_expected, load_path_counts, load_plans
from planlm.plans.contexts import Boundaries, check_split, split_batches
from planlm.plans.draws import Draw, draw_plans
from planlm.plans.policy import PathPolicy, sample_with_policy
from planlm.plans.sources import CachedPlans, FixedPlans, OraclePlans, PlanSource, Plans, TablePlans


class PlanKind(ABC):
    """One kind of plans. A subclass sets ``name`` and implements ``plan``; the defaults suit a kind that reads
    neither a planner nor the true future, whose plans of a split are made once (in order, from ``plans.seed``)."""

    name: str = ""
    conditions: bool = True
    """The LM reads these plans through an adapter (False: kind none, the plain LM)."""
    uses_planner: bool = False
    """The plans come from a planner (--plans.planner_dir) or a cache of its plans (--plans.plans_dir)."""
    reads_future: bool = False
    """The plans read the true actions ahead (oracle): generation needs a test article's prefix, not free text; the
    ceiling of the report's share of the oracle's gain."""
    samples_paths: bool = False
    """A planner samples K paths per boundary: K (and a path policy) is the planning compute it spends."""
    greedy: bool = False
    """A planner draws one path per boundary, its argmax path (a plan cache's ``<split>.argmax`` arrays)."""
    constant: bool = False
    """Every plan is one constant action (Fixed: action 0): no information about the text, the floor a plan's gain
    is measured from (the report's share of the oracle's gain)."""

    def normalise(self, plans) -> None:
        """Set, in place on a freshly resolved config, the fields this kind decides: without a planner, no planner
        folders and no path policy (every path is the same plan)."""
        plans.planner_dir = plans.plans_dir = None
        plans.path_policy = PathPolicy()

    def check(self, plans) -> None:
        """One-line errors for settings this kind cannot serve."""
        if plans.expectation:
            raise PlanlmError(f"--plans.expectation true with --plans.kind {plans.kind}: {plans.kind} plans have no "
                              f"planner distribution to average over; set --plans.expectation false or --plans.kind "
                              f"planner_sampled / planner_argmax")

    def check_source(self, plans) -> None:
        """One-line errors for plans with nothing to come from (checked where plans are read)."""

    def check_actions(self, plans, num_actions: int, where: str) -> None:
        """One-line errors for plans naming actions that the corpus of ``where`` (A = ``num_actions``) lacks."""

    def paths_drawn(self, plans) -> int:
        """Paths the planner computes per boundary (the planning compute; 0 without a planner)."""
        return 0

    @abstractmethod
    def plan(self, boundaries: Boundaries, plans, rng: Optional[torch.Generator],
             planner=None) -> Plans:
        """The plans of B boundaries: action_paths (B, K, T), path_mask (B, K, T) (in expectation also the
        top actions (B, K, T, M) and their renormalised probabilities)."""

    def source(self, plans, prepared: PreparedDataset, split: PreparedSplit, sentences: np.ndarray,
               device: torch.device, precision: str, batch_size: int) -> Optional[PlanSource]:
        """The plans of ``sentences`` (N,), made once in the walk's order (seeded by ``plans.seed``)."""
        check_split(split, "the plans")
        rng = torch.Generator().manual_seed(plans.seed)
        batches = split_batches(split, sentences, prepared.num_actions, batch_size)
        parts = [self.plan(boundaries, plans, rng) for _, boundaries in batches]
        made = Plans(*(None if part[0] is None else torch.cat(part) for part in zip(*parts)))
        return TablePlans(made, sentences, split.num_sentences)


class NoneKind(PlanKind):
    name = "none"
    conditions = False

    def plan(self, boundaries, plans, rng, planner=None) -> Plans:
        raise PlanlmError("plans kind none makes no plans (the plain LM); choose another --plans.kind")

    def source(self, plans, prepared, split, *_) -> None:
        return None


class FixedKind(PlanKind):
    name = "fixed"
    constant = True

    def plan(self, boundaries, plans, rng, planner=None) -> Plans:
        return FixedPlans(plans.fixed_action, plans.num_paths, plans.horizon)(np.zeros(len(boundaries), np.int64))

    def source(self, plans, prepared, split, *_) -> FixedPlans:
        return FixedPlans(plans.fixed_action, plans.num_paths, plans.horizon)


class OracleKind(PlanKind):
    name = "oracle"
    reads_future = True

    def plan(self, boundaries, plans, rng, planner=None) -> Plans:
        """The true actions ahead of each boundary; a boundary whose future is unknown (``known`` False: past the
        article's end in generation) gets a plan with no valid step."""
        paths, mask, _ = OraclePlans(boundaries.split, plans.num_paths, plans.horizon)(boundaries.sentences)
        if boundaries.known is not None:
            mask = mask & torch.from_numpy(np.asarray(boundaries.known, dtype=bool))[:, None, None]
        return Plans(paths, mask)

    def source(self, plans, prepared, split, *_) -> OraclePlans:
        return OraclePlans(split, plans.num_paths, plans.horizon)


# --------------------------------------------------------------------------------------------- planner kinds
class PlannerKind(PlanKind):
    """Plans a planner draws: from a plan cache (``plans_dir``) or the planner (``planner_dir``) run now."""

    uses_planner = True

    def normalise(self, plans) -> None:
        pass

    def check(self, plans) -> None:
        pass  # a planner's plans may be read in expectation

    def check_source(self, plans) -> None:
        if not (plans.plans_dir or plans.planner_dir):
            raise PlanlmError(f"--plans.kind {plans.kind} needs --plans.plans_dir (a plan cache) or "
                              f"--plans.planner_dir (a planner); set one of them")

    def step_temperature(self, plans) -> float:
        """The temperature of the step distributions that plans in expectation read."""
        return plans.temperature

    def article_batches(self, plans) -> bool:
        """Whether an article-level planner can draw these plans from article rows (one pass per article)."""
        return True

    @abstractmethod
    def draw(self, boundaries: Boundaries, plans, rng: Optional[torch.Generator], planner) -> Draw:
        """The paths the planner computes for B boundaries (``Draw``), on the planner's device."""

    def plan(self, boundaries, plans, rng, planner=None) -> Plans:
        if planner is None:
            raise PlanlmError(f"plans kind {plans.kind} needs a planner (set --plans.planner_dir)")
        return self.draw(boundaries, plans, rng, planner).plans(plans.num_paths)

    def joint_plans(self, boundaries: Boundaries, plans, rng: Optional[torch.Generator], planner) -> Plans:
        """The plans of B boundaries (``boundaries.context_embeds``) whose step probabilities carry the planner's
        gradient (joint training): the paths ``draw`` gives (no gradient), then each step's distribution given
        its path's own prefix (teacher forcing, with gradient), as the plans in expectation of the same draws hold
        it. In expectation the adapter reads the expected embedding; otherwise the straight-through estimator: the
        drawn action forward (the sampled plans' vector, exactly), the expected embedding's gradient backward."""
        draw, logits = self.joint_draw(boundaries, plans, rng, planner)  # paths (B, K', T), logits (B, K', T, A)
        ids, probs = top_distribution(logits.flatten(0, -2), self.step_temperature(plans), plans.top_actions)
        steps = tuple(x.view(*draw.paths.shape, -1) for x in (ids, probs))  # (B, K', T, M) each
        made = Draw(draw.paths, draw.counts, steps).plans(plans.num_paths)
        if plans.expectation:
            return made
        drawn = draw.paths.expand(-1, plans.num_paths, -1).unsqueeze(-1)  # (B, K, T, 1)
        soft = torch.cat([torch.zeros_like(drawn, dtype=made.action_probs.dtype), made.action_probs], -1)
        hard = torch.zeros_like(soft)
        hard[..., 0] = 1.0
        # (B, K, T, 1+M): the drawn action at weight 1 and the top M at weight 0 forward, but their gradient backward
        return Plans(torch.cat([drawn, made.action_paths], -1), made.path_mask, hard + (soft - soft.detach()))

    def joint_draw(self, boundaries: Boundaries, plans, rng: Optional[torch.Generator],
                   planner) -> tuple[Draw, torch.Tensor]:
        """``draw``'s paths (no gradient) and the logits of each of their steps given the path's own prefix, with
        gradient (``Planner.path_logits``)."""
        draw = self.draw(boundaries, replace(plans, expectation=False), rng, planner)  # paths (B, K', T)
        return draw, planner.path_logits(boundaries.context_embeds, boundaries.context_mask, draw.paths)

    def source(self, plans, prepared, split, sentences, device, precision, batch_size) -> CachedPlans:
        """Rows of the plan cache ``plans.plans_dir``, or the planner of ``plans.planner_dir`` run now on
        ``sentences`` alone (arrays of their rows only, in the cache's layout)."""
        if plans.plans_dir:
            return self.cached(plans, prepared, split)
        from planlm.models.planner import Planner

        planner = Planner.for_corpus(plans.planner_dir, prepared, device)
        arrays = draw_plans(planner, split, plans, sentences, device=device, precision=precision,
                            batch_size=batch_size)
        return arrays.source(plans, sentences, split.num_sentences)

    def cached(self, plans, prepared, split) -> CachedPlans:
        """The plans of ``split`` in the cache ``plans.plans_dir``, checked against ``plans`` and the corpus."""
        check_cache(plans)
        paths = load_plans(plans.plans_dir, split.name, prepared=prepared, argmax=self.greedy)
        counts = None if self.greedy else load_path_counts(plans.plans_dir, split.name)  # None: made before policies
        if plans.expectation:
            actions, probs = load_expected(plans.plans_dir, split.name, argmax=self.greedy)
            return CachedPlans(actions, plans.num_paths, plans.horizon, counts, probs)
        return CachedPlans(paths, plans.num_paths, plans.horizon, counts)


class PlannerArgmaxKind(PlannerKind):
    name = "planner_argmax"
    greedy = True

    def normalise(self, plans) -> None:
        plans.temperature = 0.0
        plans.path_policy = PathPolicy()  # K copies of one path: no policy

    def paths_drawn(self, plans) -> int:
        return 1

    def step_temperature(self, plans) -> float:
        return 1.0  # the planner's own distribution along the greedy path (tau 0 would be the path itself)

    def draw(self, boundaries, plans, rng, planner) -> Draw:
        """The greedy path (B, 1, T); in expectation with the planner's distribution (tau 1) at each of its steps."""
        horizon, steps = plans.horizon, None
        logits, greedy = planner.decode(boundaries.start_state(planner, horizon), horizon)  # (B, T, A), (B, T)
        if plans.expectation:
            ids, probs = top_distribution(logits.flatten(0, 1), self.step_temperature(plans), plans.top_actions)
            steps = tuple(x.view(*greedy.shape, -1).unsqueeze(1) for x in (ids, probs))  # (B, 1, T, M)
        return Draw(greedy.unsqueeze(1), torch.ones(len(greedy), dtype=torch.long), steps)


class PlannerSampledKind(PlannerKind):
    name = "planner_sampled"
    samples_paths = True

    def check(self, plans) -> None:
        super().check(plans)
        if plans.expectation and plans.path_policy.adaptive:
            raise PlanlmError(f"--plans.expectation true with --plans.path_policy.kind {plans.path_policy.kind}: an "
                              f"expected plan needs no adaptive paths; drop --plans.path_policy or the expectation")

    def paths_drawn(self, plans) -> int:
        return plans.num_paths

    def article_batches(self, plans) -> bool:
        return not plans.path_policy.adaptive or plans.temperature == 0

    def joint_draw(self, boundaries, plans, rng, planner):
        """The same draws and logits in one pass (``Planner.sample_path_logits``): the logits the paths were drawn
        from carry the gradient (``planlm.plans.config.check_joint_plans`` leaves no greedy nor adaptive sampling
        here)."""
        paths, logits = planner.sample_path_logits(boundaries.context_embeds, boundaries.context_mask,
                                                   plans.num_paths, plans.horizon, plans.temperature, rng)
        counts = torch.full((len(boundaries),), plans.num_paths)
        return Draw(paths, counts, None), logits

    def draw(self, boundaries, plans, rng, planner) -> Draw:
        """K sampled paths (B, K, T), as many per boundary as the path policy gives; in expectation with the
        distribution each step was drawn from (the same draws). Every kind of a batch continues one start state
        (``Boundaries.start_state``); an adaptive policy reads contexts, not article rows (``article_batches``)."""
        state, steps = boundaries.start_state(planner, plans.horizon), None
        counts = torch.full((len(boundaries),), plans.num_paths)
        if plans.temperature == 0:  # every path is the greedy one
            paths = planner.decode(state, plans.horizon)[1][:, None].expand(-1, plans.num_paths, -1)  # (B, K, T)
            if plans.expectation:  # the distribution at tau 0 is the greedy action itself
                steps = (paths.unsqueeze(-1), torch.ones(*paths.shape, 1, device=paths.device))
        elif plans.expectation:
            paths, *steps = planner.sample_from(state, plans.num_paths, plans.temperature, rng, plans.top_actions)
        elif plans.path_policy.adaptive:
            paths, counts = sample_with_policy(planner, boundaries.context_embeds, boundaries.context_mask,
                                               plans.path_policy, plans.horizon, plans.temperature, rng, state=state)
        else:
            paths = planner.sample_from(state, plans.num_paths, plans.temperature, rng)
        return Draw(paths, counts, None if steps is None else tuple(steps))


BUILT_IN = (NoneKind, FixedKind, OracleKind, PlannerArgmaxKind, PlannerSampledKind)
"""The kinds planlm ships, registered under their names (``planlm.plans.registry``)."""

__all__ = ["PlanKind", "NoneKind", "FixedKind", "OracleKind", "PlannerKind", "PlannerArgmaxKind",
           "PlannerSampledKind", "BUILT_IN"]
