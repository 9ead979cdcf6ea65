"""`planlm run`'s sections: how config files and flags merge into them (``merge_config``), and one section
validated against a command function's signature (jsonargparse), so that `planlm run` checks every stage's settings
before anything runs, and calls the stage function exactly as the CLI would.

How a later ``--config`` (an overlay) or a flag changes the config before it, in one place:

- nested sections merge key by key: ``lm: {train: {lr: 0.0003}}`` changes that key and keeps the others;
- a list is replaced whole (``seeds``, ``sweeps``, ``report.contrasts``), except ``conditions``, which merge by
  ``name``: an entry whose name is already there changes that condition key by key, in its place; a new name is
  added at the end;
- ``unset: [KEY, ...]`` removes keys before the rest of the overlay merges, a dotted path each, a condition named by
  its name: ``unset: [conditions.cornille, conditions.ours.paper]``; ``unset: [conditions]`` and then a
  ``conditions`` list gives a run its own list, in its own order;
- a flag is the overlay of its one key: ``--lm.train.lr 3e-4`` is ``lm: {train: {lr: 3e-4}}``,
  ``--conditions.ours.plans.num_paths 10`` changes condition ``ours`` (``--unset KEY`` removes one).
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


UNSET_KEY = "unset"
"""Top-level key of an overlay (and flag of `planlm run`): the dotted keys it removes from the config before it."""

NAMED_LISTS = {"conditions": "name"}
"""Top-level lists merged entry by entry, the entries matched by this key; every other list is replaced whole."""


def merge_config(base: dict, overlay: dict, where: str) -> dict:
    """``overlay`` (a later config file or a flag) over ``base``: the module's rules; ``where`` names the overlay in
    a one-line error. Neither input is changed."""
    out = copy.deepcopy(base)
    unset = overlay.get(UNSET_KEY) or []
    for key in [unset] if isinstance(unset, str) else unset:
        unset_key(out, key, where)
    for key, value in overlay.items():
        if key == UNSET_KEY:
            continue
        if key in NAMED_LISTS and isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = merge_named(out[key], value, NAMED_LISTS[key], f"{where}: {key}")
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def merge_named(base: list, overlay: list, name_key: str, where: str) -> list:
    """``overlay``'s entries over ``base``'s, matched by ``name_key``: a known name merges into its entry in place,
    a new one is added at the end."""
    out = copy.deepcopy(base)
    index = {entry.get(name_key): i for i, entry in enumerate(out) if isinstance(entry, dict)}
    for entry in overlay:
        name = entry.get(name_key) if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise PlanlmError(f"{where}: every entry needs a {name_key} (got {entry!r}); an entry changes the "
                              f"one of that {name_key} or adds one")
        if name in index:
            out[index[name]] = deep_merge(out[index[name]], entry)
        else:
            index[name] = len(out)
            out.append(copy.deepcopy(entry))
    return out


def unset_key(config: dict, dotted: str, where: str) -> None:
    """Remove the key ``dotted`` (``lm.train.lr``; ``conditions.NAME[.key...]`` for a condition) from ``config``;
    a key that is not there is a one-line error (a typo would otherwise change nothing)."""
    parts, node = str(dotted).split("."), config
    for i, part in enumerate(parts):
        if i == 1 and isinstance(node, list) and parts[0] in NAMED_LISTS:
            slot = next((j for j, entry in enumerate(node)
                         if isinstance(entry, dict) and entry.get(NAMED_LISTS[parts[0]]) == part), None)
        else:
            slot = part if isinstance(node, dict) and part in node else None
        if slot is None:
            raise PlanlmError(f"{where}: unset {dotted}: there is no {'.'.join(parts[:i + 1])} to remove; name a "
                              f"key that the configs before it set")
        if i == len(parts) - 1:
            del node[slot]
            return
        node = node[slot]


def dotted_overlay(dotted: str, value: Any) -> dict:
    """The overlay of one flag: ``lm.train.lr`` and 0.0003 give ``{lm: {train: {lr: 0.0003}}}``; under a named list
    the next part is the entry's name (``conditions.ours.plans.num_paths``)."""
    parts = dotted.split(".")
    if parts[0] in NAMED_LISTS and len(parts) > 1:
        entry = value if len(parts) == 2 else dotted_overlay(".".join(parts[2:]), value)
        if not isinstance(entry, dict):
            raise PlanlmError(f"--{dotted} {value!r}: a condition is a mapping; set one of its keys "
                              f"(--{dotted}.plans.num_paths 10) or give a mapping ('{{plans: {{kind: fixed}}}}')")
        return {parts[0]: [{NAMED_LISTS[parts[0]]: parts[1], **entry}]}
    for part in reversed(parts[1:]):
        value = {part: value}
    return {parts[0]: value}


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
