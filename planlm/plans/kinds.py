"""The plan kinds: one strategy per kind, registered in one place, and the one way to make plans.

A ``PlanStrategy`` says how one kind of plans is made and what it needs: the fields of a ``PlanSpec`` it decides
and checks (``normalise``, ``check``), the plans of a batch of sentence boundaries (``plan``) and the source a
split's plans are read from (``source``). ``register_plan_kind`` adds one under its name; every command finds the
kind of a spec with ``plan_kind(spec.kind)`` and makes plans through ``plan`` (a batch: generation) and
``plan_source`` (a split: training, evaluation, sweeps, lm-eval). Built in (``PlanKind``):

- ``none``: no plans (the plain LM, no adapter);
- ``fixed``: every step of every path is one constant action (the Fixed baseline: no information);
- ``oracle``: the true actions of the next T sentences (an upper bound);
- ``planner_argmax``: the planner's greedy path, repeated K times (Cornille et al. at T = K = 1);
- ``planner_sampled``: K paths sampled at temperature tau (ours), as many per boundary as the path policy gives
  (``planlm.plans.policy``).

The planner kinds ``draw`` (``Draw``: the paths the planner computed, before the argmax path is repeated K
times): the plan cache stores draws (``planlm.plans.sampling``), and a live source draws the boundaries a command
asks for into arrays of the same layout (``draw_split``, one seeded walk over the split either way). In joint
training (``planlm train-lm --train.joint true``; ``check_joint_plans``) they also make ``joint_plans``: the same draws,
with step probabilities that carry the planner's gradient.

A new kind subclasses ``PlanStrategy`` (``plan`` at least) in your own module: ``--plans.kind`` names it by its import
path (``my_package.module:ClassName``), which a saved model records, or by its name once ``register_plan_kind`` has
added it (docs/extending.md adds one).

Letters: B boundaries, K paths (K' drawn: 1 for the argmax path), T horizon, M top actions, N boundaries asked
for, N_sent sentences of the split.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np
import torch

from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.errors import PlanlmError
from planlm.models.dynamics import top_distribution
from planlm.plans.cache import cache_manifest, cached_top_actions, load_expected, load_path_counts, load_plans
from planlm.plans.contexts import MAX_ROWS, Boundaries, check_split, split_batches
from planlm.plans.draws import Draw, DrawArrays, draw_split, in_memory
from planlm.plans.policy import PathPolicy, sample_with_policy
from planlm.plans.sources import CachedPlans, FixedPlans, OraclePlans, PlanSource, Plans, TablePlans
from planlm.plugins import PluginImportError, UnknownKind, import_object, is_import_path

if TYPE_CHECKING:
    from planlm.plans.spec import PlanSpec


class PlanKind(str, Enum):
    """The built-in plan kinds (``register_plan_kind`` adds others, named by a plain string)."""

    none = "none"
    fixed = "fixed"
    oracle = "oracle"
    planner_argmax = "planner_argmax"
    planner_sampled = "planner_sampled"

    @property
    def uses_planner(self) -> bool:
        return plan_kind(self).uses_planner

    def __str__(self) -> str:
        return self.value


class PlanStrategy(ABC):
    """One kind of plans. A subclass sets ``name`` and implements ``plan``; the defaults suit a kind that reads
    neither a planner nor the true future, whose plans of a split are made once (in order, from ``spec.seed``)."""

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
    constant: bool = False
    """Every plan is one constant action (Fixed: action 0): no information about the text, the floor a plan's gain
    is measured from (the report's share of the oracle's gain)."""

    def normalise(self, spec: PlanSpec) -> None:
        """Set, in place on a freshly resolved spec, the fields this kind decides: without a planner, no planner
        folders and no path policy (every path is the same plan)."""
        spec.planner_dir = spec.plans_dir = None
        spec.path_policy = PathPolicy()

    def check(self, spec: PlanSpec) -> None:
        """One-line errors for settings this kind cannot serve."""
        if spec.expectation:
            raise PlanlmError(f"--plans.expectation true with --plans.kind {spec.kind}: {spec.kind} plans have no "
                              f"planner distribution to average over; set --plans.expectation false or --plans.kind "
                              f"planner_sampled / planner_argmax")

    def check_source(self, spec: PlanSpec) -> None:
        """One-line errors for plans with nothing to come from (checked where plans are read)."""

    def check_actions(self, spec: PlanSpec, num_actions: int, where: str) -> None:
        """One-line errors for plans naming actions that the corpus of ``where`` (A = ``num_actions``) lacks."""

    def paths_drawn(self, spec: PlanSpec) -> int:
        """Paths the planner computes per boundary (the planning compute; 0 without a planner)."""
        return 0

    @abstractmethod
    def plan(self, boundaries: Boundaries, spec: PlanSpec, rng: Optional[torch.Generator],
             planner=None) -> Plans:
        """The plans of B boundaries: action_paths (B, K, T), path_mask (B, K, T) (in expectation also the
        top actions (B, K, T, M) and their renormalised probabilities)."""

    def source(self, spec: PlanSpec, prepared: PreparedDataset, split: PreparedSplit, sentences: np.ndarray,
               device: torch.device, precision: str, batch_size: int) -> Optional[PlanSource]:
        """The plans of ``sentences`` (N,), made once in the walk's order (seeded by ``spec.seed``)."""
        check_split(split, "the plans")
        rng = torch.Generator().manual_seed(spec.seed)
        batches = split_batches(split, sentences, prepared.num_actions, batch_size)
        made = [self.plan(boundaries, spec, rng) for _, boundaries in batches]
        plans = Plans(*(None if parts[0] is None else torch.cat(parts) for parts in zip(*made)))
        return TablePlans(plans, sentences, split.num_sentences)


class NoPlans(PlanStrategy):
    name = "none"
    conditions = False

    def plan(self, boundaries, spec, rng, planner=None) -> Plans:
        raise PlanlmError("plans kind none makes no plans (the plain LM); choose another --plans.kind")

    def source(self, spec, prepared, split, *_) -> None:
        return None


class FixedKind(PlanStrategy):
    name = "fixed"
    constant = True

    def plan(self, boundaries, spec, rng, planner=None) -> Plans:
        return FixedPlans(spec.fixed_action, spec.num_paths, spec.horizon)(np.zeros(len(boundaries), np.int64))

    def source(self, spec, prepared, split, *_) -> FixedPlans:
        return FixedPlans(spec.fixed_action, spec.num_paths, spec.horizon)


class OracleKind(PlanStrategy):
    name = "oracle"
    reads_future = True

    def plan(self, boundaries, spec, rng, planner=None) -> Plans:
        """The true actions ahead of each boundary; a boundary whose future is unknown (``known`` False: past the
        article's end in generation) gets a plan with no valid step."""
        paths, mask, _ = OraclePlans(boundaries.split, spec.num_paths, spec.horizon)(boundaries.sentences)
        if boundaries.known is not None:
            mask = mask & torch.from_numpy(np.asarray(boundaries.known, dtype=bool))[:, None, None]
        return Plans(paths, mask)

    def source(self, spec, prepared, split, *_) -> OraclePlans:
        return OraclePlans(split, spec.num_paths, spec.horizon)


# --------------------------------------------------------------------------------------------- planner kinds
class PlannerKind(PlanStrategy):
    """Plans a planner draws: from a plan cache (``plans_dir``) or the planner (``planner_dir``) run now."""

    uses_planner = True
    greedy = False
    """The argmax path, one per boundary (the cache's ``<split>.argmax`` arrays)."""

    def normalise(self, spec) -> None:
        pass

    def check(self, spec) -> None:
        pass  # a planner's plans may be read in expectation

    def check_source(self, spec) -> None:
        if not (spec.plans_dir or spec.planner_dir):
            raise PlanlmError(f"--plans.kind {spec.kind} needs --plans.plans_dir (a plan cache) or "
                              f"--plans.planner_dir (a planner); set one of them")

    def step_temperature(self, spec) -> float:
        """The temperature of the step distributions that plans in expectation read."""
        return spec.temperature

    def article_batches(self, spec) -> bool:
        """Whether an article-level planner can draw these plans from article rows (one pass per article)."""
        return True

    @abstractmethod
    def draw(self, boundaries: Boundaries, spec: PlanSpec, rng: Optional[torch.Generator], planner) -> Draw:
        """The paths the planner computes for B boundaries (``Draw``), on the planner's device."""

    def plan(self, boundaries, spec, rng, planner=None) -> Plans:
        if planner is None:
            raise PlanlmError(f"plans kind {spec.kind} needs a planner (set --plans.planner_dir)")
        return self.draw(boundaries, spec, rng, planner).plans(spec.num_paths)

    def joint_plans(self, boundaries: Boundaries, spec: PlanSpec, rng: Optional[torch.Generator], planner) -> Plans:
        """The plans of B boundaries (``boundaries.context_embeds``) whose step probabilities carry the planner's
        gradient (joint training): the paths ``draw`` gives (no gradient), then each step's distribution given
        its path's own prefix (teacher forcing, with gradient), as the plans in expectation of the same draws hold
        it. In expectation the adapter reads the expected embedding; otherwise the straight-through estimator: the
        drawn action forward (the sampled plans' vector, exactly), the expected embedding's gradient backward."""
        draw, logits = self.joint_draw(boundaries, spec, rng, planner)  # paths (B, K', T), logits (B, K', T, A)
        ids, probs = top_distribution(logits.flatten(0, -2), self.step_temperature(spec), spec.top_actions)
        steps = tuple(x.view(*draw.paths.shape, -1) for x in (ids, probs))  # (B, K', T, M) each
        plans = Draw(draw.paths, draw.counts, steps).plans(spec.num_paths)
        if spec.expectation:
            return plans
        drawn = draw.paths.expand(-1, spec.num_paths, -1).unsqueeze(-1)  # (B, K, T, 1)
        soft = torch.cat([torch.zeros_like(drawn, dtype=plans.action_probs.dtype), plans.action_probs], -1)
        hard = torch.zeros_like(soft)
        hard[..., 0] = 1.0
        # (B, K, T, 1+M): the drawn action at weight 1 and the top M at weight 0 forward, but their gradient backward
        return Plans(torch.cat([drawn, plans.action_paths], -1), plans.path_mask, hard + (soft - soft.detach()))

    def joint_draw(self, boundaries: Boundaries, spec: PlanSpec, rng: Optional[torch.Generator],
                   planner) -> tuple[Draw, torch.Tensor]:
        """``draw``'s paths (no gradient) and the logits of each of their steps given the path's own prefix, with
        gradient (``Planner.path_logits``)."""
        draw = self.draw(boundaries, replace(spec, expectation=False), rng, planner)  # paths (B, K', T)
        return draw, planner.path_logits(boundaries.context_embeds, boundaries.context_mask, draw.paths)

    def source(self, spec, prepared, split, sentences, device, precision, batch_size) -> CachedPlans:
        """Rows of the plan cache ``spec.plans_dir``, or the planner of ``spec.planner_dir`` run now on ``sentences``
        alone (arrays of their rows only, in the cache's layout)."""
        if spec.plans_dir:
            return self.cached(spec, prepared, split)
        from planlm.models.planner import Planner

        planner = Planner.for_corpus(spec.planner_dir, prepared, device)
        arrays = draw_plans(planner, split, spec, sentences, device=device, precision=precision, batch_size=batch_size)
        return arrays.source(spec, sentences, split.num_sentences)

    def cached(self, spec, prepared, split) -> CachedPlans:
        """The plans of ``split`` in the cache ``spec.plans_dir``, checked against the spec and the corpus."""
        self.check_cache(spec)
        plans = load_plans(spec.plans_dir, split.name, prepared=prepared, argmax=self.greedy)
        counts = None if self.greedy else load_path_counts(spec.plans_dir, split.name)  # None: made before policies
        if spec.expectation:
            actions, probs = load_expected(spec.plans_dir, split.name, argmax=self.greedy)
            return CachedPlans(actions, spec.num_paths, spec.horizon, counts, probs)
        return CachedPlans(plans, spec.num_paths, spec.horizon, counts)

    def check_cache(self, spec, prepared: PreparedDataset | None = None) -> dict:
        """The manifest of the cache ``spec.plans_dir``, after checking its horizon, K, plans in expectation and
        (with ``prepared``) codebook."""
        where = Path(spec.plans_dir) / "manifest.json"
        manifest = cache_manifest(spec.plans_dir, prepared)
        if int(manifest["horizon"]) != spec.horizon:
            raise PlanlmError(f"{where}: cached horizon T={manifest['horizon']} but --plans.horizon {spec.horizon}; "
                              f"set horizon: {manifest['horizon']} or sample plans with T={spec.horizon}")
        if not self.greedy and int(manifest["num_paths"]) != spec.num_paths:
            raise PlanlmError(f"{where}: cached K={manifest['num_paths']} paths but --plans.num_paths "
                              f"{spec.num_paths}; set num_paths: {manifest['num_paths']} or sample plans with "
                              f"K={spec.num_paths}")
        _check_cached_expectation(spec, manifest, where)
        return manifest


class PlannerArgmax(PlannerKind):
    name = "planner_argmax"
    greedy = True

    def normalise(self, spec) -> None:
        spec.temperature = 0.0
        spec.path_policy = PathPolicy()  # K copies of one path: no policy

    def paths_drawn(self, spec) -> int:
        return 1

    def step_temperature(self, spec) -> float:
        return 1.0  # the planner's own distribution along the greedy path (tau 0 would be the path itself)

    def draw(self, boundaries, spec, rng, planner) -> Draw:
        """The greedy path (B, 1, T); in expectation with the planner's distribution (tau 1) at each of its steps."""
        horizon, steps = spec.horizon, None
        logits, greedy = planner.decode(boundaries.start_state(planner, horizon), horizon)  # (B, T, A), (B, T)
        if spec.expectation:
            ids, probs = top_distribution(logits.flatten(0, 1), self.step_temperature(spec), spec.top_actions)
            steps = tuple(x.view(*greedy.shape, -1).unsqueeze(1) for x in (ids, probs))  # (B, 1, T, M)
        return Draw(greedy.unsqueeze(1), torch.ones(len(greedy), dtype=torch.long), steps)


class PlannerSampled(PlannerKind):
    name = "planner_sampled"
    samples_paths = True

    def check(self, spec) -> None:
        super().check(spec)
        if spec.expectation and spec.path_policy.adaptive:
            raise PlanlmError(f"--plans.expectation true with --plans.path_policy.kind {spec.path_policy.kind}: an "
                              f"expected plan needs no adaptive paths; drop --plans.path_policy or the expectation")

    def paths_drawn(self, spec) -> int:
        return spec.num_paths

    def article_batches(self, spec) -> bool:
        return not spec.path_policy.adaptive or spec.temperature == 0

    def joint_draw(self, boundaries, spec, rng, planner):
        """The same draws and logits in one pass (``Planner.sample_path_logits``): the logits the paths were drawn
        from carry the gradient (``check_joint_plans`` leaves no greedy nor adaptive sampling here)."""
        paths, logits = planner.sample_path_logits(boundaries.context_embeds, boundaries.context_mask,
                                                   spec.num_paths, spec.horizon, spec.temperature, rng)
        counts = torch.full((len(boundaries),), spec.num_paths)
        return Draw(paths, counts, None), logits

    def draw(self, boundaries, spec, rng, planner) -> Draw:
        """K sampled paths (B, K, T), as many per boundary as the path policy gives; in expectation with the
        distribution each step was drawn from (the same draws). Every kind of a batch continues one start state
        (``Boundaries.start_state``); an adaptive policy reads contexts, not article rows (``article_batches``)."""
        state, steps = boundaries.start_state(planner, spec.horizon), None
        counts = torch.full((len(boundaries),), spec.num_paths)
        if spec.temperature == 0:  # every path is the greedy one
            paths = planner.decode(state, spec.horizon)[1][:, None].expand(-1, spec.num_paths, -1)  # (B, K, T)
            if spec.expectation:  # the distribution at tau 0 is the greedy action itself
                steps = (paths.unsqueeze(-1), torch.ones(*paths.shape, 1, device=paths.device))
        elif spec.expectation:
            paths, *steps = planner.sample_from(state, spec.num_paths, spec.temperature, rng, spec.top_actions)
        elif spec.path_policy.adaptive:
            paths, counts = sample_with_policy(planner, boundaries.context_embeds, boundaries.context_mask,
                                               spec.path_policy, spec.horizon, spec.temperature, rng, state=state)
        else:
            paths = planner.sample_from(state, spec.num_paths, spec.temperature, rng)
        return Draw(paths, counts, None if steps is None else tuple(steps))


def check_joint_plans(spec: PlanSpec) -> None:
    """One-line errors for a resolved spec that joint training (``planlm train-lm --train.joint true``: the planner
    trains with the LM, ``PlannerKind.joint_plans``) cannot serve."""
    if not spec.strategy.uses_planner:
        raise PlanlmError(f"--train.joint true with --plans.kind {spec.kind}: {spec.kind} plans have no planner to "
                          f"train with the LM; set --train.joint false or --plans.kind planner_sampled / "
                          f"planner_argmax")
    if spec.plans_dir:
        raise PlanlmError(f"--train.joint true with --plans.plans_dir {spec.plans_dir}: joint training runs the "
                          f"planner on every batch instead of reading a plan cache; drop --plans.plans_dir and set "
                          f"--plans.planner_dir")
    if not spec.planner_dir:
        raise PlanlmError("--train.joint true needs --plans.planner_dir: the planner (`planlm train-planner`) to train "
                          "with the LM")
    if spec.path_policy.adaptive:
        raise PlanlmError(f"--train.joint true with --plans.path_policy.kind {spec.path_policy.kind}: joint training "
                          f"draws K paths at every boundary; drop --plans.path_policy")
    if spec.strategy.samples_paths and spec.temperature == 0:
        raise PlanlmError("--train.joint true with --plans.kind planner_sampled at --plans.temperature 0: the greedy "
                          "path carries no gradient to the planner; set a temperature > 0 or --plans.kind "
                          "planner_argmax (its distribution at tau 1)")


def _check_cached_expectation(spec, manifest: dict, where: Path) -> None:
    """A cache of plans in expectation is read only in expectation, with its top_actions, and vice versa."""
    cached = cached_top_actions(manifest)
    if spec.expectation and not cached:
        raise PlanlmError(f"{where}: the plan cache holds only sampled actions, not the step distributions "
                          f"--plans.expectation true reads; sample one with `planlm sample-plans --plans.expectation "
                          f"true` (or set --plans.expectation false)")
    if cached and not spec.expectation:
        raise PlanlmError(f"{where}: the plan cache holds plans in expectation (top {cached} actions per step); set "
                          f"--plans.expectation true, or give a cache sampled without --plans.expectation")
    if cached and cached != spec.top_actions:
        raise PlanlmError(f"{where}: the cached plans in expectation keep the top {cached} actions per step, not the "
                          f"{spec.top_actions} planlm keeps now; sample the cache again with `planlm sample-plans`")


# --------------------------------------------------------------------------------------------- draws of a split
def draw_plans(planner, split: PreparedSplit, spec: PlanSpec, sentences: Optional[np.ndarray] = None, *,
               device: str | torch.device = "cpu", precision: str = "fp32", batch_size: int = 256,
               max_rows: int = MAX_ROWS) -> DrawArrays:
    """What ``planner`` draws for a planner kind's resolved spec at ``sentences`` (N,) of ``split`` (default: every
    boundary), in memory: ``paths`` (N, K, T) sampled or (N, T) argmax, ``counts`` (N,), ``steps`` in expectation."""
    sentences = np.arange(split.num_sentences) if sentences is None else np.asarray(sentences, dtype=np.int64)
    kind = plan_kind(spec.kind)
    arrays = DrawArrays.allocate(kind, spec, planner.config.num_actions, len(sentences), in_memory)
    draw_split(planner, split, sentences, [(kind, spec, arrays)], torch.device(device), precision, batch_size,
               max_rows)
    return arrays


# --------------------------------------------------------------------------------------------- the registry
KINDS: dict[str, PlanStrategy] = {}


def register_plan_kind(strategy: PlanStrategy) -> PlanStrategy:
    """Add a plan kind under ``strategy.name`` (registering the same class again replaces it; another class under
    a taken name is an error)."""
    name = str(strategy.name)
    if not name:
        raise PlanlmError(f"{type(strategy).__name__}: a plan kind needs a name (set the class's name)")
    if name in KINDS and type(KINDS[name]) is not type(strategy):
        raise PlanlmError(f"plan kind {name!r} is already registered ({type(KINDS[name]).__name__}); choose another "
                          f"name")
    KINDS[name] = strategy
    return strategy


def plan_kind(name) -> PlanStrategy:
    """The strategy of a kind: a ``PlanKind``, a registered name, or an import path (``my_package.module:ClassName``,
    a ``PlanStrategy`` subclass made with no arguments, or an instance), imported now and registered under that path;
    one-line error naming the kinds, or the path and why it does not import."""
    key = str(name)
    if key in KINDS:
        return KINDS[key]
    if not is_import_path(key):
        raise UnknownKind("--plans.kind", key, list(KINDS), "plans kind")
    try:
        value = import_object(key, "plans kind")
    except PluginImportError as e:
        raise e.at("--plans.kind") from None
    strategy, wrong = value, ""
    if isinstance(value, type) and issubclass(value, PlanStrategy):
        try:
            strategy = value()
        except Exception as e:  # abstract, or a constructor that needs arguments
            wrong = f"{value.__name__}() failed: {type(e).__name__}: {' '.join(str(e).split())}"
    elif not isinstance(value, PlanStrategy):
        wrong = f"it is {value!r}, not a PlanStrategy subclass or instance (planlm.plans.kinds)"
    if wrong:
        raise PluginImportError(key, wrong, "--plans.kind", "plans kind", "name a PlanStrategy (docs/extending.md)")
    KINDS[key] = strategy
    return strategy


def kind_flag(name, flag: str) -> bool:
    """A flag of a kind's strategy (``uses_planner``, ``reads_future``, ``constant``, ...) read by name; False for a
    kind this process has not registered and cannot import (a run's record of a kind that someone's own module adds)."""
    try:
        strategy = plan_kind(name)
    except PlanlmError:
        return False
    return bool(getattr(strategy, flag))


for _strategy in (NoPlans(), FixedKind(), OracleKind(), PlannerArgmax(), PlannerSampled()):
    register_plan_kind(_strategy)


def plan(boundaries: Boundaries, spec: PlanSpec, rng: Optional[torch.Generator] = None, planner=None) -> Plans:
    """The plans of a batch of boundaries under a resolved spec: its kind's ``plan``."""
    return plan_kind(spec.kind).plan(boundaries, spec, rng, planner)


def plan_source(spec: PlanSpec, prepared: PreparedDataset, split: PreparedSplit, *,
                sentences: Optional[np.ndarray] = None, device: str | torch.device = "cpu", precision: str = "fp32",
                batch_size: int = 256) -> Optional[PlanSource]:
    """The source of a resolved spec's plans for ``split`` (None for kind none): its kind's ``source``. Planner
    plans come from ``spec.plans_dir`` when set, else the planner of ``spec.planner_dir`` runs now on ``sentences``
    (default: every boundary of the split)."""
    spec.check_source()
    sentences = np.arange(split.num_sentences) if sentences is None else np.asarray(sentences, dtype=np.int64)
    return plan_kind(spec.kind).source(spec, prepared, split, sentences, torch.device(device), precision, batch_size)


def check_cache(spec: PlanSpec, prepared: PreparedDataset | None = None) -> dict:
    """The manifest of a planner kind's plan cache ``spec.plans_dir``, checked against the spec (and corpus)."""
    return plan_kind(spec.kind).check_cache(spec, prepared)


__all__ = ["PlanKind", "PlanStrategy", "register_plan_kind", "plan_kind", "plan", "plan_source", "check_cache",
           "check_joint_plans", "draw_plans", "PlannerKind", "KINDS", "kind_flag"]
