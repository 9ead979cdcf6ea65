"""``PlanSettings`` and ``PlanConfig``: the plans a user writes under ``plans:`` (``--plans.*``), and, resolved
(``PlanConfig.resolve``), the plans a command and a saved model use.

``PlanSettings`` are the kind, K, T, tau and planner of a command that draws its plans from the planner as it
writes or sweeps one of them (generate, edit-distance, adherence, sweep: generation draws with the command's seed,
a sweep sets what it sweeps). ``PlanConfig`` adds the seed, the plan cache, the path policy and plans in
expectation: training (``planlm train-lm --plans.kind ...``), plan caches and evaluation take it as one argument
group, ``plans``. A field left unset (None) is inherited: at training from the defaults below, at evaluation from
the config the model was trained with (``trained_plans``: the settings in its ``planned_lm.json``, the planner
folder its card names), so ``planlm evaluate --plans.num_paths 20`` changes K and keeps everything else of the
model's plans. ``resolve`` fills the unset fields and validates the whole value once; every later stage trusts it.

The kind (``PlanConfig.plan_kind``: a ``planlm.plans.kinds.PlanKind`` found by ``planlm.plans.registry.plan_kind``)
decides and checks the fields of its own (``resolve`` asks it) and makes the plans. K is ``num_paths`` alone:
``resolve`` gives the path policy its ``max_paths`` from it, and nothing downstream sets K again. T is
``horizon``: unset for a planner kind, training and sampling take the planner's trained horizon
(``with_source_horizon``), so a run states T once, as the planner's ``model.horizon``; the adapter is built for the
resolved T, and an evaluation inherits it from the model.

``expectation`` (planner kinds only; beyond the paper, ``planlm.plans.expectation``): each step of a path
is the planner's whole next-action distribution (its ``TOP_ACTIONS`` most likely actions, renormalised)
instead of the one action drawn, and the adapter reads the expected action embedding.

Joint training (``planlm train-lm --train.joint true``; planner kinds only) reads the same config; the planner runs
inside the LM's training step (``planlm.plans.kinds.PlannerKind.joint_plans``, checked by ``check_joint_plans``).

Planner plans come from a plan cache (``plans_dir``, ``planlm sample-plans``) or from a planner
(``planner_dir``): training samples (or reuses) the planner's cache, evaluation and generation run the
planner on the boundaries they need. ``planlm.plans.registry.plan_source`` turns a resolved config into a
``PlanSource``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Optional

import numpy as np

from planlm.errors import PlanlmError
from planlm.plans.kinds import PlanKind
from planlm.plans.policy import PathPolicy, policy_keyed
from planlm.plans.registry import plan_kind
from planlm.plugins import PluginImportError, UnknownKind


TOP_ACTIONS = 64
"""Plans in expectation keep each step's 64 most likely actions, renormalised (all of them when A <= 64; a plan
cache stores their probabilities in float16, within about 2e-3 of the planner's)."""
FIXED_ACTION = 0
"""The one action of every plan of the Fixed baseline (``--plans.kind fixed``)."""


@dataclass
class PlanSettings:
    """The plans of a command that draws them from the planner as it writes or sweeps one of them (generate,
    edit-distance, adherence, sweep): kind, K, T, tau and planner. Unset fields (None) are the model's own (a model
    trained in expectation is read in expectation)."""

    kind: Optional[str] = None
    """none (plain LM), fixed (one constant action), oracle (true actions), planner_argmax, planner_sampled, a
    registered kind, or a PlanKind of your own by its import path (my_package.module:ClassName;
    docs/extending.md)."""
    num_paths: Optional[int] = None
    """K paths per plan (default 1); under an adaptive path policy the most a boundary gets."""
    horizon: Optional[int] = None
    """T actions per path, at most the planner's (default: the horizon the planner was trained with, or the plan
    cache's; 1 for plans without a planner)."""
    temperature: Optional[float] = None
    """tau, the planner's sampling temperature (default 1.0; planner_argmax: 0)."""
    planner_dir: Optional[str] = None
    """A planner folder (`planlm train-planner`): plans are sampled from it."""

    def __post_init__(self):
        if self.kind is not None:
            plan_kind(self.kind)  # one-line error naming the kinds; an import path is imported now
            self.kind = str(self.kind)


@dataclass
class PlanConfig(PlanSettings):
    """The plans of a command and of a saved model: kind, K, T, tau, planner, seed, plan cache, path policy and
    expectation. Unset fields (None) are inherited (training: the defaults; evaluation: the model's own)."""

    seed: Optional[int] = None
    """Seed of the sampled plans (default 0)."""
    plans_dir: Optional[str] = None
    """A plan cache folder (`planlm sample-plans`): plans are read from it (takes precedence over planner_dir)."""
    path_policy: Optional[PathPolicy] = None
    """Paths per boundary of sampled plans: all (K at every boundary; default) or entropy (at most K, more where
    the planner is unsure of the next action)."""
    expectation: Optional[bool] = None
    """Plans in expectation (planner kinds; beyond the paper): each step is the planner's next-action distribution
    along the path (tau; planner_argmax: tau 1), the adapter reads sum_a p(a) Emb(a). Default false."""

    @classmethod
    def of(cls, plans: PlanSettings) -> PlanConfig:
        """``plans`` as a config: a ``PlanConfig`` as it is, the settings of a generation command with the rest
        unset."""
        return plans if isinstance(plans, PlanConfig) else cls(**asdict(plans))

    @property
    def top_actions(self) -> int:
        """Plans in expectation: the most likely actions kept per step (``TOP_ACTIONS``)."""
        return TOP_ACTIONS

    @property
    def fixed_action(self) -> int:
        """The Fixed baseline's action (``FIXED_ACTION``)."""
        return FIXED_ACTION

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.path_policy, dict):
            self.path_policy = PathPolicy(**self.path_policy)

    def resolve(self, base: Optional[PlanConfig] = None) -> PlanConfig:
        """This config with its unset fields taken from ``base`` (then the defaults), normalised and validated.

        A plan cache and a path policy are never inherited: the training cache holds other splits, and an
        evaluation chooses its own compute per boundary (default: K paths everywhere)."""
        values = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and base is not None and f.name not in NOT_INHERITED:
                value = getattr(base, f.name)
            values[f.name] = value
        if self.plans_dir:  # an explicit plan cache replaces the base's planner
            values["planner_dir"] = self.planner_dir
        kind = plan_kind(values["kind"] if values["kind"] is not None else DEFAULTS["kind"])
        if self.expectation is None and not kind.uses_planner:  # a model's expectation goes with its planner
            values["expectation"] = False
        policy = values["path_policy"] or PathPolicy()
        if self.num_paths is None and policy.max_paths is not None:  # K from the policy's most paths
            values["num_paths"] = policy.max_paths
        plans = PlanConfig(**{name: DEFAULTS.get(name) if value is None else value for name, value in values.items()})
        plans.check()
        plans._normalise()
        return plans

    @property
    def plan_kind(self) -> PlanKind:
        """The kind these plans are (``planlm.plans.kinds``), found by its name (``planlm.plans.registry``)."""
        return plan_kind(self.kind)

    @property
    def has_plans(self) -> bool:
        """Whether the LM reads plans (an adapter): every kind but none."""
        return self.plan_kind.conditions

    def _normalise(self) -> None:
        self.plan_kind.normalise(self)  # e.g. no planner folders without a planner, tau 0 for the argmax path
        self.path_policy = self.path_policy.resolve(self.num_paths)  # the one place K reaches the policy

    def check(self) -> None:
        """One-line errors for values no plan source can serve."""
        if self.num_paths < 1 or self.horizon < 1:
            raise PlanlmError(f"--plans.num_paths ({self.num_paths}) and --plans.horizon ({self.horizon}) must be "
                              f">= 1")
        if self.temperature < 0:
            raise PlanlmError(f"--plans.temperature {self.temperature} must be >= 0 (0 = argmax)")
        if self.path_policy.max_paths not in (None, self.num_paths):
            raise PlanlmError(f"--plans.path_policy.max_paths {self.path_policy.max_paths} differs from "
                              f"--plans.num_paths {self.num_paths}; leave max_paths unset (K = num_paths)")
        self.plan_kind.check(self)

    def check_source(self) -> None:
        """Planner plans need a plan cache or a planner to come from (checked where plans are read)."""
        self.plan_kind.check_source(self)

    def cache_key(self) -> dict:
        """The settings reuse keys hold: the path policy all and sampled actions add nothing (older folders stay
        valid); plans in expectation add the actions they keep per step."""
        key = policy_keyed({**asdict(self), "kind": str(self.kind)})
        if self.expectation:
            key["top_actions"] = self.top_actions
        else:
            key.pop("expectation")
        return key

    def sampled_paths(self, path_counts: Optional[np.ndarray], sentences: np.ndarray) -> np.ndarray:
        """(N,) paths the planner computed for each of ``sentences``: the policy's counts (``path_counts``
        (N_sent,), from a source of sampled plans) or the kind's paths per boundary (K sampled, 1 for the argmax
        path, 0 without a planner)."""
        if path_counts is not None:
            return np.asarray(path_counts, dtype=np.int64)[sentences]
        return np.full(len(sentences), self.plan_kind.paths_drawn(self), dtype=np.int64)

    def label(self) -> str:
        """A short description, e.g. ``planner_sampled, K=5, T=5, tau=1``."""
        text = f"{self.kind}, K={self.num_paths}, T={self.horizon}, tau={self.temperature:g}"
        text += f", in expectation (top {self.top_actions})" if self.expectation else ""
        return text + (f", {self.path_policy.label()}" if self.path_policy.adaptive else "")


NOT_INHERITED = ("plans_dir", "path_policy")
DEFAULTS = {"kind": "none", "num_paths": 1, "horizon": 1, "temperature": 1.0, "seed": 0,
            "path_policy": PathPolicy(), "expectation": False}


def with_source_horizon(plans: PlanConfig) -> PlanConfig:
    """``plans`` for training or sampling, with T, when unset for a planner kind, taken from where its plans come
    from: the plan cache's T (``plans_dir``) or the horizon the planner was trained with (``planner_dir``); a T
    beyond the planner's is a one-line error (``check_planner_horizon``). T is so given once, as the planner's
    ``model.horizon``: the plans, the plan cache sampled for them and the adapter (built for the resolved T)
    read that one value."""
    from planlm.models.planner import trained_horizon
    from planlm.plans.cache import cache_manifest

    if not plan_kind(plans.kind if plans.kind is not None else DEFAULTS["kind"]).uses_planner:
        return plans
    if plans.plans_dir:  # the cache's T; another T asked for is refused where the cache is read (check_cache)
        horizon = plans.horizon or int(cache_manifest(plans.plans_dir)["horizon"])
        return replace(plans, horizon=horizon)
    if not plans.planner_dir:
        return plans  # no source: a one-line error follows (check_source)
    trained = trained_horizon(plans.planner_dir)
    plans = replace(plans, horizon=plans.horizon or trained)
    check_planner_horizon(plans, trained)
    return plans


def check_planner_horizon(plans: PlanConfig, trained: int) -> None:
    """One-line error when ``plans`` asks its planner (trained to predict ``trained`` actions ahead) for longer
    paths."""
    if plans.horizon is not None and plans.horizon > trained:
        raise PlanlmError(f"--plans.horizon {plans.horizon} exceeds the horizon T={trained} the planner "
                          f"{plans.planner_dir} was trained with; leave --plans.horizon unset (T={trained}) or train "
                          f"the planner with --model.horizon {plans.horizon}")


def trained_plans(model) -> PlanConfig:
    """The plans a PlannedLM was trained with, resolved: its config's plan settings and the folders they came from
    (``PlannedLM.plan_folders``; a model config holds no run paths)."""
    folders = {key: value for key, value in getattr(model, "plan_folders", {}).items() if value}
    plans = model.config.plans  # a dict; a PlanConfig where Python code builds the model's config itself
    try:
        if not isinstance(plans, PlanConfig):
            policy = plans.get("path_policy")
            plans = PlanConfig(**{**plans, "path_policy": PathPolicy.saved(policy) if policy else None})
        return replace(plans, **folders).resolve()
    except (PluginImportError, UnknownKind) as e:  # a kind of someone's own code: name the model's folder
        raise e.at(str(getattr(model, "folder", None) or "the model")) from None


def evaluation_plans(overrides: PlanSettings, model, model_dir: str) -> PlanConfig:
    """The plans of an evaluation: the model's training config with ``overrides`` (a generation command's settings
    or a whole config; with a plan cache, the cache's K and path policy), resolved once and checked against the model
    (its adapter, its actions) and the folders it names."""
    from pathlib import Path

    overrides = PlanConfig.of(overrides)
    trained = trained_plans(model)
    if overrides.plans_dir:
        overrides = _cache_overrides(overrides, plan_kind(overrides.kind or trained.kind))
    plans = overrides.resolve(trained)
    if plans.has_plans and model.adapter is None:
        raise PlanlmError(f"{model_dir}: the model was trained with plans kind none (no adapter); evaluate it with "
                          f"--plans.kind none")
    if model.adapter is not None and plans.horizon > model.adapter.config.horizon:
        raise PlanlmError(f"--plans.horizon {plans.horizon} exceeds the horizon the adapter of {model_dir} accepts "
                          f"({model.adapter.config.horizon}); choose --plans.horizon <= {model.adapter.config.horizon}")
    plans.plan_kind.check_actions(plans, model.config.num_actions, model_dir)
    if plans.planner_dir and not plans.plans_dir and not (Path(plans.planner_dir) / "model.safetensors").is_file():
        raise PlanlmError(f"{plans.planner_dir}: no trained planner here (model.safetensors missing); set "
                          f"--plans.planner_dir to a `planlm train-planner` folder or --plans.plans_dir to a plan "
                          f"cache")
    if plans.plan_kind.uses_planner and plans.planner_dir and not plans.plans_dir:  # the planner runs now
        from planlm.models.planner import trained_horizon

        check_planner_horizon(plans, trained_horizon(plans.planner_dir))
    return plans


def check_joint_plans(plans: PlanConfig) -> None:
    """One-line errors for a resolved config that joint training (``planlm train-lm --train.joint true``: the planner
    trains with the LM, ``PlannerKind.joint_plans``) cannot serve."""
    if not plans.plan_kind.uses_planner:
        raise PlanlmError(f"--train.joint true with --plans.kind {plans.kind}: {plans.kind} plans have no planner to "
                          f"train with the LM; set --train.joint false or --plans.kind planner_sampled / "
                          f"planner_argmax")
    if plans.plans_dir:
        raise PlanlmError(f"--train.joint true with --plans.plans_dir {plans.plans_dir}: joint training runs the "
                          f"planner on every batch instead of reading a plan cache; drop --plans.plans_dir and set "
                          f"--plans.planner_dir")
    if not plans.planner_dir:
        raise PlanlmError("--train.joint true needs --plans.planner_dir: the planner (`planlm train-planner`) to train "
                          "with the LM")
    if plans.path_policy.adaptive:
        raise PlanlmError(f"--train.joint true with --plans.path_policy.kind {plans.path_policy.kind}: joint training "
                          f"draws K paths at every boundary; drop --plans.path_policy")
    if plans.plan_kind.samples_paths and plans.temperature == 0:
        raise PlanlmError("--train.joint true with --plans.kind planner_sampled at --plans.temperature 0: the greedy "
                          "path carries no gradient to the planner; set a temperature > 0 or --plans.kind "
                          "planner_argmax (its distribution at tau 1)")


def _cache_overrides(overrides: PlanConfig, kind: PlanKind) -> PlanConfig:
    """Overrides that read the plan cache ``overrides.plans_dir`` (not a planner): a cache of sampled plans brings
    its K and the path policy it was sampled under; asking for another K or policy is an error."""
    from planlm.plans.cache import cache_manifest

    manifest = cache_manifest(overrides.plans_dir)
    if not kind.samples_paths:  # the argmax path: K copies, whatever the cache's K
        return replace(overrides, planner_dir=None)
    num_paths = int(manifest["num_paths"])
    if overrides.num_paths not in (None, num_paths):
        raise PlanlmError(f"{overrides.plans_dir}: the plan cache holds K={num_paths} paths, not --plans.num_paths "
                          f"{overrides.num_paths}; drop --plans.num_paths or sample a cache with it")
    cached = PathPolicy.saved(manifest["path_policy"]) if manifest.get("path_policy") else PathPolicy()
    asked = overrides.path_policy
    if asked is not None and asked.adaptive and asked.resolve(num_paths) != cached.resolve(num_paths):
        raise PlanlmError(f"{overrides.plans_dir}: the plan cache was sampled under path policy "
                          f"{cached.resolve(num_paths).label()}, not {asked.resolve(num_paths).label()}; drop "
                          f"--plans.path_policy or sample a cache with it")
    return replace(overrides, planner_dir=None, num_paths=num_paths, path_policy=cached)


__all__ = ["PlanSettings", "PlanConfig", "TOP_ACTIONS", "FIXED_ACTION", "trained_plans", "evaluation_plans",
           "with_source_horizon", "check_planner_horizon", "check_joint_plans"]
