"""How fast a command computes, not what: train-lm's speed knobs (``planlm.args.LMRuntime``: ``--runtime.compile``,
``--runtime.loss_chunk_size``, ``--runtime.compile_loss``) applied to a model, the chunked loss that evaluation
always uses, and malloc's keeping of freed memory, which every training and evaluation turns on.

The model a command trains or scores is the same with any of these up to floating-point rounding, so they are not
part of a stage's reuse key. The arithmetic's precision (``--runtime.precision``) is, and is applied by each
command's autocast or Lightning's Trainer.
"""

from __future__ import annotations

from torch import nn

from planlm.args import LMRuntime
from planlm.models.lm_loss import compile_or_eager, split_lm_head  # compile_or_eager re-exported


def speed_up_lm(model, speed: LMRuntime, command: str) -> None:
    """Apply the speed knobs of ``speed`` (train-lm's runtime group; evaluation: its defaults) to a PlannedLM in
    place: the chunked loss, and torch.compile of its LM's transformer (the model without its output projection,
    where the LM has a plain one) and of its adapter."""
    model.loss_chunk_size = speed.loss_chunk_size
    model.compile_loss = speed.compile_loss
    if speed.compile:
        import torch._dynamo

        options = compile_options(speed)
        # one graph per static shape (planlm.train.shapes): the adapter's buckets, training's and validation's
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        split = split_lm_head(model.lm)
        compile_module(split[0] if split is not None else model.lm, f"{command}: the LM", **options)
        if model.adapter is not None:
            compile_module(model.adapter, f"{command}: the adapter", **options)
        model.static_shapes = True  # the chunked loss masks the ignored tokens instead of indexing the scored ones


RECOMPILE_LIMIT = 64
"""How many graphs dynamo keeps for one compiled function before it runs it eager (its default, 8, is fewer than
the buckets of sentences times training and validation)."""


def compile_options(speed: LMRuntime) -> dict:
    """torch.compile's options for ``speed.compile``: static shapes (the stage pads its batches to a few); CUDA
    graphs (mode reduce-overhead) for ``cudagraphs`` on a CUDA device; on the CPU, dropout's random numbers drawn by
    PyTorch's own generator instead of inductor's (``fallback_random``): faster there than inductor's C++ kernels,
    which draw them element by element, and the compiled LM then draws the same dropout masks as the eager one."""
    options = {"dynamic": False}
    device_type = speed.training_device_type()
    if speed.compile == "cudagraphs" and device_type == "cuda":
        options["mode"] = "reduce-overhead"
    elif device_type == "cpu":
        options["options"] = {"fallback_random": True}
    return options


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


def compile_module(module: nn.Module, what: str, **options) -> nn.Module:
    """torch.compile ``module``'s forward in place (its state dict, and so its checkpoints, keep their keys), with
    ``compile_or_eager``'s fallback; ``options``: torch.compile's."""
    module.forward = compile_or_eager(module.forward, what, **options)
    return module
