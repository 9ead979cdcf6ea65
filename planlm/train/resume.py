"""What a run resumed from ``checkpoints/last.ckpt`` needs to end with the weights of an uninterrupted run.

Lightning's checkpoint holds the weights, the optimiser, the scheduler and the loop counters, but not
the order of the next epoch's batches (a shuffled DataLoader draws it from the global torch generator)
nor the generator itself (dropout masks). ``EpochShuffle`` derives each epoch's order from
(seed, epoch) alone, and ``RestoreRNG`` saves the torch generators with every checkpoint and puts
them back on resume. ``last_checkpoint`` writes last.ckpt at every validation, improved or not.
A checkpoint written in the middle of an epoch (``val_check_interval`` shorter than an epoch) holds
how many batches of that epoch were trained; ``ResumeMidEpoch`` makes the resumed epoch skip them,
so it trains the rest of the same order, once. A resumed run then continues exactly where the
interrupted run stopped, at an epoch boundary or within an epoch (one process; under DDP Lightning's
DistributedSampler replaces ``EpochShuffle`` and only epoch boundaries are exact)."""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from torch.utils.data import RandomSampler


class EpochShuffle(RandomSampler):
    """A RandomSampler whose order depends only on (seed, epoch); Lightning calls ``set_epoch``.

    A subclass of RandomSampler, so that under DDP Lightning still swaps it for its seeded
    DistributedSampler (which is resumable the same way at epoch boundaries). ``skip_batches``: the
    batches of ``batch_size`` that the next epoch leaves out at its start (set by ``ResumeMidEpoch``)."""

    def __init__(self, data_source, seed: int = 0, batch_size: int = 1):
        super().__init__(data_source)
        self.seed, self.epoch, self.batch_size = seed, 0, batch_size
        self.skip_batches = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        # A numpy array, 8 bytes an index: a Python list of the epoch's order would take about 40.
        order = np.random.default_rng((self.seed, self.epoch)).permutation(len(self.data_source))  # (N,) int64
        skip, self.skip_batches = self.skip_batches, 0  # only the epoch that was interrupted starts late
        yield from map(int, order[skip * self.batch_size:])


class ResumeMidEpoch(L.Callback):
    """On resume from a checkpoint written within an epoch, ``sampler`` leaves out that epoch's trained batches.

    Lightning restores the loop's batch counter but starts the DataLoader over: without the skip, the
    resumed epoch would train its first batches again and never reach its last ones. ``sampler`` is any
    sampler with a ``skip_batches`` attribute (``EpochShuffle``, the planner's ``LengthGroupedSampler``).

    Starting a DataLoader draws its base seed from torch's generator. The uninterrupted run started this
    epoch's loader before the checkpoint; the resumed run starts it again after ``RestoreRNG`` put the
    generators back, so they are put back once more when training starts (else every later dropout
    mask would differ)."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.rng_states = None

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
        if progress and not progress.get("is_last_batch", True):
            self.sampler.skip_batches = progress["current"]["completed"]
            self.rng_states = checkpoint.get(RestoreRNG.KEY)

    def on_train_start(self, trainer, pl_module) -> None:
        if self.rng_states:
            set_rng_states(self.rng_states)
            self.rng_states = None


def last_checkpoint(dirpath) -> L.pytorch.callbacks.ModelCheckpoint:
    """A callback that writes ``dirpath/last.ckpt`` whenever checkpoints are due (each validation or epoch end).

    ``ModelCheckpoint(save_last=True)`` (Lightning 2.6) writes last.ckpt only when a top-k checkpoint was
    saved at the same step, i.e. when the monitored metric improved: after a validation that did not
    improve, last.ckpt held an older state and a resumed run trained the steps since that state again."""
    return L.pytorch.callbacks.ModelCheckpoint(dirpath=dirpath, filename="last", monitor=None, save_top_k=1,
                                               enable_version_counter=False)


class RestoreRNG(L.Callback):
    """Saves the torch random generators (CPU and CUDA) in every checkpoint and restores them on resume.

    Nothing in a training step draws from numpy's or Python's generators, so only torch's are kept
    (as tensors: the checkpoint still loads with ``weights_only=True``)."""

    KEY = "planlm_rng"

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        states = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states["cuda"] = torch.cuda.get_rng_state_all()
        checkpoint[self.KEY] = states

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        states = checkpoint.get(self.KEY)
        if states:  # none in a checkpoint written before this callback existed
            set_rng_states(states)


def set_rng_states(states: dict) -> None:
    """Put back the torch generators that ``RestoreRNG`` saved: {"cpu": state, "cuda": [state per device]}."""
    torch.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])
