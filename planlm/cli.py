"""The ``planlm`` command line: a dict of typed, documented command functions (jsonargparse).

Every command accepts ``--config FILE.yaml`` and ``--print_config``; ``--help`` comes from the
function's docstring and signature, so the CLI, the Python API and the YAML presets never drift.
"""

from __future__ import annotations

import sys
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


def _check_renamed_flags(argv: list[str], command) -> None:
    """A flag or config key that moved into the ``plans`` group (``--num_paths``, ``--conditioning.*``, ...) is a
    one-line error naming its new name, not jsonargparse's "unrecognized arguments"."""
    import inspect

    import yaml

    from planlm.plans.spec import check_renamed

    accepted = set(inspect.signature(command).parameters)
    flags = [arg[2:].split("=")[0].split(".")[0] for arg in argv if arg.startswith("--")]
    check_renamed(flags, accepted, f"planlm {argv[0]}")
    for flag, value in zip(argv, argv[1:]):
        if flag == "--config" and Path(value).is_file():
            config = yaml.safe_load(Path(value).read_text()) or {}
            check_renamed(config if isinstance(config, dict) else {}, accepted, value)


def main(argv: list[str] | None = None) -> None:
    from planlm.data.resources import use_offline_mode_if_no_hub

    _quiet_library_noise()
    use_offline_mode_if_no_hub()  # before transformers is imported: no minute of hub retries offline

    from jsonargparse import CLI, set_parsing_settings

    # The config dataclasses document each field in a docstring under it: show those in --help.
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    from planlm.utils import PlanlmError, releasing_stage_locks

    argv = sys.argv[1:] if argv is None else argv
    # Build the parser only for the command asked for: importing every stage costs seconds.
    names = [argv[0]] if argv and argv[0] in COMMANDS else list(COMMANDS)
    components = {name: load_command(name) for name in names}
    try:
        if len(names) == 1:
            _check_renamed_flags(argv, components[names[0]])
        with releasing_stage_locks():  # a command that raised leaves no folder held
            CLI(components, args=argv, as_positional=False, fail_untyped=True)
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
