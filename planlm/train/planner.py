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
    checkpoints/{best,last}.ckpt, run_config.json   Lightning checkpoints and the config they resume under
    logs/                                           CSV and TensorBoard logs (see --train.loggers)
    manifest.json                                   written last

Letters: B boundaries, S context sentences, E embedding width, T horizon, A actions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Optional, Union

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.errors import PlanlmError
from planlm.models.planner import Planner, PlannerConfig, PlannerSettings
from planlm.plans.contexts import check_split
from planlm.speed import keep_freed_memory
from planlm.stage import StageDir
from planlm.train.boundaries import ArticleCollate, BoundaryCollate, BoundaryDataset, LengthGroupedSampler
from planlm.train.args import TrainArgs
from planlm.train.harness import build_trainer, fit, load_best, resume_checkpoint
from planlm.train.planner_metrics import baseline_metrics, evaluate_planner, write_summary
from planlm.train.planner_module import LightningPlanner
from planlm.train.resume import EpochShuffle


@dataclass
class PlannerTrainArgs(TrainArgs):
    """Run knobs: the trainer and optimiser group (``TrainArgs``) at the paper's planner recipe (batch 512, lr 1e-4,
    weight decay 1e-4, no gradient clipping) plus the encoder's learning rate and the articles to fit on. The planner
    and the baselines are fitted on the corpus's planner split (``planner_train`` when ``prepare.planner_corpus``
    gave the planner more documents than the LM, else ``train``), validated and summarised on ``validation``."""

    batch_size: int = 512
    weight_decay: float = 1e-4
    max_epochs: int = 20
    val_check_interval: Optional[Union[int, float]] = 1.0
    gradient_clip_val: Optional[float] = None
    encoder_lr: float = 1e-5
    """Learning rate of the sentence encoder when finetune_encoder is on."""
    max_train_articles: Optional[int] = None
    """Fit on the first N articles of the train split only (None: all): a planner scaling study on one corpus,
    codebook and validation split."""

    DISPLAY_ONLY: ClassVar[tuple[str, ...]] = ("num_workers", "log_every_n_steps", "loggers")
    COMMAND: ClassVar[str] = "train-planner"

    def __post_init__(self):
        super().__post_init__()
        if self.encoder_lr <= 0:
            raise PlanlmError(f"train-planner: --train.encoder_lr={self.encoder_lr} must be > 0")
        if self.max_train_articles is not None and self.max_train_articles < 1:
            raise PlanlmError(f"train-planner: --train.max_train_articles={self.max_train_articles} must be >= 1 or null")


EVAL_BATCH_SIZE = 512
"""Boundaries per batch of the final evaluation (the summary)."""


# ---- the command --------------------------------------------------------------------------------------
def train_planner(prepared_dir: str, out_dir: str, model: PlannerSettings = PlannerSettings(),
                  train: PlannerTrainArgs = PlannerTrainArgs(), runtime: Runtime = Runtime()) -> Path:
    """Train the multi-step planner on a prepared corpus and compare it with majority/unigram/bigram baselines.

    Rerunning the same command resumes from ``checkpoints/last.ckpt``; a complete folder with the same
    configuration is reused as is; rerunning with only a larger max_epochs/max_steps continues training.

    Args:
        prepared_dir: Prepared corpus (``planlm prepare``): sentence embeddings, actions, codebook.
        out_dir: Output folder of the planner (weights, config, summary, checkpoints, logs).
        model: The planner's sizes.
        train: Optimisation and run knobs.
        runtime: The accelerator and precision (runtime.precision bf16: bf16 autocast).

    Returns:
        The planner folder (load it with ``Planner.from_pretrained``).
    """
    runtime.check_training_precision("train-planner")
    prepared = PreparedDataset(prepared_dir)
    config = PlannerConfig(num_actions=prepared.num_actions, embedding_dim=prepared.embedding_dim,
                           encoder_name=prepared.encoder_name if model.finetune_encoder else None, **asdict(model))
    splits = _checked_splits(prepared, config, train)
    with StageDir(out_dir, _stage_config(prepared_dir, prepared, config, train, runtime),
                  keep_partial=True) as stage:
        if not stage.reused:
            _train_into(stage, prepared, prepared_dir, config, train, runtime, splits)
    return stage.path


def _train_into(stage: StageDir, prepared: PreparedDataset, prepared_dir: str, config: PlannerConfig,
                train: PlannerTrainArgs, runtime: Runtime,
                splits: tuple[PreparedSplit, PreparedSplit]) -> None:
    """Train the planner into ``stage`` (resuming its last checkpoint of the same key) and, on rank 0, write the
    weights, the summary and, last, the manifest."""
    out, (train_split, val_split) = stage.path, splits
    # Checkpoints left by a run with another configuration are never resumed (the folder starts again);
    # only the stopping knobs may change (rerun with a larger --train.max_epochs to continue from last.ckpt).
    ckpt_path = resume_checkpoint(out, "run_config.json", stage.key, reset=out)

    L.seed_everything(train.seed, verbose=False)
    planner = _new_planner(prepared, prepared_dir, config)
    keep_freed_memory()
    module = LightningPlanner(planner, lr=train.lr, weight_decay=train.weight_decay, encoder_lr=train.encoder_lr,
                              warmup_steps=train.warmup_steps)
    trainer, best = build_trainer(train, runtime, out, best_filename="best",
                                  log_folders={"csv": "logs", "tensorboard": "logs"})
    fit(trainer, module, _loader(train_split, config, train, shuffle=True),
        _loader(val_split, config, train, shuffle=False), ckpt_path)
    if not trainer.is_global_zero:
        return
    load_best(module, best)
    planner = module.planner.float().cpu()
    planner.save_pretrained(out)
    metrics = _final_metrics(planner, prepared, train_split, val_split, EVAL_BATCH_SIZE,
                             runtime.training_device_type())
    write_summary(out, {
        "prepared_dir": str(Path(prepared_dir).resolve()), "train_split": prepared.planner_split,
        "eval_split": "validation", "num_boundaries": val_split.num_sentences, "horizon": config.horizon,
        "num_actions": prepared.num_actions, "dynamics": config.dynamics,
        "best_checkpoint": Path(best.best_model_path).name if best.best_model_path else None,
        "best_val_loss": float(best.best_model_score) if best.best_model_score is not None else None,
        "global_step": trainer.global_step, "epochs": trainer.current_epoch, "metrics": metrics})
    stage.finish(num_parameters=_num_parameters(planner), codebook_hash=prepared.codebook_hash,
                 num_actions=prepared.num_actions, step1_top1={name: metrics[name]["top1"][0] for name in metrics})


def _checked_splits(prepared: PreparedDataset, config: PlannerConfig,
                    train: PlannerTrainArgs) -> tuple[PreparedSplit, PreparedSplit]:
    """The train and validation splits, after the checks that name the flag to fix."""
    splits = prepared.split(prepared.planner_split), prepared.split("validation")
    for split, what in zip(splits, ("the planner's training split", "the validation split")):
        check_split(split, what)
    if train.max_train_articles is not None:
        splits = (splits[0].head(min(train.max_train_articles, splits[0].num_articles)), *splits[1:])
    train_split = splits[0]
    longest = int(np.diff(train_split.sentence_offsets).max())
    if config.horizon > longest:
        raise PlanlmError(f"{train_split.path}: --model.horizon={config.horizon} exceeds the longest article "
                          f"({longest} sentences), so no boundary has {config.horizon} following sentences to "
                          f"supervise; use --model.horizon <= {longest}")
    if config.finetune_encoder and prepared.encoder_name == "synthetic":
        raise PlanlmError(f"{prepared.path}/manifest.json: encoder 'synthetic' has no model to finetune; "
                          f"use a corpus prepared with a sentence encoder or --model.finetune_encoder false")
    return splits


def _stage_config(prepared_dir: str, prepared: PreparedDataset, config: PlannerConfig, train: PlannerTrainArgs,
                  runtime: Runtime) -> dict:
    """The planner folder's reuse key."""
    return {"prepared_dir": str(Path(prepared_dir).resolve()), "codebook_hash": prepared.codebook_hash,
            "prepared": prepared.manifest.get("config_fingerprint"),  # the corpus, not only its codebook
            "model": config.reuse_key(),
            "train": train.reuse_key(runtime)}


def _new_planner(prepared: PreparedDataset, prepared_dir: str, config: PlannerConfig) -> Planner:
    """A fresh planner (drawn from the global generator: seed it first) that records its corpus."""
    planner = Planner(config, codebook=prepared.codebook)
    planner.prepared_info = {"num_actions": prepared.num_actions, "embedding_dim": prepared.embedding_dim,
                             "codebook_hash": prepared.codebook_hash, "encoder": prepared.encoder_name,
                             "prepared_dir": str(Path(prepared_dir).resolve())}
    planner.train()  # the SentenceTransformer inside h (finetune_encoder) is built in eval mode
    return planner


def _loader(split: PreparedSplit, config: PlannerConfig, train: PlannerTrainArgs, shuffle: bool) -> DataLoader:
    """Every boundary of ``split``: length-grouped shuffled batches (training) or sorted by context length;
    for the article-level encoder, article rows (``_article_loader``)."""
    if config.encoder == "article":
        return _article_loader(split, config, train, shuffle)
    collate = BoundaryCollate(split.path, config.horizon, config.max_sentences, with_texts=config.finetune_encoder,
                              num_articles=split.num_articles)
    sentences = np.arange(split.num_sentences)
    context_lengths = np.minimum(sentences - split.sentence_offsets[split.sentence_article], config.max_sentences)
    sampler = (LengthGroupedSampler(context_lengths, train.batch_size, train.seed) if shuffle
               else np.argsort(context_lengths, kind="stable").tolist())
    return DataLoader(BoundaryDataset(split.num_sentences), batch_size=train.batch_size, sampler=sampler,
                      collate_fn=collate, num_workers=train.num_workers, persistent_workers=train.num_workers > 0)


def _article_loader(split: PreparedSplit, config: PlannerConfig, train: PlannerTrainArgs,
                    shuffle: bool) -> DataLoader:
    """Article rows of ``split`` (``article_rows``), as many per batch as hold about ``batch_size`` boundaries
    (so an epoch takes about as many optimiser steps as with boundary batches); shuffled per epoch."""
    collate = ArticleCollate(split.path, config.horizon, config.max_sentences, num_articles=split.num_articles)
    rows = collate.rows
    per_batch = max(1, round(train.batch_size / max(float(rows[:, 1].mean()), 1.0)))
    dataset = BoundaryDataset(len(rows))  # item = row index
    sampler = EpochShuffle(dataset, seed=train.seed, batch_size=per_batch) if shuffle else None
    return DataLoader(dataset, batch_size=per_batch, sampler=sampler, collate_fn=collate,
                      num_workers=train.num_workers, persistent_workers=train.num_workers > 0)


def _final_metrics(planner: Planner, prepared: PreparedDataset, train_split: PreparedSplit, eval_split: PreparedSplit,
                   batch_size: int, device_type: str) -> dict[str, dict]:
    """Per-step metrics of the planner (teacher-forced, free-running) and of the baselines on ``eval_split``."""
    horizon = planner.config.horizon
    metrics = evaluate_planner(planner, eval_split, horizon, batch_size, torch.device(device_type))
    metrics.update(baseline_metrics(train_split, eval_split, horizon, prepared.num_actions))
    planner.cpu()
    return metrics


def _num_parameters(planner: Planner) -> dict[str, int]:
    return {"representation": sum(p.numel() for p in planner.representation.parameters()),
            "dynamics": sum(p.numel() for p in planner.dynamics.parameters()),
            "prediction": sum(p.numel() for p in planner.prediction.parameters())}
