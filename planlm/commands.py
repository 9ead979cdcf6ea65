"""The one registry of planlm's commands and Python API, read by the CLI (`planlm COMMAND`), the lazy
attributes of ``planlm`` (``planlm.train_lm``) and the pipeline (`planlm run`).

Targets are "module:attribute" strings, imported on first use: ``import planlm`` and ``planlm --help``
stay cheap.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

# command name -> "module:function". Each function is the Python API of that command.
COMMANDS: dict[str, str] = {
    "prepare": "planlm.data.prepare:prepare",
    "actions": "planlm.data.actions:actions",
    "codebook": "planlm.data.codebook:codebook",
    "train-planner": "planlm.train.planner:train_planner",
    "sample-plans": "planlm.plans.sampling:sample_plans",
    "train-lm": "planlm.train.lm:train_lm",
    "evaluate": "planlm.evaluate.perplexity:evaluate",
    "compare": "planlm.evaluate.bootstrap:compare",
    "across-runs": "planlm.pipeline.across_runs:across_runs",
    "generate": "planlm.evaluate.generate:generate",
    "edit-distance": "planlm.evaluate.edit_distance:edit_distance",
    "adherence": "planlm.evaluate.adherence:adherence",
    "sweep": "planlm.evaluate.sweeps:sweep",
    "run": "planlm.pipeline.run:run",
    "verify": "planlm.stage.verify:verify",
}

# Python name -> "module:attribute": every command under its function's name, and the rest of the API.
API: dict[str, str] = {
    **{target.split(":")[1]: target for target in COMMANDS.values()},
    "generate_text": "planlm.evaluate.generate:generate_text",
    "SamplingConfig": "planlm.evaluate.generator:SamplingConfig",
    "action_prior": "planlm.evaluate.generate:action_prior",
    "PlannedGenerator": "planlm.evaluate.generator:PlannedGenerator",
    "Outline": "planlm.evaluate.outline:Outline",
    "load_plans": "planlm.plans.cache:load_plans",
    "PathPolicy": "planlm.plans.policy:PathPolicy",
    "PlanConfig": "planlm.plans.config:PlanConfig",
    "PlanSettings": "planlm.plans.config:PlanSettings",
    "PlanKind": "planlm.plans.kinds:PlanKind",
    "register_plan_kind": "planlm.plans.registry:register_plan_kind",
    "plan_kind": "planlm.plans.registry:plan_kind",
    "Boundaries": "planlm.plans.contexts:Boundaries",
    "make_plans": "planlm.plans.registry:make_plans",
    "plan_source": "planlm.plans.registry:plan_source",
    # data and networks
    "PreparedDataset": "planlm.data.artifacts:PreparedDataset",
    "Planner": "planlm.models.planner:Planner",
    "PlannerConfig": "planlm.models.planner:PlannerConfig",
    "PlannedLM": "planlm.models.planned_lm:PlannedLM",
    "AdapterConfig": "planlm.models.adapter:AdapterConfig",
    "AdapterSettings": "planlm.models.adapter:AdapterSettings",
}


def load(target: str) -> Any:
    """The object a "module:attribute" target names."""
    module, attribute = target.split(":")
    return getattr(importlib.import_module(module), attribute)


def load_command(name: str) -> Callable:
    """A command's function, by its CLI name (``train-lm``) or its Python name (``train_lm``)."""
    return load(COMMANDS[name.replace("_", "-")])
