"""``planlm train-planner``: train the multi-step planner on every sentence boundary of a prepared corpus.

One example per boundary s (every sentence of every article, including the first with an empty
context): context = the last ``max_sentences`` sentences of the article before s, targets = the
actions of s .. s+T-1, steps past the article's end masked out of the loss (mean cross-entropy over
the valid steps), teacher forcing. Validation also reports free-running accuracy (the planner's own
argmax actions fed back). After training, the best checkpoint is saved as safetensors and evaluated
per step (top-1, top-5, NLL) next to the majority, unigram and bigram baselines fitted on the train
split and scored on the same boundaries in the same run (``summary.json`` + ``summary.md``).

Output folder::

    model.safetensors, config.json, prepared.json   the planner (Planner.from_pretrained(folder))
    summary.json, summary.md                        per-step metrics, planner vs baselines
    checkpoints/{best,last}.ckpt, logs/             Lightning checkpoints (resume) and CSV/TensorBoard logs
    manifest.json                                   written last

Letters: B boundaries, S context sentences, E embedding width, T horizon, A actions.
"""

from __future__ import annotations

import shutil
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Union

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.models.planner import Planner, PlannerConfig, PlannerShape
from planlm.plans.sampling import check_split
from planlm.train.boundaries import BoundaryCollate, BoundaryDataset, LengthGroupedSampler
from planlm.train.planner_metrics import baseline_metrics, evaluate_planner, write_summary
from planlm.train.planner_module import LightningPlanner
from planlm.train.resume import RestoreRNG, last_checkpoint
from planlm.utils import PlanlmError, fingerprint, prepare_stage_dir, write_json, write_manifest


@dataclass
class PlannerTrainArgs:
    """Optimisation and run knobs (paper defaults: batch 512, lr 1e-4, weight decay 1e-4)."""

    batch_size: int = 512
    """Boundaries per batch (per device)."""
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    encoder_lr: float = 1e-5
    """Learning rate of the sentence encoder when finetune_encoder is on."""
    max_epochs: int = 20
    """Epochs over the train boundaries."""
    max_steps: int = -1
    """Stop after this many optimiser steps (-1: no limit)."""
    val_check_interval: Union[int, float] = 1.0
    """Validate every N train batches (int) or every fraction of an epoch (float)."""
    early_stopping_patience: Optional[int] = None
    """Stop when val/loss has not improved for this many validations (None: off)."""
    seed: int = 0
    """Seed of initialisation and shuffling."""
    num_workers: int = 0
    """DataLoader workers."""
    accelerator: str = "auto"
    """Lightning accelerator (auto, cpu, gpu ...)."""
    devices: Union[int, str] = "auto"
    """Lightning devices."""
    strategy: str = "auto"
    """Lightning strategy (auto, ddp ...)."""
    num_nodes: int = 1
    """Lightning num_nodes."""
    precision: Optional[str] = None
    """Lightning precision; default bf16-mixed on CUDA, 32-true otherwise."""
    progress_bar: bool = True
    """Show the progress bar."""
    log_every_n_steps: int = 50
    """Logging interval in steps."""
    train_split: str = "train"
    """Split the planner and the baselines are fitted on."""
    val_split: str = "validation"
    """Split for validation during training (checkpoint selection, early stopping)."""
    eval_split: str = "validation"
    """Split the final summary (planner vs baselines) is computed on."""
    eval_batch_size: int = 512
    """Boundaries per batch in the final evaluation."""

    def __post_init__(self):
        for name in ("batch_size", "eval_batch_size", "num_nodes", "log_every_n_steps", "max_epochs"):
            if getattr(self, name) < 1:
                raise PlanlmError(f"train-planner: --train.{name}={getattr(self, name)} must be >= 1")
        for name in ("lr", "encoder_lr"):
            if getattr(self, name) <= 0:
                raise PlanlmError(f"train-planner: --train.{name}={getattr(self, name)} must be > 0")
        if self.weight_decay < 0:
            raise PlanlmError(f"train-planner: --train.weight_decay={self.weight_decay} must be >= 0")
        if self.early_stopping_patience is not None and self.early_stopping_patience < 1:
            raise PlanlmError("train-planner: --train.early_stopping_patience must be >= 1 or null")


# ---- the command --------------------------------------------------------------------------------------
def train_planner(prepared_dir: str, out_dir: str, model: PlannerShape = PlannerShape(),
                  train: PlannerTrainArgs = PlannerTrainArgs()) -> Path:
    """Train the multi-step planner on a prepared corpus and compare it with majority/unigram/bigram baselines.

    Rerunning the same command resumes from ``checkpoints/last.ckpt``; a complete folder with the same
    configuration is reused as is; rerunning with only a larger max_epochs/max_steps continues training.

    Args:
        prepared_dir: Prepared corpus (``planlm prepare``): sentence embeddings, actions, codebook.
        out_dir: Output folder of the planner (weights, config, summary, checkpoints, logs).
        model: Planner shape.
        train: Optimisation and run knobs.

    Returns:
        The planner folder (load it with ``Planner.from_pretrained``).
    """
    prepared = PreparedDataset(prepared_dir)
    config = PlannerConfig(num_actions=prepared.num_actions, embedding_dim=prepared.embedding_dim,
                           encoder_name=prepared.encoder_name if model.finetune_encoder else None, **asdict(model))
    train_split, val_split, eval_split = (prepared.split(train.train_split), prepared.split(train.val_split),
                                          prepared.split(train.eval_split))
    check_split(train_split, "--train.train_split")
    check_split(val_split, "--train.val_split")
    check_split(eval_split, "--train.eval_split")
    longest = int(np.diff(train_split.sentence_offsets).max())
    if config.horizon > longest:
        raise PlanlmError(f"{train_split.path}: --model.horizon={config.horizon} exceeds the longest article "
                          f"({longest} sentences), so no boundary has {config.horizon} following sentences to "
                          f"supervise; use --model.horizon <= {longest}")
    if model.finetune_encoder and prepared.encoder_name == "synthetic":
        raise PlanlmError(f"{prepared.path}/manifest.json: encoder 'synthetic' has no model to finetune; "
                          f"use a corpus prepared with a sentence encoder or --model.finetune_encoder false")

    out = Path(out_dir)
    # Knobs that do not change the trained planner stay out of the key (changing them keeps the run).
    display_only = ("progress_bar", "num_workers", "log_every_n_steps", "eval_batch_size")
    stage_config = {"prepared_dir": str(Path(prepared_dir).resolve()), "codebook_hash": prepared.codebook_hash,
                    "prepared": prepared.manifest.get("config_fingerprint"),  # the corpus, not only its codebook
                    "model": asdict(config),
                    "train": {key: value for key, value in asdict(train).items() if key not in display_only}}
    if prepare_stage_dir(out, stage_config, keep_partial=True):
        return out
    # Checkpoints left by a run with another configuration must not be resumed; only the stopping knobs
    # may change (rerun with a larger --train.max_epochs to continue a finished run from last.ckpt).
    # Not max_steps: a run stopped by max_steps inside an epoch is checkpointed as if that epoch were
    # finished, so a resumed longer run would skip the epoch's remaining batches; it starts over instead.
    stopping = ("max_epochs", "early_stopping_patience", "val_check_interval")
    run_config = {**stage_config, "train": {k: v for k, v in stage_config["train"].items() if k not in stopping}}
    run_file = out / "run_config.json"
    if run_file.is_file() and fingerprint(run_config) != _read_fingerprint(run_file):
        shutil.rmtree(out)
        out.mkdir(parents=True)
    write_json(run_file, {"config_fingerprint": fingerprint(run_config), "config": run_config})

    L.seed_everything(train.seed, verbose=False)
    planner = Planner(config, codebook=prepared.codebook)
    planner.prepared_info = {"num_actions": prepared.num_actions, "embedding_dim": prepared.embedding_dim,
                             "codebook_hash": prepared.codebook_hash, "encoder": prepared.encoder_name,
                             "prepared_dir": str(Path(prepared_dir).resolve())}
    planner.train()  # the SentenceTransformer inside h (finetune_encoder) is built in eval mode
    module = LightningPlanner(planner, lr=train.lr, weight_decay=train.weight_decay, encoder_lr=train.encoder_lr)

    def loader(split: PreparedSplit, shuffle: bool) -> DataLoader:
        collate = BoundaryCollate(split.path, config.horizon, config.max_sentences, with_texts=config.finetune_encoder)
        sentences = np.arange(split.num_sentences)
        context_lengths = np.minimum(sentences - split.sentence_offsets[split.sentence_article], config.max_sentences)
        sampler = (LengthGroupedSampler(context_lengths, train.batch_size, train.seed) if shuffle
                   else np.argsort(context_lengths, kind="stable").tolist())
        return DataLoader(BoundaryDataset(split.num_sentences), batch_size=train.batch_size, sampler=sampler,
                          collate_fn=collate, num_workers=train.num_workers,
                          persistent_workers=train.num_workers > 0)

    checkpoint = L.pytorch.callbacks.ModelCheckpoint(dirpath=out / "checkpoints", filename="best", monitor="val/loss",
                                                     mode="min", save_top_k=1)
    # last.ckpt at every validation, improved or not; the generators (dropout masks) saved with it.
    callbacks = [checkpoint, last_checkpoint(out / "checkpoints"), RestoreRNG()]
    if train.early_stopping_patience is not None:
        callbacks.append(L.pytorch.callbacks.EarlyStopping(monitor="val/loss", mode="min",
                                                           patience=train.early_stopping_patience))
    on_cuda = torch.cuda.is_available() and train.accelerator in ("auto", "gpu", "cuda")
    precision = train.precision or ("bf16-mixed" if on_cuda else "32-true")
    loggers = [L.pytorch.loggers.CSVLogger(out, name="logs"), L.pytorch.loggers.TensorBoardLogger(out, name="logs")]
    trainer = L.Trainer(accelerator=train.accelerator, devices=train.devices, strategy=train.strategy,
                        num_nodes=train.num_nodes, precision=precision, max_epochs=train.max_epochs,
                        max_steps=train.max_steps, val_check_interval=train.val_check_interval,
                        callbacks=callbacks, logger=loggers, log_every_n_steps=train.log_every_n_steps,
                        enable_progress_bar=train.progress_bar, enable_model_summary=False,
                        num_sanity_val_steps=0, deterministic=False)
    last = out / "checkpoints" / "last.ckpt"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*number of training batches.*")
        warnings.filterwarnings("ignore", message=".*exists and is not empty.*")  # resuming into our own folder
        trainer.fit(module, loader(train_split, True), loader(val_split, False),
                    ckpt_path=str(last) if last.is_file() else None)
    if not trainer.is_global_zero:
        return out
    if checkpoint.best_model_path and Path(checkpoint.best_model_path).is_file():
        state = torch.load(checkpoint.best_model_path, map_location="cpu", weights_only=False)["state_dict"]
        module.load_state_dict(state)
    planner = module.planner.float().cpu()
    planner.save_pretrained(out)

    device = torch.device("cuda") if on_cuda else torch.device("cpu")
    metrics = evaluate_planner(planner, eval_split, config.horizon, train.eval_batch_size, device)
    metrics.update(baseline_metrics(train_split, eval_split, config.horizon, prepared.num_actions))
    planner.cpu()
    summary = {"prepared_dir": str(Path(prepared_dir).resolve()), "train_split": train.train_split,
               "eval_split": train.eval_split, "num_boundaries": eval_split.num_sentences,
               "horizon": config.horizon, "num_actions": prepared.num_actions, "dynamics": config.dynamics,
               "best_checkpoint": Path(checkpoint.best_model_path).name if checkpoint.best_model_path else None,
               "best_val_loss": float(checkpoint.best_model_score) if checkpoint.best_model_score is not None else None,
               "global_step": trainer.global_step, "epochs": trainer.current_epoch, "metrics": metrics}
    write_summary(out, summary)
    num_params = {"representation": sum(p.numel() for p in planner.representation.parameters()),
                  "dynamics": sum(p.numel() for p in planner.dynamics.parameters()),
                  "prediction": sum(p.numel() for p in planner.prediction.parameters())}
    write_manifest(out, stage_config, num_parameters=num_params, codebook_hash=prepared.codebook_hash,
                   num_actions=prepared.num_actions, step1_top1={name: metrics[name]["top1"][0] for name in metrics})
    return out


def _read_fingerprint(path: Path) -> str | None:
    import json

    try:
        return json.loads(path.read_text()).get("config_fingerprint")
    except (json.JSONDecodeError, OSError):
        return None
