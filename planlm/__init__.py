"""planlm: make language models plan (Mai, Cornille, Moens, "Learning to Plan Long-Term for Language Modeling").

The Python API mirrors the CLI: every ``planlm COMMAND`` is a function here with the same arguments
(``planlm.prepare``, ``planlm.train_planner``, ``planlm.sample_plans``, ``planlm.train_lm``,
``planlm.evaluate``, ``planlm.generate``, ``planlm.run`` ...). Attributes load lazily, so
``import planlm`` is cheap. The names are listed once, in ``planlm.commands``.
"""

from __future__ import annotations

from planlm.commands import API as _API
from planlm.commands import load as _load

__version__ = "0.1.0"

__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        return _load(_API[name])
    raise AttributeError(f"module 'planlm' has no attribute {name!r}")
