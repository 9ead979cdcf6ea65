"""``LightningLM``: the training/validation steps and the optimiser of a ``PlannedLM``; ``LightningJointLM``: the
same with the planner trained inside the step (``train.joint``).

Validation reports the perplexity of the whole split (total NLL / total tokens) and, for models with
plans, the plan usage: the loss with the plans shuffled across the split's sentences minus the loss.
"""

from __future__ import annotations

import lightning as L
import torch

from planlm.data.windows import IGNORE_INDEX
from planlm.models.planned_lm import PlannedLM
from planlm.models.planner import Planner
from planlm.plans.config import PlanConfig
from planlm.plans.contexts import Boundaries, PlannerInputs
from planlm.plans.registry import plan_kind
from planlm.seeds import derive_seed
from planlm.train.harness import warmup_schedule
from planlm.train.planner_module import action_loss, trim_horizon
from planlm.train.shapes import StaticShapes


MULTIPATH_LR_SCALE = 0.2
"""The default rate of the multipath adapter's gated transformers, as a fraction of the adapter's
(``LMTrainConfig.multipath_lr_scale``)."""


class LightningLM(L.LightningModule):
    """Training / validation steps and the optimiser of a PlannedLM."""

    def __init__(self, model: PlannedLM, lr: float = 1e-4, weight_decay: float = 0.0, warmup_steps: int = 0,
                 multipath_lr_scale: float = MULTIPATH_LR_SCALE, static_shapes: StaticShapes | None = None,
                 cuda_graphs: bool = False):
        super().__init__()
        from torchmetrics import SumMetric

        self.model = model
        self.static_shapes = static_shapes  # a compiled model: every batch padded to these shapes
        self.cuda_graphs = cuda_graphs  # the compiled model replays CUDA graphs: a new step begins at each batch
        self.lr, self.weight_decay, self.warmup_steps = lr, weight_decay, warmup_steps
        self.multipath_lr_scale = multipath_lr_scale
        # Perplexity = exp(total NLL / total tokens) over the whole validation split (not a mean of batch means).
        # Validation loader 1 (models with plans) holds the same windows with the plans shuffled: plan usage.
        self.val_nll_sum, self.val_tokens = SumMetric(), SumMetric()
        self.shuffled_nll_sum, self.shuffled_tokens = SumMetric(), SumMetric()

    def model_step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean NLL over the batch's predicted tokens, their number)."""
        if self.static_shapes is not None:
            batch = self.static_shapes.pad(batch)
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
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

        The LM's gradient norm and the adapter's are clipped each on their own. A plan vector
        collects the gradient of every token it conditions, so the adapter's gradient norm is about the whole LM's;
        clipped together, even a plan that carries nothing (Fixed) makes the joint norm cross the threshold far more
        often than the LM's alone, shrinking the LM's steps, and the LM learns less.

        Lightning also refuses to clip for a fused optimizer under mixed precision, in case the gradients were still
        loss-scaled; bf16 has no loss scaling (and fp16 gets no fused optimizer), so torch clips them."""
        apart = self.model.adapter is not None
        fused = optimizer is not None and optimizer.param_groups[0].get("fused")
        if not gradient_clip_val or gradient_clip_algorithm not in (None, "norm") or not (apart or fused):
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        if apart:
            groups = self.clip_groups()
        else:
            groups = [[p for g in optimizer.param_groups for p in g["params"]]]
        for params in groups:
            params = [p for p in params if p.grad is not None]
            if params:
                torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    def clip_groups(self) -> list[list[torch.nn.Parameter]]:
        """The parameters whose gradient norm is clipped on its own: the LM's, the adapter's."""
        adapter = self.model.adapter
        in_adapter = {id(p) for p in adapter.parameters()}
        return [[p for p in self.model.parameters() if id(p) not in in_adapter], list(adapter.parameters())]

    def param_groups(self) -> list[dict]:
        """The optimiser's groups: the LM and the adapter (lr) and the transformers behind the adapter's ReZero gates
        (lr x multipath_lr_scale)."""
        adapter = self.model.adapter
        gated = adapter.gated_parameters() if adapter is not None else []
        adapter_params = list(adapter.parameters()) if adapter is not None else []
        in_gated, in_adapter = {id(p) for p in gated}, {id(p) for p in adapter_params}
        return [{"params": [p for p in self.model.parameters() if id(p) not in in_adapter], "lr": self.lr},
                {"params": [p for p in adapter_params if id(p) not in in_gated], "lr": self.lr},
                {"params": gated, "lr": self.lr * self.multipath_lr_scale}]

    def configure_optimizers(self):
        """AdamW over ``param_groups``; a group with nothing to train is left out."""
        groups = [{**g, "params": [p for p in g["params"] if p.requires_grad]} for g in self.param_groups()]
        precision = str(self._trainer.precision) if self._trainer is not None else ""  # no trainer: a bare loop
        fused = self.device.type in ("cpu", "cuda") and not precision.startswith("16")
        optimizer = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=self.weight_decay,
                                      fused=fused or None)  # one kernel per step; fp16's loss scaling: not fused
        return {"optimizer": optimizer, "lr_scheduler": warmup_schedule(optimizer, self.warmup_steps)}


class LightningJointLM(LightningLM):
    """The steps of a PlannedLM trained jointly with its planner (``train.joint``).

    A batch carries the planner's inputs at its sentence boundaries (``planlm.plans.contexts.PlannerInputs``)
    instead of plans; each step the planner makes the plans (``PlannerKind.joint_plans``), so the LM's loss reaches
    the planner through their step probabilities. Training adds the planner's own action loss (teacher forcing on
    the true actions) times ``action_loss_weight``, so that it stays a planner; the planner trains at
    ``planner_lr``, its gradient norm clipped apart from the LM's and the adapter's. The paths are drawn from a
    generator seeded per batch (the run's plan seed, the epoch and the batch), so a resumed run draws what the
    interrupted one would have, and every validation the same paths.

    The planner runs without dropout throughout: the LM trains on the plans it will be evaluated with, and the
    plans of an unchanged planner are exactly those of the frozen plans in expectation (tested)."""

    def __init__(self, model: PlannedLM, planner: Planner, plans: PlanConfig, planner_lr: float | None = None,
                 action_loss_weight: float = 1.0, **kwargs):
        super().__init__(model, **kwargs)
        self.planner, self.plans = planner, plans
        self.planner_lr = self.lr if planner_lr is None else planner_lr
        self.action_loss_weight = action_loss_weight

    def train(self, mode: bool = True) -> LightningJointLM:
        super().train(mode)
        self.planner.eval()  # no dropout in the planner (see the class docstring)
        return self

    def with_plans(self, batch: dict, stream: str) -> tuple[dict, PlannerInputs]:
        """The batch with the planner's plans of its boundaries in place of their inputs (which come back too)."""
        inputs = PlannerInputs(*(batch[name] for name in PlannerInputs._fields))
        boundaries = Boundaries(len(inputs.context_embeds), self.planner.config.num_actions, inputs.context_embeds,
                                inputs.context_mask)
        generator = torch.Generator(device=self.device).manual_seed(derive_seed(self.plans.seed, f"joint/{stream}"))
        plans = plan_kind(self.plans.kind).joint_plans(boundaries, self.plans, generator, self.planner)
        rest = {name: value for name, value in batch.items() if name not in PlannerInputs._fields}
        return {**rest, **plans.inputs()}, inputs

    def action_loss(self, inputs: PlannerInputs) -> torch.Tensor:
        """The planner's own loss at the batch's boundaries (its training objective, over its trained horizon)."""
        targets = trim_horizon(inputs.target_actions)
        return action_loss(self.planner(inputs.context_embeds, inputs.context_mask, targets), targets)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        batch, inputs = self.with_plans(batch, f"train/{self.current_epoch}/{batch_idx}")
        loss = super().training_step(batch, batch_idx)  # the LM's loss, logged as train/loss
        if not self.action_loss_weight:
            return loss
        planner_loss = self.action_loss(inputs)
        self.log("train/action_loss", planner_loss, batch_size=batch["input_ids"].shape[0])
        return loss + self.action_loss_weight * planner_loss

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        batch, inputs = self.with_plans(batch, f"validation/{batch_idx}")
        super().validation_step(batch, batch_idx, dataloader_idx)
        if dataloader_idx == 0:
            self.log("val/action_loss", self.action_loss(inputs), batch_size=len(inputs.target_actions),
                     sync_dist=True, add_dataloader_idx=False)

    def clip_groups(self) -> list[list[torch.nn.Parameter]]:
        return [*super().clip_groups(), list(self.planner.parameters())]

    def param_groups(self) -> list[dict]:
        return [*super().param_groups(), {"params": list(self.planner.parameters()), "lr": self.planner_lr}]
