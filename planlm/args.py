"""What several commands share, written once (in the spirit of litgpt's ``args.py``): the one precision vocabulary,
and the old spellings of keys and values that planlm still reads, each with a one-line note.

The groups themselves live with the code that reads them: the trainer and optimiser group of both trainings is
``planlm.train.args.TrainArgs``, the sampling group of ``generate`` and ``edit-distance`` is
``planlm.evaluate.generator.SamplingConfig``, the speed group is ``planlm.speed.Speed``, the plans group is
``planlm.plans.spec.PlanSpec``. docs/configuration.md lists every key of every command
(``python -m planlm.docs_config`` writes it).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

from planlm.errors import PlanlmError, PlanlmWarning

PRECISIONS: tuple[str, ...] = ("auto", "native", "fp32", "bf16")
PRECISION_HELP = ("auto (bf16 autocast on CUDA, fp32 elsewhere), native (bf16 where the device computes it natively: "
                  "CUDA or a CPU with AVX512-BF16 / AMX; fp32 elsewhere), fp32 or bf16 (refused on a CPU without it)")
# Lightning's spellings, which the training commands took before issue 31 (None was their default: auto).
OLD_PRECISIONS: dict[Any, str] = {"bf16-mixed": "bf16", "32-true": "fp32", "32": "fp32", None: "auto"}


def renamed_note(message: str) -> None:
    """One line telling the user that an old key or value was read under its new name (once per message)."""
    warnings.warn(message, PlanlmWarning, stacklevel=3)


def read_precision(value: Any, flag: str) -> str:
    """``value`` in planlm's precision vocabulary (``PRECISIONS``); an old spelling (``bf16-mixed``, ``32-true``,
    null) is read with a note, anything else is a one-line error naming ``flag``."""
    if value in PRECISIONS:
        return value
    if value in OLD_PRECISIONS:
        new = OLD_PRECISIONS[value]
        renamed_note(f"{flag} {'null' if value is None else value} is read as {new}; planlm's precisions are "
                     f"{', '.join(PRECISIONS)} (update your config)")
        return new
    raise PlanlmError(f"{flag} {value!r}: choose {', '.join(PRECISIONS)}: {PRECISION_HELP}")


def device_precision(value: Any, flag: str, device_type: str) -> str:
    """``read_precision`` with ``native`` resolved on this ``device_type`` (bf16 or fp32), so that a stage's reuse
    key says which arithmetic ran."""
    precision = read_precision(value, flag)
    return arithmetic(precision, device_type) if precision == "native" else precision


def arithmetic(precision: str, device_type: str) -> Literal["fp32", "bf16"]:
    """The arithmetic ``precision`` asks for on a ``device_type`` (cuda, cpu) device: fp32 or bf16."""
    if precision == "native":
        from planlm.device import cpu_supports_bf16

        return "bf16" if device_type == "cuda" or cpu_supports_bf16() else "fp32"
    if precision == "auto":
        return "bf16" if device_type == "cuda" else "fp32"
    return "bf16" if precision == "bf16" else "fp32"


def lightning_precision(precision: str, device_type: str) -> str:
    """Lightning's name of ``precision`` on ``device_type``: bf16-mixed (bf16 autocast) or 32-true."""
    return "bf16-mixed" if arithmetic(precision, device_type) == "bf16" else "32-true"


def read_renamed(section: dict, renamed: dict[str, str], where: str) -> dict:
    """``section`` with each old key of ``renamed`` (old -> new dotted key, ``new_tokens`` ->
    ``sampling.max_new_tokens``) moved to its new place, with a note; a key set under both names is an error."""
    out = dict(section)
    for old, new in renamed.items():
        if old not in out:
            continue
        value = out.pop(old)
        group, _, key = new.rpartition(".")
        target = out.setdefault(group, {}) if group else out
        if not isinstance(target, dict) or key in target:
            raise PlanlmError(f"{where}: {old!r} and {new!r} are the same setting; keep {new!r} only")
        target[key] = value
        renamed_note(f"{where}: {old!r} is read as {new!r} (update your config)")
    return out


__all__ = ["PRECISIONS", "PRECISION_HELP", "read_precision", "device_precision", "arithmetic", "lightning_precision",
           "read_renamed", "renamed_note"]
