"""What a run resumed from ``checkpoints/last.ckpt`` needs to end with the weights of an uninterrupted run.

Lightning's checkpoint holds the weights, the optimiser, the scheduler and the loop counters, but not
the order of the next epoch's batches (a shuffled DataLoader draws it from the global torch generator)
nor the generator itself (dropout masks). ``EpochShuffle`` derives each epoch's order from
(seed, epoch) alone, and ``RestoreRNG`` saves the torch generators with every checkpoint and puts
them back on resume. ``last_checkpoint`` writes last.ckpt at every validation, improved or not.
Resuming at an epoch boundary (the checkpoints both commands resume from) then continues exactly
where the interrupted run stopped.
"""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from torch.utils.data import RandomSampler


class EpochShuffle(RandomSampler):
    """A RandomSampler whose order depends only on (seed, epoch); Lightning calls ``set_epoch``.

    A subclass of RandomSampler, so that under DDP Lightning still swaps it for its seeded
    DistributedSampler (which is resumable the same way)."""

    def __init__(self, data_source, seed: int = 0):
        super().__init__(data_source)
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        yield from np.random.default_rng((self.seed, self.epoch)).permutation(len(self.data_source)).tolist()


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
        if not states:  # a checkpoint written before this callback existed
            return
        torch.set_rng_state(states["cpu"])
        if "cuda" in states and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states["cuda"])
