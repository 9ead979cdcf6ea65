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
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.models.planner import Planner, PlannerConfig, PlannerShape
from planlm.plans.sampling import IGNORE_INDEX, boundary_contexts, boundary_targets, check_split, embed_split
from planlm.train.resume import RestoreRNG, last_checkpoint
from planlm.utils import PlanlmError, fingerprint, prepare_stage_dir, write_json, write_manifest

SUMMARY_MODELS = ("planner_teacher_forced", "planner_free_running", "majority", "unigram", "bigram")


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


# ---- data ----------------------------------------------------------------------------------------------
class BoundaryDataset(Dataset):
    """Every sentence boundary of a split (item = split-global sentence index)."""

    def __init__(self, num_sentences: int):
        self.num_sentences = num_sentences

    def __len__(self) -> int:
        return self.num_sentences

    def __getitem__(self, index: int) -> int:
        return index


class LengthGroupedSampler(torch.utils.data.Sampler):
    """Shuffled boundaries in an order where each run of ``batch_size`` has similar context lengths.

    Batches are padded to their longest context, so grouping cuts the padding several-fold (articles
    of 1-15 sentences). Shuffle, cut into mega-batches of 50 batches, sort each by context length, then
    shuffle the order of the batches. Under DDP Lightning swaps it for a DistributedSampler (still
    correct, just without the grouping).
    """

    def __init__(self, context_lengths: np.ndarray, batch_size: int, seed: int = 0, group: int = 50):
        self.context_lengths, self.batch_size, self.seed, self.group = context_lengths, batch_size, seed, group
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.context_lengths)

    def __iter__(self):
        rng = np.random.default_rng((self.seed, self.epoch))
        order = rng.permutation(len(self.context_lengths))
        mega = self.batch_size * self.group
        chunks = [order[i:i + mega] for i in range(0, len(order), mega)]
        chunks = [chunk[np.argsort(self.context_lengths[chunk], kind="stable")] for chunk in chunks]
        batches = [chunk[i:i + self.batch_size] for chunk in chunks for i in range(0, len(chunk), self.batch_size)]
        for index in rng.permutation(len(batches)):
            yield from batches[index].tolist()


class BoundaryCollate:
    """Boundary indices -> {context_embeds (B, S, E), context_mask (B, S), target_actions (B, T), sentences (B,)}.

    With ``with_texts`` (finetuned encoder) the batch carries the unique context sentence texts and
    ``context_index`` (B, S) into them instead of cached embeddings. Holds only the split's path, so it
    pickles cheaply into DataLoader workers.
    """

    def __init__(self, split_path: str | Path, horizon: int, max_sentences: int, with_texts: bool = False):
        self.split_path, self.horizon, self.max_sentences, self.with_texts = Path(split_path), horizon, max_sentences, with_texts
        self._split: PreparedSplit | None = None

    @property
    def split(self) -> PreparedSplit:
        if self._split is None:
            self._split = PreparedSplit(self.split_path)
        return self._split

    def __getstate__(self):
        return {**self.__dict__, "_split": None}

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor | list[str]]:
        sentences = np.asarray(indices, dtype=np.int64)
        targets = boundary_targets(self.split, sentences, self.horizon)  # (B, T)
        if not self.with_texts:
            context_embeds, context_mask = boundary_contexts(self.split, sentences, self.max_sentences)
            return {"context_embeds": context_embeds, "context_mask": context_mask, "target_actions": targets,
                    "sentences": torch.from_numpy(sentences)}
        # Sentence s's context sentences are s-S'..s-1: their indices, found with an index-only "embedding".
        index_column = np.arange(self.split.num_sentences, dtype=np.float32)[:, None]
        context_index, context_mask = boundary_contexts(self.split, sentences, self.max_sentences, index_column)
        context_index = context_index.squeeze(-1).long()  # (B, S)
        unique = torch.unique(context_index[context_mask])
        texts = [self.split.sentence_text(int(s)) for s in unique]
        context_index = torch.searchsorted(unique, context_index).clamp(max=max(len(unique) - 1, 0))
        return {"context_index": context_index, "texts": texts, "context_mask": context_mask,
                "target_actions": targets, "sentences": torch.from_numpy(sentences)}


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


# ---- Lightning wrapper ------------------------------------------------------------------------------
class LightningPlanner(L.LightningModule):
    """Holds the training/validation steps and the optimiser of a Planner."""

    def __init__(self, planner: Planner, lr: float = 1e-4, weight_decay: float = 1e-4, encoder_lr: float = 1e-5):
        super().__init__()
        self.planner = planner
        self.lr, self.weight_decay, self.encoder_lr = lr, weight_decay, encoder_lr

    def model_step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        targets = trim_horizon(batch["target_actions"])  # (B, T)
        context_embeds = context_of(self.planner, batch)
        logits = self.planner(context_embeds, batch["context_mask"], targets)  # (B, T, A)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX)
        return loss, logits, targets, context_embeds

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, _, targets, _ = self.model_step(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(targets))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, logits, targets, context_embeds = self.model_step(batch)
        valid = targets != IGNORE_INDEX  # (B, T)
        step1 = (logits[:, 0].argmax(-1) == targets[:, 0]).float().mean()
        free_logits, _ = self.planner.rollout(context_embeds, batch["context_mask"], targets.shape[1])
        free_correct = (free_logits.argmax(-1) == targets) & valid
        batch_size = len(targets)
        self.log("val/loss", loss, prog_bar=True, batch_size=batch_size, sync_dist=True)
        self.log("val/acc_step1", step1, batch_size=batch_size, sync_dist=True)
        self.log("val/acc_free_running", free_correct.sum() / valid.sum(), batch_size=batch_size, sync_dist=True)

    def configure_optimizers(self):
        encoder = self.planner.representation.encoder
        encoder_params = set(map(id, encoder.parameters())) if encoder is not None else set()
        groups = [{"params": [p for p in self.planner.parameters() if id(p) not in encoder_params], "lr": self.lr}]
        if encoder is not None:
            groups.append({"params": list(encoder.parameters()), "lr": self.encoder_lr})
        return torch.optim.AdamW(groups, lr=self.lr, weight_decay=self.weight_decay)


# ---- evaluation and baselines -------------------------------------------------------------------------
def _empty_metrics(horizon: int) -> dict[str, np.ndarray]:
    return {name: np.zeros(horizon) for name in ("top1", "top5", "nll", "count")}


def _accumulate(metrics: dict, log_probs: torch.Tensor, targets: torch.Tensor) -> None:
    """log_probs (B, T, A) (or None for NLL-less), targets (B, T) with IGNORE_INDEX."""
    valid = targets != IGNORE_INDEX  # (B, T)
    safe = targets.clamp(min=0)
    top5 = log_probs.topk(min(5, log_probs.shape[-1]), dim=-1).indices  # (B, T, 5)
    metrics["top1"] += ((top5[..., 0] == safe) & valid).sum(0).cpu().numpy()
    metrics["top5"] += ((top5 == safe.unsqueeze(-1)).any(-1) & valid).sum(0).cpu().numpy()
    nll = -log_probs.gather(-1, safe.unsqueeze(-1)).squeeze(-1)  # (B, T)
    metrics["nll"] += (nll * valid).sum(0).cpu().numpy()
    metrics["count"] += valid.sum(0).cpu().numpy()


def _finish(metrics: dict, with_nll: bool = True) -> dict[str, list]:
    count = np.maximum(metrics["count"], 1)
    return {"top1": (metrics["top1"] / count).tolist(), "top5": (metrics["top5"] / count).tolist(),
            "nll": (metrics["nll"] / count).tolist() if with_nll else None, "count": metrics["count"].astype(int).tolist()}


@torch.no_grad()
def evaluate_planner(planner: Planner, split: PreparedSplit, horizon: int, batch_size: int = 512,
                     device: str | torch.device = "cpu", sentences: np.ndarray | None = None) -> dict[str, dict]:
    """Per-step top-1/top-5/NLL of the planner on every boundary of ``split`` (or the given ones),
    teacher-forced and free-running."""
    planner = planner.to(device).eval()
    embeddings = embed_split(planner, split) if planner.config.finetune_encoder else None
    teacher, free = _empty_metrics(horizon), _empty_metrics(horizon)
    boundaries = np.arange(split.num_sentences) if sentences is None else np.asarray(sentences, dtype=np.int64)
    context_lengths = boundaries - split.sentence_offsets[split.sentence_article[boundaries]]
    boundaries = boundaries[np.argsort(context_lengths, kind="stable")]  # little padding per batch
    for start in range(0, len(boundaries), batch_size):
        sentences = boundaries[start:start + batch_size]
        context_embeds, context_mask = boundary_contexts(split, sentences, planner.config.max_sentences, embeddings)
        context_embeds, context_mask = context_embeds.to(device), context_mask.to(device)
        targets = boundary_targets(split, sentences, horizon).to(device)  # (B, T)
        logits, _ = planner.rollout(context_embeds, context_mask, horizon, targets)  # (B, T, A)
        _accumulate(teacher, logits.float().log_softmax(-1), targets)
        free_logits, _ = planner.rollout(context_embeds, context_mask, horizon)
        _accumulate(free, free_logits.float().log_softmax(-1), targets)
    return {"planner_teacher_forced": _finish(teacher), "planner_free_running": _finish(free)}


def baseline_metrics(train_split: PreparedSplit, eval_split: PreparedSplit, horizon: int, num_actions: int,
                     batch_size: int = 512) -> dict[str, dict]:
    """Majority, unigram and bigram baselines fitted on ``train_split``, scored per step on ``eval_split``.

    - majority: always the most frequent train action (a point mass: no NLL);
    - unigram: train action frequencies (add-one smoothed);
    - bigram: Markov chain p(a_next | a_prev) over consecutive sentences of train articles (add-one
      smoothed). Step k of boundary s is predicted from the last known action a_{s-1} as row a_{s-1}
      of P^(k+1); a boundary opening its article starts from the unigram: unigram @ P^k.
    """
    train_actions = np.asarray(train_split.actions)
    counts = np.bincount(train_actions, minlength=num_actions).astype(np.float64)
    unigram = torch.from_numpy((counts + 1) / (counts.sum() + num_actions))  # (A,)
    first = np.zeros(len(train_actions), dtype=bool)
    first[train_split.sentence_offsets[:-1][np.diff(train_split.sentence_offsets) > 0]] = True
    nexts = np.flatnonzero(~first)
    pair_counts = np.zeros((num_actions, num_actions))
    np.add.at(pair_counts, (train_actions[nexts - 1], train_actions[nexts]), 1)
    transition = torch.from_numpy((pair_counts + 1) / (pair_counts + 1).sum(1, keepdims=True))  # (A, A)
    powers = [torch.eye(num_actions, dtype=torch.float64)]
    for _ in range(horizon):
        powers.append(powers[-1] @ transition)  # powers[j] = P^j
    majority_order = torch.from_numpy(np.argsort(-counts, kind="stable"))

    metrics = {name: _empty_metrics(horizon) for name in ("majority", "unigram", "bigram")}
    eval_actions = np.asarray(eval_split.actions)
    eval_first = np.zeros(len(eval_actions), dtype=bool)
    eval_first[eval_split.sentence_offsets[:-1][np.diff(eval_split.sentence_offsets) > 0]] = True
    for start in range(0, eval_split.num_sentences, batch_size):
        sentences = np.arange(start, min(start + batch_size, eval_split.num_sentences))
        targets = boundary_targets(eval_split, sentences, horizon)  # (B, T)
        batch = len(sentences)
        unigram_log = unigram.log().expand(batch, horizon, -1)  # (B, T, A)
        _accumulate(metrics["unigram"], unigram_log, targets)
        # The majority "distribution": rank by train frequency (top-5 = five most frequent).
        majority_scores = torch.empty(num_actions, dtype=torch.float64)
        majority_scores[majority_order] = -torch.arange(num_actions, dtype=torch.float64)
        _accumulate(metrics["majority"], majority_scores.expand(batch, horizon, -1), targets)
        starts = torch.from_numpy(eval_first[sentences])  # (B,)
        previous = torch.from_numpy(eval_actions[np.maximum(sentences - 1, 0)])  # (B,)
        bigram = torch.stack([torch.where(starts.unsqueeze(-1), unigram @ powers[step], powers[step + 1][previous])
                              for step in range(horizon)], dim=1)  # (B, T, A)
        _accumulate(metrics["bigram"], bigram.log(), targets)
    return {"majority": _finish(metrics["majority"], with_nll=False), "unigram": _finish(metrics["unigram"]),
            "bigram": _finish(metrics["bigram"])}


def write_summary(out_dir: Path, summary: dict) -> None:
    write_json(out_dir / "summary.json", summary)
    lines = [f"# Planner summary: {summary['eval_split']} split of {summary['prepared_dir']}", "",
             f"{summary['num_boundaries']} boundaries, horizon T = {summary['horizon']}, "
             f"{summary['num_actions']} actions, {summary['dynamics']} dynamics g. Baselines fitted "
             f"on the {summary['train_split']} split. "
             "Teacher-forced: true actions fed to g; free-running: the planner's own argmax actions.", ""]
    names = [name for name in SUMMARY_MODELS if name in summary["metrics"]]
    for metric, title in (("top1", "Top-1 accuracy"), ("top5", "Top-5 accuracy"), ("nll", "NLL (nats)")):
        lines += [f"## {title} per step", "", "| step | boundaries | " + " | ".join(names) + " |",
                  "|---" * (len(names) + 2) + "|"]
        for step in range(summary["horizon"]):
            cells = []
            for name in names:
                values = summary["metrics"][name][metric]
                cells.append("n/a" if values is None else f"{values[step]:.4f}")
            count = summary["metrics"][names[0]]["count"][step]
            lines.append(f"| {step + 1} | {count} | " + " | ".join(cells) + " |")
        lines.append("")
    (out_dir / "summary.md").write_text("\n".join(lines))


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
