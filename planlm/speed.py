"""How fast a command computes, not what: the ``speed`` settings of ``train-lm``, ``train-planner`` and
``evaluate``.

The model a command trains or scores is the same with any of these settings up to floating-point
rounding, so they are not part of a stage's reuse key. The arithmetic's precision (bf16 autocast on
CPUs with AVX512-BF16 or AMX) is each command's own precision setting (``--train.precision bf16-mixed``,
``evaluate --precision bf16``), which is part of the key.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from planlm.errors import PlanlmError
from planlm.models.lm_loss import compile_or_eager, split_lm_head  # compile_or_eager re-exported


@dataclass
class Speed:
    """Speed settings: the same model, computed faster (see planlm.speed)."""

    compile: bool = False
    """torch.compile the LM's transformer and the adapter (train-lm, evaluate) or the planner (train-planner). When
    compilation is unavailable or fails for a model: one warning line, then eager. On the 2-core CPU at the demo's
    shape it did not pay for itself (docs/benchmarks.md; bench_lm.py --speed measures it)."""
    loss_chunk_size: int = 1024
    """Tokens per chunk of the LM's output projection + cross-entropy (planlm.models.lm_loss): the B x L x V logits
    are never held at once, in training, validation and evaluation. 0: the LM's own loss on all the logits."""
    compile_loss: bool = False
    """torch.compile the element-wise work of the chunked loss's training chunks (planlm.models.lm_loss.softmax_grad:
    one fused pass over the chunk's logits instead of eight); needs ``loss_chunk_size`` > 0. When compilation is
    unavailable or fails: one warning line, then eager."""
    keep_freed_memory: bool = True
    """Linux (glibc): malloc serves large blocks from its heap and keeps them when freed, instead of mapping and
    unmapping them at every step (each page faulted in again); the process's memory stays at its peak. For the
    rest of the process, from the command's start (see keep_freed_memory)."""

    def __post_init__(self):
        if self.loss_chunk_size < 0:
            raise PlanlmError(f"--speed.loss_chunk_size must be >= 0 (got {self.loss_chunk_size}); 0 turns chunking off")


def speed_up_lm(model, speed: Speed, command: str) -> None:
    """Apply ``speed`` to a PlannedLM in place: the chunked loss, and torch.compile of its LM's transformer
    (the model without its output projection, where the LM has a plain one) and of its adapter."""
    if speed.keep_freed_memory:
        keep_freed_memory()
    model.loss_chunk_size = speed.loss_chunk_size
    model.compile_loss = speed.compile_loss
    if speed.compile:
        split = split_lm_head(model.lm)
        compile_module(split[0] if split is not None else model.lm, f"{command}: the LM")
        if model.adapter is not None:
            compile_module(model.adapter, f"{command}: the adapter")


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory for reuse: no mmap for large blocks (M_MMAP_MAX 0) and no
    trimming of the heap's top below 2 GB (M_TRIM_THRESHOLD). By default every block over 32 MB (a step's logits
    and their gradient) is mapped afresh and unmapped when freed, so each step faults in all of its pages again.
    Process-wide; returns whether it applied (False off glibc)."""
    import ctypes
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))


def compile_module(module: nn.Module, what: str) -> nn.Module:
    """torch.compile ``module``'s forward in place (its state dict, and so its checkpoints, keep their keys), with
    ``compile_or_eager``'s fallback."""
    module.forward = compile_or_eager(module.forward, what)
    return module
