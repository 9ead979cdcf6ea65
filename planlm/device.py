"""Where tensors run and in which precision: the device named by ``auto``, bf16 where the hardware computes it
natively, and the autocast that evaluation, sampling and generation run under."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import TYPE_CHECKING

from planlm.errors import PlanlmError

if TYPE_CHECKING:
    import torch


@functools.lru_cache(maxsize=1)
def cpu_supports_bf16() -> bool:
    """Whether this CPU computes bf16 matrix products natively (AVX512-BF16 or AMX): without it, bf16
    autocast on CPU is emulated and slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: ask oneDNN
        import torch

        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return "avx512_bf16" in flags or "amx_bf16" in flags


def check_bf16(precision: str | None, device_type: str, flag: str) -> None:
    """One-line error for bf16 asked of a CPU that lacks it (``flag`` names the setting to change)."""
    if precision and "bf16" in precision and device_type == "cpu" and not cpu_supports_bf16():
        raise PlanlmError(f"{flag} {precision}: this CPU has no native bf16 (no avx512_bf16 / amx_bf16 in "
                          f"/proc/cpuinfo); use fp32 ({flag} {'32-true' if 'mixed' in precision else 'fp32'})")


def resolve_device(device: str) -> torch.device:
    """The torch device of ``device``: ``auto`` is CUDA when there is one, else the CPU."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def autocast(device: torch.device, precision: str):
    """bf16 autocast on CUDA by default (``auto``), fp32 elsewhere; ``bf16`` asks for it on any device
    (CPUs with AVX512-BF16 or AMX run bf16 matrix products natively, faster than fp32; others are refused)."""
    check_bf16(precision, device.type, "--precision")
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        import torch

        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
