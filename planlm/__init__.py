"""planlm: make language models plan (Mai, Cornille, Moens, "Learning to Plan Long-Term for Language Modeling").

The Python API mirrors the CLI: every ``planlm COMMAND`` is a function here with the same arguments
(``planlm.prepare``, ``planlm.train_planner``, ``planlm.sample_plans``, ``planlm.train_lm``,
``planlm.evaluate``, ``planlm.generate``, ``planlm.run`` ...). Attributes load lazily, so
``import planlm`` is cheap.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_API = {
    # commands
    "prepare": "planlm.data.prepare",
    "actions": "planlm.data.actions",
    "train_planner": "planlm.train.planner",
    "sample_plans": "planlm.plans.sampling",
    "train_lm": "planlm.train.lm",
    "evaluate": "planlm.evaluate.perplexity",
    "compare": "planlm.evaluate.bootstrap",
    "generate": "planlm.evaluate.generate",
    "edit_distance": "planlm.evaluate.edit_distance",
    "sweep": "planlm.evaluate.sweeps",
    "run": "planlm.pipeline.run",
    "generate_text": "planlm.evaluate.generate",
    "PlannedGenerator": "planlm.evaluate.generate",
    "compute_plans": "planlm.plans.sampling",
    "load_plans": "planlm.plans.sampling",
    "PathPolicy": "planlm.plans.policy",
    # data and networks
    "PreparedDataset": "planlm.data.artifacts",
    "Planner": "planlm.models.planner",
    "PlannerConfig": "planlm.models.planner",
    "PlannedLM": "planlm.models.planned_lm",
    "AdapterConfig": "planlm.models.adapter",
}

__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'planlm' has no attribute {name!r}")
