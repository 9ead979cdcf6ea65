"""The planner's gradient scale into earlier states through g (MuZero's 0.5) and early stopping in train-planner."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import read_csv, tiny_planner
from planlm.data.artifacts import PreparedDataset
from planlm.models.planner import PlannerSettings
from planlm.plans.contexts import boundary_contexts, boundary_targets
from planlm.stage import read_manifest
from planlm.testing.synthetic import make_synthetic_prepared
from planlm.train.planner import PlannerTrainArgs, train_planner


def step_gradients(prepared, grad_scale: float, step: int) -> dict[str, torch.Tensor]:
    """Gradients of the teacher-forced loss of plan step ``step`` only (0-based) for one fixed planner whose g
    scales the gradient into earlier states by ``grad_scale``."""
    planner = tiny_planner(prepared, dropout=0.0).train()
    assert planner.dynamics.grad_scale == 0.5  # the planner's own
    planner.dynamics.grad_scale = grad_scale
    split = prepared["train"]
    sentences = np.arange(40)
    context_embeds, context_mask = boundary_contexts(split, sentences, planner.config.max_sentences)
    targets = boundary_targets(split, sentences, 3)  # (B, T)
    logits = planner(context_embeds, context_mask, targets.clamp(min=0))  # (B, T, A)
    F.cross_entropy(logits[:, step], targets[:, step].clamp(min=0)).backward()
    return {name: p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            for name, p in planner.named_parameters()}


@pytest.mark.parametrize("step", [1, 2])
def test_g_scales_the_gradient_into_earlier_states(synthetic_cycle, step):
    """Step k's prediction reaches h's latents through k applications of g, each scaling the gradient by s:
    h's gradient is s^k times the unscaled one (0 stops it), g's and f's own gradients do not change."""
    prepared = PreparedDataset(synthetic_cycle)
    full, half, none = (step_gradients(prepared, scale, step) for scale in (1.0, 0.5, 0.0))
    for name in ("representation.projection.weight", "representation.start_latent"):
        assert full[name].abs().max() > 0
        torch.testing.assert_close(half[name], 0.5 ** step * full[name], rtol=1e-4, atol=1e-7)
        assert none[name].abs().max() == 0
    for name in ("prediction.classifier.weight", "dynamics.action_embedding.weight"):
        if step == 1:  # one application of g: its parameters see no scaled path
            torch.testing.assert_close(half[name], full[name], rtol=1e-4, atol=1e-7)
        assert none[name].abs().max() > 0


def test_early_stopping_stops_after_patience_validations_without_improvement(tmp_path):
    """A learning rate too large to settle: val/loss stops improving early, and training stops exactly
    `patience` validations after its best, long before max_epochs; last.ckpt is that final state."""
    prepared = make_synthetic_prepared(tmp_path / "prepared", rule="cycle", seed=5,
                                       num_articles={"train": 40, "validation": 8, "test": 2})
    patience, max_epochs = 2, 30
    out = train_planner(str(prepared), str(tmp_path / "planner"),
                        PlannerSettings(d_model=16, num_heads=2, dim_feedforward=32, horizon=2, dropout=0.0),
                        PlannerTrainArgs(batch_size=64, lr=1.0, max_epochs=max_epochs, early_stopping_patience=patience))
    losses = [float(row["val/loss"]) for row in read_csv(next((out / "logs").glob("version_*/metrics.csv")))
              if row.get("val/loss")]
    best = int(np.argmin(losses))
    assert len(losses) == best + 1 + patience < max_epochs, losses
    assert all(loss >= losses[best] for loss in losses[best + 1:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_val_loss"] == pytest.approx(losses[best]) and summary["best_checkpoint"] == "best.ckpt"
    last = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == summary["global_step"] and last["epoch"] == len(losses) - 1
    assert read_manifest(out)["config"]["train"]["early_stopping_patience"] == patience
