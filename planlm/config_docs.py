"""docs/configuration.md, written from the commands' signatures and their config dataclasses: every key of every
command (a group's fields as dotted keys, ``train.lr``), with its type, its default and its docstring. The same
source gives ``planlm CMD --help``, so the page and the CLI never drift; tests/test_docs.py fails when the page is
stale.

    python -m planlm.config_docs            # rewrite docs/configuration.md
    python -m planlm.config_docs --check    # exit status 1 when it is stale
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterator

import docstring_parser

from planlm.commands import COMMANDS, load_command

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
HEADER = """# Configuration: every key of every command

*Written by `python -m planlm.config_docs` from the commands' signatures and their config dataclasses (the source
of `planlm CMD --help` too); `tests/test_docs.py` fails when this page is stale. Do not edit it by hand.*

A key is a flag on the command line (`--train.lr 0.001`) and a key of the command's YAML (`train: {lr: 0.001}`,
`planlm CMD --config FILE`); in `planlm run` each section holds the keys of the command it feeds (`lm:` those of
`train-lm` but the folders, which the run fills in). Groups shared by several commands are written once in the
code: the trainer and optimiser group (`planlm.train.args.TrainArgs`: `train.*` of `train-planner` and
`train-lm`), the runtime group (`planlm.args.Runtime`: `runtime.*`, the device and the precision of every command
that runs a network; `train-lm`'s adds its speed knobs, `planlm.args.LMRuntime`), the plans
(`planlm.plans.config.PlanConfig`: `plans.*`; `generate`, `edit-distance` and `adherence` take its `PlanSettings`)
and the sampling of tokens (`planlm.evaluate.generator.SamplingConfig`: `sampling.*` of `generate` and
`edit-distance`). Every precision takes one vocabulary: auto, native, fp32, bf16 (`planlm.args`).

## Overlays and flags

`planlm run --config base.yaml --config mine.yaml --lm.train.lr 3e-4`: config files and flags apply left to right,
each changing only the keys it names (`planlm.pipeline.sections`; the other commands' groups merge the same way):

- sections merge key by key: a `mine.yaml` holding `lm: {train: {lr: 0.0003}}` changes that key alone;
- a list is replaced whole (`seeds`, `sweeps`, `report.contrasts`), except `conditions`, merged by `name`: an entry
  whose name is already there changes that condition key by key, in its place; a new name is added at the end;
- `unset: [KEY, ...]` first removes keys, a dotted path each, a condition by its name (`unset: [conditions.cornille,
  conditions.fixed.paper]`); `unset: [conditions]` and then a `conditions` list give a run its own list, in its order;
- a flag is the overlay of its one key: `--lm.train.lr 3e-4`, `--conditions.ours.plans.num_paths 10`,
  `--unset conditions.cornille`.

A file written to go on another names it in a top-level `overlay_of: BASE` (given first, it is a one-line error
naming BASE); the shipped ones hold only their differences (`configs/custom.yaml`, `configs/*-bigplanner.yaml`,
`configs/*-joint.yaml`). `--print_config` prints the merged config; `--dry_run true` checks it, and a local corpus
(the file exists, its first records hold the text column), without running anything. `configs/smoke.yaml` runs
every stage in about two minutes, on the embedded corpus or with `--prepare.corpus.source my.jsonl` on yours.
"""


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, its bases' included (a subclass that restates a default
    keeps its base's docstring)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        parsed = docstring_parser.parse_from_object(klass)
        docs.update({param.arg_name: param.description for param in parsed.params if param.description})
    return docs


def show_type(annotation: Any) -> str:
    """An annotation as its source spells it (``int | None``)."""
    if annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, str):
        return annotation.replace("typing.", "")
    return getattr(annotation, "__name__", str(annotation)).replace("typing.", "")


def show_default(value: Any) -> str:
    """A default as YAML reads it: null, true, 0.0001, [csv, tensorboard]."""
    if value is inspect.Parameter.empty or value is dataclasses.MISSING:
        return "required"
    if isinstance(value, Enum):
        value = value.value
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    return json.dumps(value, default=str)


def one_line(text: str | None) -> str:
    return cell(" ".join((text or "").split()))


def cell(text: str) -> str:
    """``text`` in a cell of a Markdown table (a | of its own would end the cell)."""
    return text.replace("|", "\\|")


def group_rows(prefix: str, value: Any, annotation: Any) -> Iterator[tuple[str, str, str, str]]:
    """(key, type, default, docstring) of each field of the dataclass instance ``value``, nested groups flattened."""
    docs = field_docs(type(value))
    for knob in dataclasses.fields(value):
        default = getattr(value, knob.name)
        if dataclasses.is_dataclass(default) and not isinstance(default, type):
            yield from group_rows(f"{prefix}{knob.name}.", default, knob.type)
        else:
            yield f"{prefix}{knob.name}", show_type(knob.type), show_default(default), one_line(docs.get(knob.name))


def command_rows(func: Callable) -> Iterator[tuple[str, str, str, str]]:
    """(key, type, default, docstring) of every key of a command."""
    docs = {param.arg_name: param.description for param in docstring_parser.parse_from_object(func).params}
    for name, param in inspect.signature(func).parameters.items():
        if dataclasses.is_dataclass(param.default) and not isinstance(param.default, type):
            yield f"{name}", show_type(param.annotation), "", one_line(docs.get(name))
            yield from group_rows(f"{name}.", param.default, param.annotation)
        else:
            yield name, show_type(param.annotation), show_default(param.default), one_line(docs.get(name))


def command_section(name: str) -> str:
    func = load_command(name)
    summary = one_line(docstring_parser.parse_from_object(func).short_description)
    lines = [f"## planlm {name}", "", summary, "", "| key | type | default | what it sets |", "|---|---|---|---|"]
    lines += [f"| `{key}` | `{cell(kind)}` | {f'`{cell(default)}`' if default else ''} | {doc} |"
              for key, kind, default, doc in command_rows(func)]
    return "\n".join(lines) + "\n"


def command_flags(name: str) -> list[str]:
    """The flags of one command as its CLI parser (jsonargparse) builds them, each nested field one flag
    (``train.lr``); ``--help``, ``--config``, ``--print_config``, a group's config loader (``--train FILE``) and a
    class's ``--x.help`` left out. benchmarks/count_flags.py counts them."""
    import argparse

    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_function_arguments(load_command(name), as_positional=False, fail_untyped=True)
    flags = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        flag = max(action.option_strings, key=len).lstrip("-").rstrip("+")  # --loggers+: the append form
        if flag in ("config", "print_config") or flag.endswith(".help") or \
                type(action).__name__.startswith("_ActionConfigLoad"):
            continue
        flags.append(flag)
    return flags


def render() -> str:
    """The whole page."""
    return "\n".join([HEADER, *(command_section(name) for name in COMMANDS)])


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    page = render()
    if check:
        stale = not PAGE.is_file() or PAGE.read_text() != page
        if stale:
            print(f"{PAGE} is stale: run `python -m planlm.config_docs`", file=sys.stderr)
        return int(stale)
    PAGE.write_text(page)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
