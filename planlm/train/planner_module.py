"""``LightningPlanner``: the training/validation steps and the optimiser of a ``Planner``.

Letters: B boundaries, S context sentences, E embedding width, T horizon, A actions.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F

from planlm.models.planner import Planner
from planlm.plans.contexts import IGNORE_INDEX
from planlm.train.harness import warmup_schedule


def context_of(planner: Planner, batch: dict) -> torch.Tensor:
    """The batch's context_embeds (B, S, E): cached, or computed by the planner's own encoder."""
    if "context_embeds" in batch:
        return batch["context_embeds"]
    mask = batch["context_mask"]
    if not batch["texts"]:
        return torch.zeros(*mask.shape, planner.config.embedding_dim, device=mask.device)
    embeds = planner.embed_sentences(batch["texts"])  # (U, E)
    return embeds[batch["context_index"]] * mask.unsqueeze(-1)  # (B, S, E)


def trim_horizon(targets: torch.Tensor) -> torch.Tensor:
    """Drop trailing steps that no boundary of the batch can supervise (saves g/f passes, same loss)."""
    valid_steps = int((targets != IGNORE_INDEX).sum(dim=1).max())
    return targets[:, :max(valid_steps, 1)]


def action_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The planner's loss: the mean cross-entropy of its logits (..., T, A) over the valid steps of targets (..., T)."""
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), ignore_index=IGNORE_INDEX)


class LightningPlanner(L.LightningModule):
    """Holds the training/validation steps and the optimiser of a Planner."""

    def __init__(self, planner: Planner, lr: float = 1e-4, weight_decay: float = 1e-4, encoder_lr: float = 1e-5,
                 warmup_steps: int = 0):
        super().__init__()
        self.planner = planner
        self.lr, self.weight_decay, self.encoder_lr, self.warmup_steps = lr, weight_decay, encoder_lr, warmup_steps

    def model_step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The loss over the batch's boundaries, their logits (B, T, A) and targets (B, T), and the context.
        An article batch (target_actions (R, J, T), ArticleCollate) is one pass per row; its boundaries are
        then flattened (B = R*J, padding included as IGNORE_INDEX targets)."""
        targets = trim_horizon(batch["target_actions"].flatten(0, -2)).view(*batch["target_actions"].shape[:-1], -1)
        context_embeds = context_of(self.planner, batch)
        if targets.dim() == 3:  # article rows
            logits = self.planner.article_forward(context_embeds, batch["context_mask"], targets).flatten(0, 1)
            targets = targets.flatten(0, 1)  # (B, T)
        else:
            logits = self.planner(context_embeds, batch["context_mask"], targets)  # (B, T, A)
        return action_loss(logits, targets), logits, targets, context_embeds

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, _, targets, _ = self.model_step(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=int((targets[:, 0] != IGNORE_INDEX).sum()))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, logits, targets, context_embeds = self.model_step(batch)
        valid = targets != IGNORE_INDEX  # (B, T)
        step1 = ((logits[:, 0].argmax(-1) == targets[:, 0]) & valid[:, 0]).sum() / valid[:, 0].sum().clamp(min=1)
        if batch["target_actions"].dim() == 3:  # article rows: every boundary's start state from one pass per row
            rows, bounds = torch.nonzero(batch["target_actions"][..., 0] != IGNORE_INDEX, as_tuple=True)
            state = self.planner.article_start(context_embeds, batch["context_mask"], rows, bounds, targets.shape[1])
            free_logits = torch.zeros_like(logits)
            free_logits[rows * batch["target_actions"].shape[1] + bounds] = self.planner.decode(state, targets.shape[1])[0]
        else:
            free_logits, _ = self.planner.rollout(context_embeds, batch["context_mask"], targets.shape[1])
        free_correct = (free_logits.argmax(-1) == targets) & valid
        batch_size = int(valid[:, 0].sum())
        self.log("val/loss", loss, prog_bar=True, batch_size=batch_size, sync_dist=True)
        self.log("val/acc_step1", step1, batch_size=batch_size, sync_dist=True)
        self.log("val/acc_free_running", free_correct.sum() / valid.sum(), batch_size=batch_size, sync_dist=True)

    def configure_optimizers(self):
        encoder = self.planner.representation.encoder
        encoder_params = set(map(id, encoder.parameters())) if encoder is not None else set()
        groups = [{"params": [p for p in self.planner.parameters() if id(p) not in encoder_params], "lr": self.lr}]
        if encoder is not None:
            groups.append({"params": list(encoder.parameters()), "lr": self.encoder_lr})
        optimizer = torch.optim.AdamW(groups, lr=self.lr, weight_decay=self.weight_decay,
                                      fused=self.device.type == "cuda" or None)  # one kernel per step on a GPU
        if not self.warmup_steps:
            return optimizer  # the paper's constant rate (and the same optimiser state as before warm-up existed)
        return {"optimizer": optimizer, "lr_scheduler": warmup_schedule(optimizer, self.warmup_steps)}
