"""The plan kinds by name: ``register_plan_kind`` adds a kind, ``plan_kind`` finds one by its name or its import
path, and every command makes plans through the kind a resolved ``PlanConfig`` names: ``make_plans`` (a batch of
boundaries: generation) and ``plan_source`` (a split: training, evaluation, sweeps, lm-eval).

A kind of your own (a ``PlanKind`` subclass, ``planlm.plans.kinds``) is named by its import path
(``--plans.kind my_package.module:ClassName``, which a saved model records) or by its name once
``register_plan_kind`` has added it (docs/extending.md adds one).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.errors import PlanlmError
from planlm.plans.contexts import Boundaries
from planlm.plans.kinds import BUILT_IN, PlanKind
from planlm.plans.sources import PlanSource, Plans
from planlm.plugins import PluginImportError, named_or_imported

KINDS: dict[str, PlanKind] = {}
"""Every kind this process knows, by name: the built-in ones, those registered, and those imported by their path."""


def register_plan_kind(kind: PlanKind) -> PlanKind:
    """Add a plan kind under ``kind.name`` (registering the same class again replaces it; another class under a taken
    name is an error)."""
    name = str(kind.name)
    if not name:
        raise PlanlmError(f"{type(kind).__name__}: a plan kind needs a name (set the class's name)")
    if name in KINDS and type(KINDS[name]) is not type(kind):
        raise PlanlmError(f"plan kind {name!r} is already registered ({type(KINDS[name]).__name__}); choose another "
                          f"name")
    KINDS[name] = kind
    return kind


def plan_kind(name) -> PlanKind:
    """The kind of a name: a registered name, or an import path (``my_package.module:ClassName``, a ``PlanKind``
    subclass made with no arguments, or an instance), imported now and registered under that path; one-line error
    naming the kinds, or the path and why it does not import."""
    key = str(name)
    value, registered = named_or_imported(key, KINDS, "--plans.kind", "plans kind")
    if registered:
        return value
    kind, wrong = value, ""
    if isinstance(value, type) and issubclass(value, PlanKind):
        try:
            kind = value()
        except Exception as e:  # abstract, or a constructor that needs arguments
            wrong = f"{value.__name__}() failed: {type(e).__name__}: {' '.join(str(e).split())}"
    elif not isinstance(value, PlanKind):
        wrong = f"it is {value!r}, not a PlanKind subclass or instance (planlm.plans.kinds)"
    if wrong:
        raise PluginImportError(key, wrong, "--plans.kind", "plans kind", "name a PlanKind (docs/extending.md)")
    KINDS[key] = kind
    return kind


def kind_flag(name, flag: str) -> bool:
    """A flag of a kind (``uses_planner``, ``reads_future``, ``constant``, ...) read by name; False for a kind this
    process has not registered and cannot import (a run's record of a kind that someone's own module adds)."""
    try:
        kind = plan_kind(name)
    except PlanlmError:
        return False
    return bool(getattr(kind, flag))


for _kind in BUILT_IN:
    register_plan_kind(_kind())


def make_plans(boundaries: Boundaries, plans, rng: Optional[torch.Generator] = None, planner=None) -> Plans:
    """The plans of a batch of boundaries under a resolved ``PlanConfig`` ``plans``: its kind's ``plan``."""
    return plan_kind(plans.kind).plan(boundaries, plans, rng, planner)


def plan_source(plans, prepared: PreparedDataset, split: PreparedSplit, *, sentences: Optional[np.ndarray] = None,
                device: str | torch.device = "cpu", precision: str = "fp32",
                batch_size: int = 256) -> Optional[PlanSource]:
    """The source of a resolved ``PlanConfig``'s plans for ``split`` (None for kind none): its kind's ``source``.
    Planner plans come from ``plans.plans_dir`` when set, else the planner of ``plans.planner_dir`` runs now on
    ``sentences`` (default: every boundary of the split)."""
    plans.check_source()
    sentences = np.arange(split.num_sentences) if sentences is None else np.asarray(sentences, dtype=np.int64)
    return plan_kind(plans.kind).source(plans, prepared, split, sentences, torch.device(device), precision,
                                        batch_size)


__all__ = ["KINDS", "register_plan_kind", "plan_kind", "kind_flag", "make_plans", "plan_source"]
