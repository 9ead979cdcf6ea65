"""The ``planlm`` command line: a dict of typed, documented command functions (jsonargparse).

Every command accepts ``--config FILE.yaml`` and ``--print_config``; ``--help`` comes from the
function's docstring and signature, so the CLI, the Python API and the YAML presets never drift. A later
``--config`` and a flag change only the keys they name: `planlm run`'s sections merge key by key and its
conditions by name (``planlm.pipeline.sections``: ``--config base.yaml --config mine.yaml``, ``--lm.train.lr 3e-4``),
the other commands' groups through jsonargparse. A file written only to go on another (an overlay) names that config
in a top-level ``overlay_of: BASE``, and given first it is a one-line error naming BASE.

Every command also takes ``--verbose true``: the libraries' banners, bars and notices stay on the console. By
default a command that writes a folder (``--out_dir``) shows one live bar, planlm's own lines and an end line, and
sends the libraries' output to ``logs/<folder name>.txt`` beside that folder (`planlm run`: a start and an end line
per stage, one log per stage in the run's ``logs/``; see ``planlm.console``).
"""

from __future__ import annotations

import functools
import re
import sys
import time
from pathlib import Path

from planlm.commands import COMMANDS, load_command


def _quiet_library_noise() -> None:
    """Drop advertising and deprecation chatter of our libraries that says nothing about the run."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")

    class _NoTips(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "litlogger" not in record.getMessage()

    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
                 "lightning.pytorch"):
        logging.getLogger(name).addFilter(_NoTips())


def _check_known_keys(argv: list[str], command) -> None:
    """A flag or a top-level ``--config`` key that the command does not take: one line naming it, the command's keys
    and, for a field of one of its groups, the group's key (``--num_paths`` is ``plans.num_paths``), instead of
    jsonargparse's usage text."""
    import inspect

    import yaml

    from planlm.pipeline.sections import UNSET_KEY, unknown_keys

    accepted = set(inspect.signature(command).parameters) | ({UNSET_KEY} if _merged_sections(command) else set())
    for i, arg in enumerate(argv):
        flag, _, value = arg.partition("=")
        if flag == "--config" and value or i and argv[i - 1] == "--config":
            path = Path(value or arg)
            try:  # a --config that is no file is a YAML string: jsonargparse reads it
                config = yaml.safe_load(path.read_text()) if path.is_file() else None
            except yaml.YAMLError:  # jsonargparse says what is wrong with it
                config = None
            unknown = sorted(set(config) - accepted - {OVERLAY_KEY}) if isinstance(config, dict) else []
            where, prefix = str(path), ""
        elif flag.startswith("--") and flag[2:] not in _PARSER_FLAGS:
            unknown, where, prefix = sorted({flag[2:].split(".")[0]} - accepted), f"planlm {argv[0]}", "--"
            if not unknown and flag[2:].split(".")[0] != UNSET_KEY:
                _check_group_field(command, flag, argv[0])
        else:
            continue
        if unknown:
            raise unknown_keys(command, unknown, accepted, where, prefix)


def _check_group_field(command, flag: str, name: str) -> None:
    """``--group.field`` where ``group`` is a settings group (a dataclass) that has no ``field``: one line naming the
    group's fields, instead of jsonargparse's usage text."""
    import dataclasses
    import inspect

    from planlm.errors import PlanlmError

    group, _, rest = flag[2:].partition(".")
    default = inspect.signature(command).parameters[group].default
    if not rest or not dataclasses.is_dataclass(default) or isinstance(default, type):
        return
    fields = {field.name for field in dataclasses.fields(default)}
    if rest.split(".")[0] not in fields | {"help"}:
        raise PlanlmError(f"planlm {name}: unknown flag {flag}; --{group} takes "
                          f"{['--' + group + '.' + field for field in sorted(fields)]}")


_PARSER_FLAGS = ("help", "config", "print_config")
"""Flags jsonargparse gives every command."""


OVERLAY_KEY = "overlay_of"
"""Top-level key of a config file meant as a later ``--config`` on top of another (an overlay, which changes only
the keys it names): the path of the config it goes on."""
_OVERLAY_LINE = re.compile(rf"^{OVERLAY_KEY}:.*(\n|$)", re.M)


def _read_overlays(argv: list[str]) -> list[str]:
    """``argv`` with each ``--config`` that declares ``overlay_of: BASE`` read without that line (it is no setting of
    the command, so no run's settings nor reuse keys hold it). An overlay given before any other config is a
    one-line error naming BASE, instead of the error of a half config ("conditions is empty")."""
    import yaml

    from planlm.errors import PlanlmError

    argv, configs_before = list(argv), 0
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            flag, value = "--config=", arg.partition("=")[2]
        elif i and argv[i - 1] == "--config":
            flag, value = "", arg
        else:
            continue
        try:
            text, where = Path(value).read_text(), value
        except OSError:  # jsonargparse reads a YAML string too
            text, where = value, "a --config string"
        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError:  # jsonargparse says what is wrong with it
            config = None
        if isinstance(config, dict) and OVERLAY_KEY in config:
            line, base = _OVERLAY_LINE.search(text), config[OVERLAY_KEY]
            text = text[:line.start()] + text[line.end():] if line else text
            if not (isinstance(base, str) and line and base in line.group()) or _OVERLAY_LINE.search(text):
                raise PlanlmError(f"{where}: write {OVERLAY_KEY} as one top-level line, '{OVERLAY_KEY}: PATH' with "
                                  f"the path of the config this file goes on (got {base!r})")
            if not configs_before:
                raise PlanlmError(f"{where} is an overlay on {base}, not a config of its own; give it after that "
                                  f"one: planlm {argv[0]} --config {base} --config {where}")
            argv[i] = flag + text
        configs_before += 1
    return argv


def _merged_sections(command) -> set[str]:
    """The parameters of ``command`` typed as plain dicts or lists of dicts (`planlm run`'s sections), which
    jsonargparse would replace whole: planlm merges them (``planlm.pipeline.sections.merge_config``)."""
    import inspect

    return {name for name, param in inspect.signature(command).parameters.items() if "dict" in str(param.annotation)}


@functools.cache
def _yaml_loader():
    """PyYAML's safe loader with ``3e-4`` read as a float (YAML 1.2 and jsonargparse do; PyYAML's 1.1 reads a
    string), for config files and flag values alike."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
                                 list("-+0123456789."))
    return Loader


def _read_yaml(text: str):
    import yaml

    return yaml.load(text, Loader=_yaml_loader())


def _merge_argv(argv: list[str], command) -> list[str]:
    """``argv`` of a command with merged sections (`planlm run`) as one merged ``--config``: every ``--config`` and
    every flag, left to right, changes only the keys it names (``planlm.pipeline.sections.merge_config``); --help
    and --print_config pass through. A config that declares ``overlay_of: BASE`` given before any other is a
    one-line error naming BASE."""
    import inspect

    import yaml

    from planlm.errors import PlanlmError
    from planlm.pipeline.sections import UNSET_KEY, dotted_overlay, merge_config

    params = inspect.signature(command).parameters
    merged, passthrough, configs, args = {}, [], 0, iter(argv[1:])
    for arg in args:
        flag, eq, value = arg.partition("=")
        if not flag.startswith("--") or flag[2:] in ("help", "print_config"):
            passthrough.append(arg)
            continue
        if not eq:
            value = next(args, None)
            if value is None:  # a flag without a value: jsonargparse's usage error
                passthrough.append(arg)
                break
        key = flag[2:]
        if key == "config":
            try:
                text, where = Path(value).read_text(), value
            except OSError:  # a YAML string, as jsonargparse reads one
                text, where = value, "a --config string"
            try:
                overlay = _read_yaml(text)
            except yaml.YAMLError as e:
                raise PlanlmError(f"{where}: not YAML ({' '.join(str(e).split())}); fix the file") from e
            if not isinstance(overlay, dict):
                raise PlanlmError(f"{where}: a config is a mapping of keys (got {type(overlay).__name__})")
            base = overlay.pop(OVERLAY_KEY, None)
            if base is not None and not isinstance(base, str):
                raise PlanlmError(f"{where}: write {OVERLAY_KEY} as one top-level line, '{OVERLAY_KEY}: PATH' with "
                                  f"the path of the config this file goes on (got {base!r})")
            if base is not None and not configs:
                raise PlanlmError(f"{where} is an overlay on {base}, not a config of its own; give it after that "
                                  f"one: planlm {argv[0]} --config {base} --config {where}")
            merged, configs = merge_config(merged, overlay, where), configs + 1
            continue
        top = key.split(".")[0]
        as_text = top in params and "." not in key and str(params[top].annotation) in ("str", "<class 'str'>")
        parsed = value if as_text else _read_yaml(value)
        overlay = {UNSET_KEY: parsed} if key == UNSET_KEY else dotted_overlay(key, parsed)
        merged = merge_config(merged, overlay, f"planlm {argv[0]} {flag}")
    config = ["--config=" + yaml.safe_dump(merged, sort_keys=False)] if merged else []
    return [argv[0], *config, *passthrough]


def config_argv(argv: list[str], command) -> list[str]:
    """``argv`` (the command's name first) as jsonargparse reads it: `planlm run`'s configs and flags merged into
    one ``--config`` (``_merge_argv``), another command's overlays read without their ``overlay_of`` line."""
    if _merged_sections(command) and not {"-h", "--help"} & set(argv):
        return _merge_argv(argv, command)
    return _read_overlays(argv)


def _one_line_notes() -> None:
    """planlm's notes outside a stage's console (an old precision spelling read while parsing) as one line each, not
    Python's two-line warning with the source line."""
    import warnings

    from planlm.errors import PlanlmWarning

    library_format = warnings.formatwarning
    if getattr(library_format, "planlm_notes", False):
        return

    def format_note(message, category, filename, lineno, line=None) -> str:
        if issubclass(category, PlanlmWarning):
            return f"planlm: {message}\n"
        return library_format(message, category, filename, lineno, line)

    format_note.planlm_notes = True
    warnings.formatwarning = format_note


def _pop_verbose(argv: list[str]) -> tuple[list[str], bool]:
    """``--verbose true|false`` (or ``--verbose=...``) taken out of ``argv``, for every command."""
    rest, verbose, args = [], False, iter(argv)
    for arg in args:
        if arg == "--verbose" or arg.startswith("--verbose="):
            value = arg.partition("=")[2] or next(args, "true")
            verbose = value.lower() in ("true", "1", "yes", "on")
        else:
            rest.append(arg)
    return rest, verbose


def _with_console(name: str, command):
    """``command`` run inside its console: one live bar, an end line, the libraries' output in
    ``logs/<out_dir name>.txt`` beside its output folder (a command without one, `generate`: in planlm's cache
    folder). `planlm run` gives each stage its own; `compare` and `verify` load no models and run as they are."""
    import inspect

    if name == "run" or not {"out_dir", "model_dir"} & set(inspect.signature(command).parameters):
        return command

    @functools.wraps(command)
    def run_in_console(**kwargs):
        from planlm.console import fmt_seconds, stage_console
        from planlm.files import cache_root

        out_dir = kwargs.get("out_dir")
        log = (Path(out_dir).resolve().parent / "logs" / f"{Path(out_dir).resolve().name}.txt" if out_dir
               else cache_root() / "logs" / f"{name}.txt")
        with stage_console(log) as console:  # no start line: an error stays the one line on stderr
            started = time.time()
            result = command(**kwargs)
            console.line(f"planlm {name}: done in {fmt_seconds(time.time() - started)}"
                         + (f" (library output: {log})" if console.log else ""))
        return result

    return run_in_console


def main(argv: list[str] | None = None) -> None:
    from planlm.data.resources import use_offline_mode_if_no_hub

    _quiet_library_noise()
    _one_line_notes()
    use_offline_mode_if_no_hub()  # before transformers is imported: no minute of hub retries offline

    from jsonargparse import CLI, set_parsing_settings

    # The config dataclasses document each field in a docstring under it: show those in --help.
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    from planlm.errors import PlanlmError
    from planlm.stage import releasing_stage_locks

    from planlm.console import set_verbose

    argv, verbose = _pop_verbose(sys.argv[1:] if argv is None else argv)
    set_verbose(verbose)
    # Build the parser only for the command asked for: importing every stage costs seconds.
    names = [argv[0]] if argv and argv[0] in COMMANDS else list(COMMANDS)
    components = {name: _with_console(name, load_command(name)) for name in names}
    try:
        if len(names) == 1:
            _check_known_keys(argv, components[names[0]])
            argv = config_argv(argv, components[names[0]])
        with releasing_stage_locks():  # a command that raised leaves no folder held
            CLI(components, args=argv, as_positional=False, fail_untyped=True,
                description="planlm: Learning to Plan Long-Term for Language Modeling. Every command also takes "
                            "--verbose true: the libraries' output (banners, bars, notices) stays on the console "
                            "instead of going to logs/.")
    except PlanlmError as e:
        print(f"planlm: error: {e}", file=sys.stderr)
        sys.exit(e.exit_status)
    except OSError as e:  # a full disk, a read-only or vanished folder: what the system said, in one line
        print(f"planlm: error: {e.filename or ''}: {e.strerror or e}; free space or fix the folder, then rerun the "
              f"same command (an unfinished stage has no manifest and is rebuilt)", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("planlm: interrupted; rerun the same command to resume", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
