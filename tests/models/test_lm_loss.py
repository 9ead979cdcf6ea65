"""The chunked linear + cross-entropy (planlm.models.lm_loss) against the plain path: loss, gradients and
per-token NLL, in fp32 and under bf16 autocast, alone and inside PlannedLM."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from planlm.data.artifacts import PreparedDataset
from planlm.models.lm_loss import IGNORE_INDEX, linear_cross_entropy, split_lm_head
from planlm.models.planned_lm import PlannedLM, PlannedLMConfig

from helpers import tiny_gpt2, tiny_planned_lm


def _problem(num_tokens: int = 37, width: int = 16, vocab: int = 301):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(num_tokens, width, generator=gen, requires_grad=True)  # (N, D)
    weight = (torch.randn(vocab, width, generator=gen) * 0.3).requires_grad_()  # (V, D)
    targets = torch.randint(0, vocab, (num_tokens,), generator=gen)  # (N,)
    targets[[0, 5, 6]] = IGNORE_INDEX
    return hidden, weight, targets


@pytest.mark.parametrize("chunk_size", [1, 8, 1000])
def test_chunked_loss_and_gradients_equal_the_plain_cross_entropy(chunk_size):
    hidden, weight, targets = _problem()
    plain = F.cross_entropy(hidden @ weight.T, targets, ignore_index=IGNORE_INDEX)
    plain_grads = torch.autograd.grad(plain, (hidden, weight))
    chunked = linear_cross_entropy(hidden, weight, targets, chunk_size)
    chunked_grads = torch.autograd.grad(chunked, (hidden, weight))
    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-6)
    for got, expected in zip(chunked_grads, plain_grads):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    # reduction sum scales the gradient with the upstream gradient; none gives each token's NLL, 0 where ignored
    summed = linear_cross_entropy(hidden, weight, targets, chunk_size, reduction="sum")
    (grad_weight,) = torch.autograd.grad(summed * 0.5, weight)
    torch.testing.assert_close(grad_weight, plain_grads[1] * 0.5 * (targets != IGNORE_INDEX).sum(), rtol=1e-5,
                               atol=1e-6)
    with torch.no_grad():
        per_token = linear_cross_entropy(hidden, weight, targets, chunk_size, reduction="none")
        expected = F.cross_entropy(hidden @ weight.T, targets, ignore_index=IGNORE_INDEX, reduction="none")
    torch.testing.assert_close(per_token, expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="no gradient"):
        linear_cross_entropy(hidden, weight, targets, reduction="none")


@pytest.mark.parametrize("autocast", [False, True])
def test_the_fused_chunk_step_computes_what_the_eager_one_does(monkeypatch, autocast):
    """``compiled``'s chunk step (softmax_grad, here run uncompiled: torch.compile as the identity) gives the eager
    chunks' loss and gradients; the compiled kernel itself is tested in tests/test_speed.py (slow)."""
    from planlm.models import lm_loss

    monkeypatch.setattr(lm_loss, "_KERNEL", {})
    compiled_fns = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: compiled_fns.append(fn) or fn)
    hidden, weight, targets = _problem()
    results = []
    for compiled in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = linear_cross_entropy(hidden, weight, targets, 8, compiled=compiled)
        results.append((loss, *torch.autograd.grad(loss, (hidden, weight))))
    assert compiled_fns == [lm_loss.softmax_grad] and "softmax_grad" in lm_loss._KERNEL  # the fused path ran
    for got, expected in zip(results[1], results[0]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6 if not autocast else 1e-4)


def test_chunked_loss_under_bf16_autocast_matches_the_plain_path_under_it():
    """The products run in bf16 as autocast gives the plain path's head; the NLL is summed in fp32."""
    hidden, weight, targets = _problem()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=IGNORE_INDEX)
        chunked = linear_cross_entropy(hidden, weight, targets, 8)
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, plain, rtol=1e-3, atol=1e-3)
    grads = [torch.autograd.grad(loss, (hidden, weight)) for loss in (plain, chunked)]
    for got, expected in zip(grads[1], grads[0]):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=0.05, atol=2e-3)


def test_planned_lm_chunked_loss_equals_the_hf_loss_with_and_without_plans(synthetic_random):
    model = tiny_planned_lm(PreparedDataset(synthetic_random))  # eval mode: no dropout, the two paths comparable
    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, 50257, (3, 20), generator=gen)  # (B, L)
    labels = input_ids.clone()
    labels[2, 15:] = IGNORE_INDEX  # padding
    plan_embeds = torch.randn(3, 20, model.hidden_size, generator=gen)  # (B, L, D)
    for plans in (None, plan_embeds):
        losses, grads = [], []
        for chunk_size in (0, 7):
            model.loss_chunk_size = chunk_size
            out = model(input_ids=input_ids, labels=labels, plan_embeds=plans)
            losses.append(out.loss)
            grads.append(torch.autograd.grad(out.loss, list(model.lm.parameters())))
        assert out.logits is None  # the chunked path keeps no logits
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
        for got, expected in zip(grads[1], grads[0]):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)  # summation order


def test_token_nll_equals_the_plain_logits_per_token(synthetic_random):
    model = tiny_planned_lm(PreparedDataset(synthetic_random))
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 50257, (4, 25), generator=gen)  # (B, L+1)
    plan_embeds = torch.randn(4, 24, model.hidden_size, generator=gen)  # (B, L, D)
    with torch.no_grad():
        logits = model(input_ids=tokens[:, :-1], plan_embeds=plan_embeds).logits[:, -9:]  # (B, P, V)
        expected = F.cross_entropy(logits.flatten(0, 1), tokens[:, -9:].flatten(), reduction="none").view(4, 9)
        for chunk_size in (0, 5):
            model.loss_chunk_size = chunk_size
            torch.testing.assert_close(model.token_nll(tokens[:, :-1], tokens[:, -9:], plan_embeds), expected,
                                       rtol=1e-6, atol=1e-6)


def test_heads_the_chunked_path_cannot_reproduce_keep_the_lms_own_loss():
    lm = tiny_gpt2()
    body, head = split_lm_head(lm)
    assert body is lm.transformer and head is lm.lm_head
    lm.lm_head = torch.nn.Linear(32, 50257, bias=True)  # a biased head
    assert split_lm_head(lm) is None
    model = PlannedLM(PlannedLMConfig(), lm)
    model.loss_chunk_size = 8
    input_ids = torch.randint(0, 50257, (2, 10))
    out = model(input_ids=input_ids, labels=input_ids)
    assert out.logits is not None and torch.isfinite(out.loss)


@pytest.mark.parametrize("fused", [False, True])
def test_static_selection_masks_ignored_tokens_instead_of_indexing_them(monkeypatch, fused):
    """``static``: every token through the chunks, the ignored ones masked; the same loss, gradients and per-token
    NLL as the boolean selection, and an ignored token's hidden state (even NaN) reaches neither."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)  # the fused step's path, run uncompiled
    from planlm.models import lm_loss

    monkeypatch.setattr(lm_loss, "_KERNEL", {})
    hidden, weight, targets = _problem()
    results = {}
    for static in (False, True):
        loss = linear_cross_entropy(hidden, weight, targets, 8, compiled=fused, static=static)
        results[static] = (loss, *torch.autograd.grad(loss, (hidden, weight)))
    for got, expected in zip(results[True], results[False]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(hidden, weight, targets, 8, reduction="none", static=True),
                                   linear_cross_entropy(hidden, weight, targets, 8, reduction="none"))
    poisoned = hidden.detach().clone()
    poisoned[targets == IGNORE_INDEX] = float("nan")
    poisoned.requires_grad_()
    loss = linear_cross_entropy(poisoned, weight, targets, 8, compiled=fused, static=True)
    grad_hidden, grad_weight = torch.autograd.grad(loss, (poisoned, weight))
    torch.testing.assert_close(loss, results[False][0], rtol=1e-5, atol=1e-7)
    assert torch.isfinite(grad_weight).all() and (grad_hidden[targets == IGNORE_INDEX] == 0).all()
