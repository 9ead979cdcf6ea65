"""Count the flags of every planlm command: each leaf option that ``planlm CMD --help`` lists, a nested
dataclass field (``--train.lr``) counting as one (``planlm.config_docs.command_flags``).

    python benchmarks/count_flags.py          # one line per command, then the total
"""

from __future__ import annotations

from planlm.commands import COMMANDS
from planlm.config_docs import command_flags


def main() -> None:
    total = 0
    for name in COMMANDS:
        flags = command_flags(name)
        total += len(flags)
        print(f"{name:15s} {len(flags):4d}")
    print(f"{'total':15s} {total:4d} flags across {len(COMMANDS)} commands")


if __name__ == "__main__":
    main()
