"""What several commands share, written once (in the spirit of litgpt's ``args.py``): the runtime group (where a
command computes, in which arithmetic and how fast), the one precision vocabulary, and the old spellings of keys and
values that planlm still reads, each with a one-line note.

The other groups live with the code that reads them: the trainer and optimiser group of both trainings is
``planlm.train.args.TrainArgs``, the sampling group of ``generate`` and ``edit-distance`` is
``planlm.evaluate.generator.SamplingConfig``, the plans group is ``planlm.plans.config.PlanConfig``.
docs/configuration.md lists every key of every command (``python -m planlm.config_docs`` writes it).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from planlm.errors import PlanlmError, PlanlmWarning

if TYPE_CHECKING:
    import torch

PRECISIONS: tuple[str, ...] = ("auto", "native", "fp32", "bf16")
PRECISION_HELP = ("auto (bf16 autocast on CUDA, fp32 elsewhere), native (bf16 where the device computes it natively: "
                  "CUDA or a CPU with AVX512-BF16 / AMX; fp32 elsewhere), fp32 or bf16 (refused on a CPU without it)")
# Lightning's spellings, which older training configs use (None was their default: auto).
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


@dataclass
class Runtime:
    """Where a command computes and in which arithmetic (``--runtime.*``): every command that runs a network takes
    it. Both change the numbers a command writes, so they are part of its reuse key. train-lm's group adds the speed
    knobs of the LM's training (``LMRuntime``)."""

    device: str = "auto"
    """auto (CUDA when available, else the CPU), cpu, cuda, cuda:1 ... Training takes the accelerator from it (cpu
    or cuda); how many devices and how they share the work are the trainer group's train.devices, train.strategy and
    train.num_nodes."""
    precision: str = "auto"
    """auto (bf16 autocast on CUDA, fp32 elsewhere), native (bf16 where the device computes it natively: CUDA or a
    CPU with AVX512-BF16 / AMX; fp32 elsewhere), fp32 or bf16 (refused on a CPU without it); Lightning's bf16-mixed
    and 32-true are read as bf16 and fp32. Its speed against fp32: docs/benchmarks.md."""

    def __post_init__(self):
        self.precision = read_precision(self.precision, "--runtime.precision")
        if self.device == "gpu":  # Lightning's name, which --train.accelerator took
            self.device = "cuda"
        kind, _, index = self.device.partition(":")
        if kind not in ("auto", "cpu", "cuda", "mps") or (index and not index.isdigit()):
            raise PlanlmError(f"--runtime.device {self.device!r}: choose auto, cpu, cuda or cuda:N")

    def torch_device(self) -> torch.device:
        """The torch device: ``auto`` is CUDA when there is one, else the CPU."""
        from planlm.device import resolve_device

        return resolve_device(self.device)

    def arithmetic(self, device_type: str | None = None) -> Literal["fp32", "bf16"]:
        """The arithmetic this precision asks for on ``device_type`` (default: this runtime's device)."""
        return arithmetic(self.precision, device_type or self.torch_device().type)

    def resolved_precision(self) -> str:
        """The precision with ``native`` resolved on this device (bf16 or fp32), so that a reuse key says which
        arithmetic ran; auto, fp32 and bf16 as given."""
        return self.arithmetic() if self.precision == "native" else self.precision

    def accelerator(self) -> str:
        """The Lightning accelerator of a training on this device (auto, cpu, cuda, mps)."""
        return self.device.split(":")[0]

    def training_device_type(self) -> str:
        """cuda when a training on this runtime runs on a CUDA device, cpu otherwise."""
        import torch

        return "cuda" if torch.cuda.is_available() and self.accelerator() in ("auto", "cuda") else "cpu"

    def check_training_precision(self, command: str) -> None:
        """One-line error for bf16 asked of a training on a CPU that lacks it (``command`` names the setting)."""
        from planlm.device import check_bf16

        device_type = self.training_device_type()
        check_bf16(self.arithmetic(device_type), device_type, f"{command}: --runtime.precision")

    def lightning_precision(self) -> str:
        """The Lightning Trainer's precision of a training on this runtime: bf16-mixed or 32-true."""
        return lightning_precision(self.precision, self.training_device_type())


@dataclass
class LMRuntime(Runtime):
    """train-lm's runtime group: the device and the precision, and the speed knobs of the LM's training. They
    compute the same model faster, up to floating-point rounding, so they are not part of the reuse key."""

    compile: bool | Literal["cudagraphs"] = False
    """torch.compile the LM's transformer and the adapter, on batches padded to static shapes (the batch size, the
    context length and a few buckets of sentences per batch: planlm.train.shapes), so an epoch compiles a few graphs
    once. cudagraphs: the same, with CUDA graphs on CUDA (torch.compile's reduce-overhead mode; plain compilation
    elsewhere). When compilation is unavailable or fails for a model: one warning line, then eager. Whether it pays
    for its compile time depends on the model's size and the device (docs/benchmarks.md)."""
    loss_chunk_size: int = 1024
    """Tokens per chunk of the LM's output projection + cross-entropy (planlm.models.lm_loss): the B x L x V logits
    are never held at once, in training and validation. 0: the LM's own loss on all the logits (a model whose head
    is not a plain linear map uses its own loss anyway), faster on a GPU with memory to spare (docs/benchmarks.md)."""
    compile_loss: bool = False
    """torch.compile the element-wise work of the chunked loss's training chunks (planlm.models.lm_loss.softmax_grad:
    one fused pass over the chunk's logits instead of eight); needs ``loss_chunk_size`` > 0. When compilation is
    unavailable or fails: one warning line, then eager."""

    def __post_init__(self):
        super().__post_init__()
        if self.compile not in (False, True, "cudagraphs"):
            raise PlanlmError(f"--runtime.compile {self.compile!r}: choose false, true or cudagraphs")
        if self.loss_chunk_size < 0:
            raise PlanlmError(f"--runtime.loss_chunk_size must be >= 0 (got {self.loss_chunk_size}); 0 turns "
                              f"chunking off")


__all__ = ["Runtime", "LMRuntime", "PRECISIONS", "PRECISION_HELP", "read_precision", "arithmetic",
           "lightning_precision", "renamed_note"]
