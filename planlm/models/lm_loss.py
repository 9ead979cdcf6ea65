"""The LM's output projection and cross-entropy in chunks of tokens, without all of its logits.

A small LM spends most of its step in its output projection: at the demo's shape (16 x 128 tokens, a
50,257-token vocabulary, width 128) the logits are 411 MB in fp32, their gradient as much again, and
both are allocated afresh at every step. ``linear_cross_entropy`` computes, for C tokens at a time, the
logits (C, V), their log-sum-exp and the NLL of each target; when training it computes the gradients
of the hidden states and of the projection weight right away (softmax - one-hot), so at most C x V
logits exist at once and none is kept for the backward pass. The matrix products run in the autocast
dtype (bf16 under bf16 autocast), the log-sum-exp and the NLL in fp32, like the plain path's loss on
upcast logits. Exact up to floating-point summation order (tested against F.cross_entropy).

With ``compiled``, the element-wise work of a training chunk (upcast, max, exp, sum, NLL, softmax - one-hot,
downcast: eight passes over C x V values in eager mode) is one ``torch.compile``d kernel (``softmax_grad``),
which reads the logits once and writes their gradient once; where compilation fails, one warning, then eager.

With ``static``, every token goes through the chunks and the ignored ones are masked out (their hidden states
zeroed before the projection, their NLL and gradient set to zero) instead of being selected by a boolean index,
whose size depends on the data: no tensor's shape then depends on the targets, so the host never waits for the
device to learn how many tokens are scored, and a compiled step (``runtime.compile``) sees the same shapes every
batch. The scored tokens' values are the same up to floating-point summation order.

``split_lm_head`` finds the body (the model without its head) and the head of the HF causal LMs whose
logits are a plain bias-free linear map of the last hidden states; other models (logit soft-capping,
scaled or biased heads, LoRA on the head) keep their own loss.

Letters: N tokens, D width, V vocabulary, C tokens per chunk.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch import Tensor, nn

from planlm.data.windows import IGNORE_INDEX
from planlm.errors import PlanlmWarning


def compile_or_eager(fn, what: str, **options):
    """``torch.compile(fn, **options)``, compiled at its first call; when that fails (or torch.compile is missing),
    one warning line names the error (``what``: whose compile) and ``fn`` runs eager from then on."""
    if not hasattr(torch, "compile"):
        warnings.warn(f"{what}: torch.compile is not available in torch {torch.__version__}; running eager",
                      PlanlmWarning, stacklevel=3)
        return fn
    current = torch.compile(fn, **options)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        nonlocal current
        if current is fn:
            return fn(*args, **kwargs)
        try:
            return current(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - any compiler failure: eager gives the same result or its error
            message = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
            warnings.warn(f"{what}: torch.compile failed ({type(error).__name__}: {message}); running eager",
                          PlanlmWarning, stacklevel=2)
            current = fn
            return fn(*args, **kwargs)

    return run


PLAIN_HEAD_MODELS = {"gpt2", "llama", "mistral", "qwen2", "gpt_neox", "opt"}
"""Model types whose logits are ``last_hidden_state @ lm_head.weight.T`` (no bias, no scale, no soft-capping)."""


def split_lm_head(lm: nn.Module) -> tuple[nn.Module, nn.Linear] | None:
    """(body, head) of an HF causal LM (a peft model's base too): ``body(...).last_hidden_state @
    head.weight.T`` are its logits. None when the model is not known to compute its logits so."""
    hf = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    if getattr(getattr(hf, "config", None), "model_type", None) not in PLAIN_HEAD_MODELS:
        return None
    head = hf.get_output_embeddings()
    body = getattr(hf, hf.base_model_prefix, None)
    if type(head) is not nn.Linear or head.bias is not None or body is None:  # LoRA on the head, a biased head
        return None
    return body, head


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int = 1024,
                         reduction: str = "mean", compiled: bool = False, static: bool = False) -> Tensor:
    """Cross-entropy of ``hidden (N, D) @ weight (V, D).T`` against ``targets (N,)`` (IGNORE_INDEX left out),
    C = ``chunk_size`` tokens at a time. reduction: mean (over the scored tokens), sum, or none ((N,) NLL,
    0 at ignored tokens; not differentiable). compiled: the training chunks' element-wise work compiled.
    static: all N tokens through the chunks, the ignored ones masked (no shape that depends on the targets)."""
    scored = targets != IGNORE_INDEX  # (N,)
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if reduction == "none" and needs_grad:
        raise ValueError("linear_cross_entropy: reduction 'none' has no gradient; use mean or sum")
    if static:
        safe_targets = torch.where(scored, targets, 0)  # (N,) an ignored token's target: any valid id, masked later
        if needs_grad:
            total = _LinearCrossEntropy.apply(hidden, weight, safe_targets, chunk_size, compiled, scored)
        else:
            nll = _chunked_nll(hidden, weight, safe_targets, chunk_size, mask=scored)  # (N,) 0 at ignored tokens
            if reduction == "none":
                return nll
            total = nll.sum()
        return total / scored.sum().clamp(min=1) if reduction == "mean" else total
    if reduction == "none":
        nll = hidden.new_zeros(len(targets), dtype=torch.float32)  # (N,)
        nll[scored] = _chunked_nll(hidden[scored], weight, targets[scored], chunk_size)
        return nll
    if needs_grad:
        total = _LinearCrossEntropy.apply(hidden[scored], weight, targets[scored], chunk_size, compiled)
    else:  # validation: no gradient to compute
        total = _chunked_nll(hidden[scored], weight, targets[scored], chunk_size).sum()
    return total / scored.sum().clamp(min=1) if reduction == "mean" else total


def _compute_dtype(tensor: Tensor) -> torch.dtype:
    """The dtype autocast gives a matrix product on ``tensor``'s device (its own dtype without autocast)."""
    device = tensor.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else tensor.dtype


def softmax_grad(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """logits (C, V), target (C, 1) -> (NLL (C,) fp32, softmax - one-hot (C, V) in the logits' dtype), computed
    in fp32: the chunk step of ``_chunked_nll`` written as one expression, for torch.compile to fuse."""
    x = logits.float()  # (C, V)
    peak = x.amax(dim=-1, keepdim=True)  # (C, 1)
    exp = (x - peak).exp()  # (C, V)
    total = exp.sum(dim=-1, keepdim=True)  # (C, 1)
    nll = (peak + total.log() - x.gather(1, target)).squeeze(1)  # (C,)
    one_hot = torch.arange(x.shape[1], device=x.device) == target  # (C, V)
    return nll, (exp / total - one_hot.float()).to(logits.dtype)


_KERNEL: dict = {}
"""``"softmax_grad"``: ``softmax_grad`` compiled once per process (any chunk length, so no recompiles), through
``compile_or_eager``: where compilation fails, one warning, then ``softmax_grad`` eager."""


def _fused_step(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """``softmax_grad`` of a training chunk, compiled."""
    if "softmax_grad" not in _KERNEL:
        _KERNEL["softmax_grad"] = compile_or_eager(softmax_grad, "the chunked loss", dynamic=True)
    return _KERNEL["softmax_grad"](logits, target)


def _chunked_nll(hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int,
                 grad_hidden: Tensor | None = None, grad_weight: Tensor | None = None,
                 compiled: bool = False, mask: Tensor | None = None) -> Tensor:
    """(N,) fp32 NLL of every target; given ``grad_hidden (N, D)`` / ``grad_weight (V, D)`` (fp32 zeros), also
    fills them with the gradients of the summed NLL (with ``compiled``, by the compiled ``softmax_grad``).
    ``mask (N,)`` bool: only these tokens count (the others' hidden states are zeroed before the projection,
    so they add nothing to ``grad_weight``; their NLL and ``grad_hidden`` rows are 0)."""
    dtype = _compute_dtype(hidden)
    weight_c = weight.to(dtype)  # (V, D)
    nll = torch.empty(len(targets), dtype=torch.float32, device=hidden.device)  # (N,)
    fused = compiled and (grad_hidden is not None or grad_weight is not None)
    with torch.autocast(hidden.device.type, enabled=False):
        for start in range(0, len(targets), chunk_size):
            rows = slice(start, start + chunk_size)
            h = hidden[rows].to(dtype)  # (C, D)
            target = targets[rows, None]  # (C, 1)
            keep = None if mask is None else mask[rows, None]  # (C, 1)
            if keep is not None:
                h = torch.where(keep, h, 0)  # (C, D)
            if fused:
                chunk_nll, grad_logits = _fused_step(h @ weight_c.T, target)
                nll[rows] = chunk_nll if keep is None else torch.where(keep[:, 0], chunk_nll, 0)
                _add_grads(grad_logits, h, weight_c, rows, grad_hidden, grad_weight, keep)
                continue
            logits = (h @ weight_c.T).float()  # (C, V)
            target_logit = logits.gather(1, target)  # (C, 1)
            peak = logits.amax(dim=-1, keepdim=True)  # (C, 1)
            exp = logits.sub_(peak).exp_()  # in place: one exp serves the log-sum-exp and the softmax (C, V)
            total = exp.sum(dim=-1, keepdim=True)  # (C, 1)
            chunk_nll = (peak + total.log() - target_logit).squeeze(1)  # (C,)
            nll[rows] = chunk_nll if keep is None else torch.where(keep[:, 0], chunk_nll, 0)
            if grad_hidden is None and grad_weight is None:
                continue
            grad_logits = exp.mul_(total.reciprocal())  # softmax (C, V)
            grad_logits.scatter_add_(1, target, grad_logits.new_full(target.shape, -1.0))  # minus the one-hot
            _add_grads(grad_logits.to(dtype), h, weight_c, rows, grad_hidden, grad_weight, keep)
    return nll


def _add_grads(grad_logits: Tensor, h: Tensor, weight_c: Tensor, rows: slice, grad_hidden: Tensor | None,
               grad_weight: Tensor | None, keep: Tensor | None = None) -> None:
    """Back through the projection: grad_logits (C, V), h (C, D), weight_c (V, D); ``keep (C, 1)``: the rows
    that count (``h`` is already zero elsewhere)."""
    if grad_hidden is not None:
        grad = grad_logits @ weight_c  # (C, D)
        grad_hidden[rows] = grad if keep is None else torch.where(keep, grad, 0)
    if grad_weight is not None:
        grad_weight.add_(grad_logits.T @ h)  # (V, D)


class _LinearCrossEntropy(torch.autograd.Function):
    """Summed NLL whose gradients are computed in the forward pass, chunk by chunk (no logits kept)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int, compiled: bool,
                mask: Tensor | None = None) -> Tensor:
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        nll = _chunked_nll(hidden, weight, targets, chunk_size, grad_hidden, grad_weight, compiled, mask)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = hidden.dtype, weight.dtype
        return nll.sum()

    @staticmethod
    def backward(ctx, grad_total: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        return (None if grad_hidden is None else (grad_hidden * grad_total).to(hidden_dtype),
                None if grad_weight is None else (grad_weight * grad_total).to(weight_dtype), None, None, None, None)
