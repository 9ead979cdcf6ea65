"""The training harness of the ``train-*`` commands: one Lightning Trainer built from the trainer group they
share (``planlm.train.args.TrainArgs``), its loggers (``planlm.train.loggers``), the checkpoints (best + last), resume
and the reload of the best checkpoint.

A command keeps its data, its LightningModule and what it writes after training; what happens between
"here is a module and its loaders" and "here are the best weights" is written once, here. In the stage
folder the harness writes::

    checkpoints/          the best weights (lowest val/loss) and last.ckpt (the whole state, to resume),
                          written at every validation
    <stamp>               the fingerprint of the config the checkpoints belong to (resume only under it)
    logs/, tb/, ...       one folder per logger: csv and tensorboard by default; wandb, mlflow, comet or
                          any Lightning Logger class when its package is installed
"""

from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch

from planlm.args import Runtime
from planlm.console import Bar, is_verbose, note, open_bar
from planlm.jsonio import fingerprint, write_json
from planlm.stage.integrity import FORMAT_KEY, FORMAT_VERSION, with_format
from planlm.train.args import TrainArgs
from planlm.train.loggers import make_loggers
from planlm.train.resume import RestoreRNG, ResumeMidEpoch, last_checkpoint

# Knobs that only say how long to train: a finished shorter run resumes into a longer one. Not max_steps
# nor limit_train_batches: Lightning checkpoints a run that they stopped inside an epoch as if the
# epoch were finished, so a longer run resumed from it would train no more (it starts over instead).
LENGTH_KNOBS = ("max_epochs", "early_stopping_patience", "val_check_interval", "limit_val_batches")


# ---- trainer, resume, best checkpoint -----------------------------------------------------------------
class StageProgressBar(L.pytorch.callbacks.ProgressBar):
    """Training on the stage's one live bar (``planlm.console``): the epoch and its batches."""

    def __init__(self) -> None:
        super().__init__()
        self.enabled, self.bar = True, None

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close()
        epochs = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        total = self.total_train_batches if self.total_train_batches != float("inf") else None
        self.bar = open_bar(f"epoch {trainer.current_epoch + 1}{epochs}", total, "batches", self.enabled)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.bar is not None:
            self.bar.advance()

    def on_train_epoch_end(self, *args: Any) -> None:
        self._close()

    def teardown(self, *args: Any, **kwargs: Any) -> None:
        self._close()

    def _close(self) -> None:
        bar: Bar | None = self.bar
        self.bar = None
        if bar is not None:
            bar.close()



def build_trainer(train: TrainArgs, runtime: Runtime, out: Path, *, best_filename: str, log_folders: dict[str, str],
                  has_val: bool = True) -> tuple[L.Trainer, L.pytorch.callbacks.ModelCheckpoint]:
    """(Trainer, its best-checkpoint callback) for a run writing into the stage folder ``out``.

    With validation, ``checkpoints/{best_filename}.ckpt`` keeps the weights of the lowest val/loss (only the
    weights: it is read back by ``load_best``, never resumed, so it holds no optimiser state) and last.ckpt, the
    whole state, is written at every validation, improved or not (see ``last_checkpoint``); without it, the one
    checkpoint is the latest, whole, and ``save_last`` keeps last.ckpt current. The torch generators travel with
    every checkpoint that is resumed (``RestoreRNG``). A callback that rewrites the saved weights in its
    ``on_save_checkpoint`` (Lightning's weight averaging) is not called for a weights-only checkpoint: set
    ``best.save_weights_only = False`` beside it."""
    best = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=out / "checkpoints", filename=best_filename, auto_insert_metric_name=False,
        monitor="val/loss" if has_val else None, mode="min", save_top_k=1, save_last=not has_val,
        save_weights_only=has_val)
    callbacks = [best, last_checkpoint(out / "checkpoints")] if has_val else [best]
    callbacks.append(RestoreRNG())
    if not is_verbose():  # verbose: Lightning's own bar
        callbacks.append(StageProgressBar())
    if train.early_stopping_patience is not None:
        callbacks.append(L.pytorch.callbacks.EarlyStopping(monitor="val/loss", mode="min",
                                                           patience=train.early_stopping_patience))
    trainer = L.Trainer(
        accelerator=runtime.accelerator(), devices=train.devices, strategy=train.strategy, num_nodes=train.num_nodes,
        precision=runtime.lightning_precision(), max_epochs=train.max_epochs, max_steps=train.max_steps,
        val_check_interval=train.val_check_interval, limit_train_batches=train.limit_train_batches,
        limit_val_batches=train.limit_val_batches if has_val else 0,
        accumulate_grad_batches=train.accumulate_grad_batches, gradient_clip_val=train.gradient_clip_val,
        callbacks=callbacks, logger=make_loggers(train.loggers, out, log_folders),
        log_every_n_steps=train.log_every_n_steps, enable_progress_bar=True,
        enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=out)
    return trainer, best


def resume_checkpoint(out: Path, stamp_name: str, run_config: dict, resume: bool = True,
                      reset: Path | None = None) -> str | None:
    """``out/checkpoints/last.ckpt`` when the checkpoints were written by a run whose config differs at
    most in its length (``LENGTH_KNOBS``): resume it. Checkpoints of any other config (or all of them,
    without ``resume``) are deleted, never resumed; ``out/stamp_name`` records the config they belong to.

    ``reset``: the folder deleted (and made again) instead of checkpoints/ when the stamp names another
    config, e.g. the whole stage folder so that its logs start again too. Without a stamp only
    checkpoints/ goes: the folder may hold files that are not the harness's."""
    train = {k: v for k, v in run_config["train"].items() if k not in LENGTH_KNOBS}
    lengthless = {**run_config, "train": train}
    key = fingerprint(lengthless)
    stamp, checkpoints = out / stamp_name, out / "checkpoints"
    stamped = _read_stamp(stamp)
    if not (resume and stamped == key):
        if reset is not None and stamped not in (None, key):
            shutil.rmtree(reset, ignore_errors=True)
            reset.mkdir(parents=True)
        shutil.rmtree(checkpoints, ignore_errors=True)
        write_json(stamp, with_format({"config_fingerprint": key, "config": lengthless}))
    last = checkpoints / "last.ckpt"
    if not last.is_file():
        return None
    from planlm.stage.integrity import checkpoint_is_readable

    damage = checkpoint_is_readable(last)
    if damage:  # cut short by a full disk or a kill mid-save: start again rather than fail in Lightning's loader
        note(f"planlm: {last}: damaged checkpoint ({damage}); training {out} from the start")
        shutil.rmtree(checkpoints, ignore_errors=True)
        return None
    return str(last)


def _read_stamp(stamp: Path) -> str | None:
    """The fingerprint in a stamp file; checkpoints stamped in another planlm's format (``FORMAT_VERSION``) are
    another config's, never resumed."""
    try:
        record = json.loads(stamp.read_text())
    except OSError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "unreadable"
    if not isinstance(record, dict) or record.get(FORMAT_KEY) != FORMAT_VERSION:
        return "another format"
    return record.get("config_fingerprint")


def checkpoint_step(path: str) -> int:
    """The global step a Lightning checkpoint was saved at (its tensors memory-mapped, not read)."""
    import torch

    return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"])


class StageClock(L.Callback):
    """Where a fit's wall time goes: ``seconds`` of the training steps (between the hooks around each batch), of
    validation (its loops, without the checkpoints written after it), of checkpoint writes (``trainer.save_checkpoint``,
    the state gathered and written), and of the whole fit (set by ``fit``); ``saved``: the global step each checkpoint
    path was written at, so that ``load_best`` can tell when the weights in memory are the best ones.

    The device is synchronised only around validation and at the end of the fit, not at every step."""

    def __init__(self) -> None:
        self.seconds = {"fit": 0.0, "steps": 0.0, "validation": 0.0, "checkpoints": 0.0}
        self.steps = 0
        self.saved: dict[str, int] = {}
        self._began = 0.0

    def watch(self, trainer: L.Trainer) -> None:
        """Time ``trainer``'s checkpoint writes and record their steps."""
        save = trainer.save_checkpoint

        def timed_save(filepath, *args, **kwargs):
            began = _clock()
            save(filepath, *args, **kwargs)
            self.seconds["checkpoints"] += _clock() - began
            self.saved[str(filepath)] = trainer.global_step

        trainer.save_checkpoint = timed_save

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._began = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.seconds["steps"] += time.perf_counter() - self._began
        self.steps += 1

    def on_validation_start(self, trainer, pl_module) -> None:
        self._began = _clock()

    def on_validation_end(self, trainer, pl_module) -> None:
        self.seconds["validation"] += _clock() - self._began


def _clock() -> float:
    """time.perf_counter once the device's queued work is done."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def fit(trainer: L.Trainer, module: L.LightningModule, train_loader, val_loaders,
        ckpt_path: str | None) -> StageClock:
    """``trainer.fit``, resumable within an epoch (``ResumeMidEpoch``) when the training sampler can skip
    batches and one process trains, and without the warnings that a resumed run or a tiny corpus always
    raises. Returns where its time went (``StageClock``)."""
    exact_mid_epoch = hasattr(train_loader.sampler, "skip_batches") and trainer.world_size == 1
    if exact_mid_epoch:
        trainer.callbacks.append(ResumeMidEpoch(train_loader.sampler))
    clock = StageClock()
    clock.watch(trainer)
    trainer.callbacks.append(clock)
    began = _clock()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*number of training batches.*")
        warnings.filterwarnings("ignore", message=".*exists and is not empty.*")  # resuming into our own folder
        if exact_mid_epoch:  # Lightning cannot know that ResumeMidEpoch makes the DataLoader resumable
            warnings.filterwarnings("ignore", message=".*ended before the epoch ended.*")
        trainer.fit(module, train_loader, val_loaders, ckpt_path=ckpt_path)
    clock.seconds["fit"] = _clock() - began
    return clock


def load_best(module: L.LightningModule, best: L.pytorch.callbacks.ModelCheckpoint,
              clock: StageClock | None = None) -> bool:
    """Load the weights of the best checkpoint (lowest val/loss) into ``module``; nothing without one, nor when
    ``clock`` saw it written at the step training ended on (the weights in memory are those weights). Returns
    whether it read a checkpoint.

    ``weights_only=True``: both commands' checkpoints hold only tensors and plain values (the random
    generators as tensors, see ``RestoreRNG``), so no pickled code runs on load."""
    from planlm.stage.integrity import load_checkpoint

    path = best.best_model_path
    trainer = module._trainer
    if clock is not None and path and trainer is not None and clock.saved.get(str(path)) == trainer.global_step:
        return False  # no optimiser step since the best checkpoint was written
    if best.monitor is not None and path and Path(path).is_file():
        fix = f"delete {Path(path).parent} and rerun the command (training starts again)"
        module.load_state_dict(load_checkpoint(path, fix)["state_dict"])
        return True
    return False


def warmup_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int) -> dict:
    """Lightning's lr_scheduler entry for a linear warm-up over ``warmup_steps`` optimiser steps, constant after
    (0: the rate from the first step, as a LambdaLR of 1)."""
    warmup = max(1, warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    return {"scheduler": scheduler, "interval": "step"}
