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


def unknown_keys(func: Callable, unknown: list[str], accepted: set[str], where: str, prefix: str = "") -> PlanlmError:
    """The one-line error for keys ``func`` does not take: they and the keys it takes, and for a key that is a field
    of one of its groups (``num_paths`` of ``plans``) the group's key (``plans.num_paths``); ``prefix``: ``--`` for
    flags."""
    import dataclasses
    import inspect

    groups = {name: {f.name for f in dataclasses.fields(param.default)}
              for name, param in inspect.signature(func).parameters.items()
              if dataclasses.is_dataclass(param.default) and not isinstance(param.default, type)}
    hints = [f"{prefix}{key} is {prefix}{group}.{key}" for key in unknown for group, names in groups.items()
             if key in names]
    command, what = func.__name__.replace("_", "-"), "flag(s)" if prefix else "key(s)"
    return PlanlmError(f"{where}: unknown {what} {[prefix + key for key in unknown]}"
                       + (f" ({'; '.join(hints)})" if hints else "")
                       + f"; `planlm {command}` takes {[prefix + key for key in sorted(accepted)]}")


def bind_section(func: Callable, section: dict | None, *, skip: set[str], where: str) -> dict[str, Any]:
    """Parse ``section`` with the parser jsonargparse builds from ``func`` (minus ``skip``) and return
    keyword arguments with dataclasses instantiated. Unknown keys, wrong types and failed dataclass
    validation raise one PlanlmError naming ``where``."""
    import inspect

    from jsonargparse import ArgumentParser

    accepted = set(inspect.signature(func).parameters) - set(skip)
    unknown = sorted(set(section or {}) - accepted)
    if unknown:
        raise unknown_keys(func, unknown, accepted, where)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_function_arguments(func, skip=skip, as_positional=False, fail_untyped=True)
    try:
        cfg = parser.parse_object(copy.deepcopy(section or {}))  # jsonargparse rewrites nested lists in place
        init = parser.instantiate(cfg) if hasattr(parser, "instantiate") else parser.instantiate_classes(cfg)
    except Exception as e:  # jsonargparse ArgumentError, dataclass ValueError from __post_init__
        msg = " ".join(str(e).split())
        raise PlanlmError(f"{where}: {msg}; fix that setting (see `planlm {func.__name__.replace('_', '-')} --help`)") from e
    return {key: value for key, value in vars(init).items() if not key.startswith("__")}
