"""``LightningLM``: the training/validation steps and the optimiser of a ``PlannedLM``.

Validation reports the perplexity of the whole split (total NLL / total tokens) and, for models with
plans, the plan usage: the loss with the plans shuffled across the split's sentences minus the loss.
"""

from __future__ import annotations

import lightning as L
import torch

from planlm.data.windows import IGNORE_INDEX
from planlm.models.planned_lm import PlannedLM
from planlm.train.harness import warmup_schedule


MULTIPATH_LR_SCALE = 0.2
"""The default rate of the multipath adapter's gated transformers, as a fraction of the adapter's
(``LMTrainConfig.multipath_lr_scale``)."""


class LightningLM(L.LightningModule):
    """Training / validation steps and the optimiser of a PlannedLM."""

    def __init__(self, model: PlannedLM, lr: float = 1e-4, weight_decay: float = 0.0, warmup_steps: int = 0,
                 adapter_lr: float | None = None, multipath_lr_scale: float = MULTIPATH_LR_SCALE,
                 clip_apart: bool = True):
        super().__init__()
        from torchmetrics import SumMetric

        self.model = model
        self.lr, self.weight_decay, self.warmup_steps = lr, weight_decay, warmup_steps
        self.adapter_lr = lr if adapter_lr is None else adapter_lr
        self.multipath_lr_scale = multipath_lr_scale
        self.clip_apart = clip_apart
        # Perplexity = exp(total NLL / total tokens) over the whole validation split (not a mean of batch means).
        # Validation loader 1 (models with plans) holds the same windows with the plans shuffled: plan usage.
        self.val_nll_sum, self.val_tokens = SumMetric(), SumMetric()
        self.shuffled_nll_sum, self.shuffled_tokens = SumMetric(), SumMetric()

    def model_step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean NLL over the batch's predicted tokens, their number)."""
        out = self.model(**batch)
        num_tokens = (batch["labels"][:, 1:] != IGNORE_INDEX).sum()
        return out.loss, num_tokens

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, _ = self.model_step(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])  # per step: no sync
        return loss

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        loss, num_tokens = self.model_step(batch)
        nll_sum, tokens = (self.val_nll_sum, self.val_tokens) if dataloader_idx == 0 else \
            (self.shuffled_nll_sum, self.shuffled_tokens)
        nll_sum.update(loss.float() * num_tokens)
        tokens.update(num_tokens.float())

    def on_validation_epoch_end(self) -> None:
        tokens = self.val_tokens.compute()
        if tokens > 0:  # metrics are already summed across processes
            val_loss = self.val_nll_sum.compute() / tokens
            self.log("val/loss", val_loss, prog_bar=True, sync_dist=False, add_dataloader_idx=False)
            self.log("val/ppl", torch.exp(val_loss), sync_dist=False, add_dataloader_idx=False)
            if self.shuffled_tokens.update_called and self.shuffled_tokens.compute() > 0:
                usage = self.shuffled_nll_sum.compute() / self.shuffled_tokens.compute() - val_loss  # nats per token
                self.log("val/plan_usage", usage, prog_bar=True, sync_dist=False, add_dataloader_idx=False)
        for metric in (self.val_nll_sum, self.val_tokens, self.shuffled_nll_sum, self.shuffled_tokens):
            metric.reset()

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Norm clipping, by torch where Lightning would refuse or clip jointly.

        With ``clip_apart``, the LM's gradient norm and the adapter's are clipped each on their own. A plan vector
        collects the gradient of every token it conditions, so the adapter's gradient norm is about the whole LM's;
        clipped together, even a plan that carries nothing (Fixed) makes the joint norm cross the threshold far more
        often than the LM's alone, shrinking the LM's steps, and the LM learns less.

        Lightning also refuses to clip for a fused optimizer under mixed precision, in case the gradients were still
        loss-scaled; bf16 has no loss scaling (and fp16 gets no fused optimizer), so torch clips them."""
        adapter = self.model.adapter
        apart = self.clip_apart and adapter is not None
        fused = optimizer is not None and optimizer.param_groups[0].get("fused")
        if not gradient_clip_val or gradient_clip_algorithm not in (None, "norm") or not (apart or fused):
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        if apart:
            in_adapter = {id(p) for p in adapter.parameters()}
            groups = [[p for p in self.model.parameters() if id(p) not in in_adapter], list(adapter.parameters())]
        else:
            groups = [[p for g in optimizer.param_groups for p in g["params"]]]
        for params in groups:
            params = [p for p in params if p.grad is not None]
            if params:
                torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    def configure_optimizers(self):
        """AdamW over three groups: the LM (lr), the adapter (adapter_lr) and the transformers behind the
        adapter's ReZero gates (adapter_lr x multipath_lr_scale); a group with nothing to train is left out."""
        adapter = self.model.adapter
        gated = adapter.gated_parameters() if adapter is not None else []
        adapter_params = list(adapter.parameters()) if adapter is not None else []
        in_gated, in_adapter = {id(p) for p in gated}, {id(p) for p in adapter_params}
        groups = [{"params": [p for p in self.model.parameters() if id(p) not in in_adapter], "lr": self.lr},
                  {"params": [p for p in adapter_params if id(p) not in in_gated], "lr": self.adapter_lr},
                  {"params": gated, "lr": self.adapter_lr * self.multipath_lr_scale}]
        groups = [{**g, "params": [p for p in g["params"] if p.requires_grad]} for g in groups]
        precision = str(self._trainer.precision) if self._trainer is not None else ""  # no trainer: a bare loop
        fused = self.device.type in ("cpu", "cuda") and not precision.startswith("16")
        optimizer = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=self.weight_decay,
                                      fused=fused or None)  # one kernel per step; fp16's loss scaling: not fused
        return {"optimizer": optimizer, "lr_scheduler": warmup_schedule(optimizer, self.warmup_steps)}
