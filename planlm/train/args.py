"""The trainer and optimiser group that ``train-planner`` and ``train-lm`` share (``--train.*``), written once.

``TrainArgs`` holds every knob of the Lightning Trainer and the AdamW optimiser that both trainings take, with its
documentation and its checks; each command's train config extends it with the knobs of its own data and model
(``LMTrainConfig``: windows, the adapter's learning rates; ``PlannerTrainArgs``: the encoder's learning rate, the
final evaluation) and restates a default where the paper's recipe differs. The harness
(``planlm.train.harness.build_trainer``) builds the Trainer from a ``TrainArgs`` and the runtime group
(``planlm.args.Runtime``: the accelerator and the precision).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Optional, Union

from planlm.args import Runtime
from planlm.errors import PlanlmError
from planlm.train.loggers import DEFAULT_LOGGERS, check_loggers

@dataclass
class TrainArgs:
    """The trainer and optimiser knobs of a training command (Lightning Trainer, AdamW)."""

    batch_size: int = 32
    """Examples per batch (per device): windows (train-lm) or sentence boundaries (train-planner)."""
    accumulate_grad_batches: int = 1
    """Gradient accumulation steps."""
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_epochs: int = 1
    """Epochs over the training data (ignored when max_steps > 0 ends training first)."""
    max_steps: int = -1
    """Optimiser steps (-1: no limit)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps (constant afterwards)."""
    val_check_interval: Optional[Union[int, float]] = None
    """Validate every this many training batches (int) or fraction of an epoch (float); None: each epoch."""
    limit_train_batches: Optional[Union[int, float]] = None
    """Use only this many (int) or this fraction (float) of training batches per epoch."""
    limit_val_batches: Optional[Union[int, float]] = None
    """Use only this many (int) or this fraction (float) of validation batches."""
    gradient_clip_val: Optional[float] = 1.0
    """Clip the gradient norm (None: no clipping)."""
    early_stopping_patience: Optional[int] = None
    """Stop when val/loss has not improved for this many validations (None: off)."""
    seed: int = 0
    """Run seed of the initialisation, the order of the data and dropout (train-lm draws each from a stream of its
    own, so every condition of a run starts from the same weights and sees the same data)."""
    devices: Union[int, str] = "auto"
    """Lightning devices: how many (or which) of the runtime group's accelerator (``--runtime.device``) to train on."""
    strategy: str = "auto"
    """Lightning strategy (auto, ddp, ...)."""
    num_nodes: int = 1
    """Lightning nodes."""
    num_workers: int = 0
    """DataLoader worker processes."""
    log_every_n_steps: int = 50
    """Logging interval in steps."""
    loggers: list[str] = field(default_factory=lambda: list(DEFAULT_LOGGERS))
    """Where metrics are logged: csv and tensorboard (default), wandb, mlflow or comet (when installed), or a
    Lightning Logger class path (module.Class)."""

    # Knobs that do not change the trained model: left out of the reuse key (a command adds its own).
    DISPLAY_ONLY: ClassVar[tuple[str, ...]] = ("num_workers", "loggers")
    # The command's name in its error messages.
    COMMAND: ClassVar[str] = "train"

    def __post_init__(self):
        for name in ("batch_size", "accumulate_grad_batches", "max_epochs", "num_nodes", "log_every_n_steps"):
            self._at_least(name, 1)
        self._at_least("warmup_steps", 0)
        if self.lr <= 0:
            raise PlanlmError(f"{self.COMMAND}: --train.lr must be > 0 (got {self.lr})")
        if self.weight_decay < 0:
            raise PlanlmError(f"{self.COMMAND}: --train.weight_decay must be >= 0 (got {self.weight_decay})")
        if self.early_stopping_patience is not None:
            self._at_least("early_stopping_patience", 1)
        check_loggers(self.loggers, f"{self.COMMAND}: --train.loggers")

    def _at_least(self, name: str, low: int) -> None:
        if getattr(self, name) < low:
            raise PlanlmError(f"{self.COMMAND}: --train.{name} must be >= {low} (got {getattr(self, name)})")

    def reuse_key(self, runtime: Runtime) -> dict[str, Any]:
        """The knobs that change the trained model, as the stage's reuse key holds them (``DISPLAY_ONLY`` left out),
        with the ``runtime`` group's accelerator and precision."""
        key = {}
        for knob in fields(self):
            value = getattr(self, knob.name)
            if knob.name in self.DISPLAY_ONLY:
                continue
            key[knob.name] = list(value) if isinstance(value, (list, tuple)) else value
        key["accelerator"] = runtime.accelerator()
        key["precision"] = runtime.precision
        return key


def recorded_runtime(key: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer group, runtime group) of a training, from the ``train`` part of its reuse key as a stage's manifest
    records it (``TrainArgs.reuse_key``): the trainer knobs without the runtime's accelerator and precision, and
    those two as the runtime group's device and precision."""
    train = {name: value for name, value in key.items() if name not in ("accelerator", "precision")}
    return train, {"device": key.get("accelerator", "auto"), "precision": key.get("precision", "auto")}


__all__ = ["TrainArgs", "recorded_runtime"]
