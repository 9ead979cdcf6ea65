"""planlm: make language models plan (Mai, Cornille, Moens, "Learning to Plan Long-Term for Language Modeling").

The Python API mirrors the CLI: every ``planlm COMMAND`` is a function here with the same arguments
(``planlm.prepare``, ``planlm.train_planner``, ``planlm.sample_plans``, ``planlm.train_lm``,
``planlm.evaluate``, ``planlm.generate``, ``planlm.run`` ...). Attributes load lazily, so
``import planlm`` is cheap. The names are listed once, in ``planlm.commands``.
"""

from __future__ import annotations

import os as _os

# OpenMP threads that wait for work sleep rather than spin, unless the environment says otherwise. A planner's walk
# over a corpus (sample-plans, live plans) is thousands of small operations per batch; threads spinning between them
# cost many times the CPU of the work itself, most on a shared machine. It changes how threads wait, not how work is
# split between them: the numbers are the same. The OpenMP runtime reads it when torch loads, so it holds where
# planlm is imported before torch (the CLI, planlm's own processes).
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from planlm.commands import API as _API  # noqa: E402
from planlm.commands import load as _load  # noqa: E402

__version__ = "0.1.0"

__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        return _load(_API[name])
    raise AttributeError(f"module 'planlm' has no attribute {name!r}")
