"""Validate one YAML section against a command function's signature (jsonargparse), so that
`planlm run` checks every stage's settings before anything runs, and calls the stage function
exactly as the CLI would.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from planlm.errors import PlanlmError


def deep_merge(base: dict, override: dict) -> dict:
    """``override`` wins; nested dicts merge key by key."""
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def bind_section(func: Callable, section: dict | None, *, skip: set[str], where: str) -> dict[str, Any]:
    """Parse ``section`` with the parser jsonargparse builds from ``func`` (minus ``skip``) and return
    keyword arguments with dataclasses instantiated. Unknown keys, wrong types and failed dataclass
    validation raise one PlanlmError naming ``where``."""
    import inspect

    from jsonargparse import ArgumentParser

    from planlm.args import read_renamed
    from planlm.commands import RENAMED_KEYS
    from planlm.plans.spec import check_renamed

    section = read_renamed(section or {}, RENAMED_KEYS.get(func.__name__.replace("_", "-"), {}), where)
    accepted = set(inspect.signature(func).parameters) - set(skip)
    check_renamed(section or {}, accepted, where)
    unknown = sorted(set(section or {}) - accepted)
    if unknown:
        raise PlanlmError(f"{where}: unknown key(s) {unknown}; `planlm {func.__name__.replace('_', '-')}` takes "
                          f"{sorted(accepted)}")
    parser = ArgumentParser(exit_on_error=False)
    parser.add_function_arguments(func, skip=skip, as_positional=False, fail_untyped=True)
    try:
        cfg = parser.parse_object(copy.deepcopy(section or {}))  # jsonargparse rewrites nested lists in place
        init = parser.instantiate(cfg) if hasattr(parser, "instantiate") else parser.instantiate_classes(cfg)
    except Exception as e:  # jsonargparse ArgumentError, dataclass ValueError from __post_init__
        msg = " ".join(str(e).split())
        raise PlanlmError(f"{where}: {msg}; fix that setting (see `planlm {func.__name__.replace('_', '-')} --help`)") from e
    return {key: value for key, value in vars(init).items() if not key.startswith("__")}
