"""The draws of a planner: what it drew for a batch of boundaries (``Draw``), the arrays a split's draws fill in a
plan cache's layout (``DrawArrays``: memory-mapped cache files, or arrays in memory for a live source), the one
seeded walk over a split that fills them (``draw_split``), its resumable record (``WalkCheckpoint``), and the draws
of one resolved ``PlanConfig`` in memory (``draw_plans``: a live source's plans).

The planner kinds of ``planlm.plans.kinds`` draw; ``planlm.plans.sampling`` writes their draws into a plan cache.
A walk reads each resolved config as ``plans`` (``planlm.plans.config``).

Letters: B boundaries, K paths (K' drawn: 1 for the argmax path), T horizon, M top actions, N boundaries asked
for, N_sent sentences of the split.
"""

from __future__ import annotations

import os
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol

import numpy as np
import torch

from planlm.console import open_bar
from planlm.data.artifacts import PreparedSplit
from planlm.device import autocast
from planlm.plans.cache import expected_action_dtype
from planlm.plans.contexts import MAX_ROWS, Boundaries, check_split, split_batches
from planlm.plans.policy import path_mask_from_counts
from planlm.plans.sources import CachedPlans, Plans, step_probs


@dataclass
class Draw:
    """What a planner drew for B boundaries, as a plan cache stores it: K' paths each (1: the argmax path)."""

    paths: torch.Tensor
    """(B, K', T) long: the actions drawn (padding beyond a boundary's count)."""
    counts: torch.Tensor
    """(B,) long: the paths of each boundary (K' everywhere but under an adaptive path policy)."""
    steps: Optional[tuple[torch.Tensor, torch.Tensor]] = None
    """In expectation: each step's top actions (B, K', T, M) long and their probabilities, not renormalised."""

    def plans(self, num_paths: int) -> Plans:
        """The plans the adapter reads: K paths (the argmax path repeated), probabilities renormalised."""
        actions = self.paths if self.steps is None else self.steps[0]  # (B, K', T[, M])
        mask = path_mask_from_counts(self.counts.to(self.paths.device), self.paths.shape[1], self.paths.shape[2])
        probs = None if self.steps is None else step_probs(self.steps[1])
        if self.paths.shape[1] != num_paths:  # the argmax path, repeated K times
            actions, mask, probs = (None if x is None else x.expand(-1, num_paths, *x.shape[2:])
                                    for x in (actions, mask, probs))
        return Plans(actions, mask, probs)



class DrawingKind(Protocol):
    """What a walk asks of a planner kind (``planlm.plans.kinds.PlannerKind``)."""

    greedy: bool
    """The kind draws one path per boundary, the argmax path (its arrays have no K axis)."""

    def paths_drawn(self, plans) -> int: ...

    def article_batches(self, plans) -> bool: ...

    def draw(self, boundaries: Boundaries, plans, rng: Optional[torch.Generator], planner) -> Draw: ...


# --------------------------------------------------------------------------------------------- draws of a split
MakeArray = Callable[[str, tuple, type], np.ndarray]


def in_memory(name: str, shape: tuple, dtype) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


@dataclass
class DrawArrays:
    """The rows a planner kind's draws fill, in a plan cache's layout (``planlm.plans.cache``): memory-mapped
    cache files, or arrays in memory for a live source. Row i holds the i-th boundary drawn."""

    paths: np.ndarray
    """(N, K, T) int64 sampled paths, or (N, T) the argmax path."""
    counts: np.ndarray
    """(N,) int64 paths per boundary (1 for the argmax path)."""
    greedy: bool
    steps: Optional[tuple[np.ndarray, np.ndarray]] = None
    """In expectation: top actions (N, K or -, T, M) int16/int32 and their probabilities float16."""

    @classmethod
    def allocate(cls, kind: DrawingKind, plans, num_actions: int, rows: int,
                 make: MakeArray) -> DrawArrays:
        """``make(name, shape, dtype)`` gives each array: name "" (paths), "expected_actions." or "expected_probs."."""
        shape = (rows, *(() if kind.greedy else (plans.num_paths,)), plans.horizon)
        steps = None
        if plans.expectation:
            top = (*shape, min(plans.top_actions, num_actions))
            steps = (make("expected_actions.", top, expected_action_dtype(num_actions)),
                     make("expected_probs.", top, np.float16))
        return cls(make("", shape, np.int64), np.zeros(rows, np.int64), kind.greedy, steps)

    def write(self, rows: np.ndarray, draw: Draw) -> None:
        squeeze = (lambda x: x[:, 0]) if self.greedy else (lambda x: x)  # the argmax path: no K axis
        self.paths[rows] = squeeze(draw.paths).cpu().numpy()
        self.counts[rows] = draw.counts.cpu().numpy()
        for array, value in zip(self.steps or (), draw.steps or ()):
            array[rows] = squeeze(value).float().cpu().numpy() if value.is_floating_point() else \
                squeeze(value).cpu().numpy()

    def flush(self) -> None:
        """Write what was drawn into memory-mapped arrays to their files (arrays in memory have nothing to write)."""
        for written in (self.paths, *(self.steps or ())):
            if isinstance(written, np.memmap):
                written.flush()

    def source(self, plans, sentences: np.ndarray, num_sentences: int) -> CachedPlans:
        """The plans of ``sentences`` (N,) (the boundaries drawn, in order) read back as from a plan cache."""
        rows = np.full(num_sentences, -1, dtype=np.int64)
        rows[sentences] = np.arange(len(sentences))
        counts = None if self.greedy else np.zeros(num_sentences, np.int64)
        if counts is not None:
            counts[sentences] = self.counts
        paths, probs = (self.paths, None) if self.steps is None else self.steps
        return CachedPlans(paths, plans.num_paths, plans.horizon, counts, probs, rows=rows)


def draw_split(planner, split: PreparedSplit, sentences: np.ndarray,
               draws: list[tuple[DrawingKind, object, DrawArrays]], device: torch.device, precision: str,
               batch_size: int, max_rows: int = MAX_ROWS, checkpoint: Optional[WalkCheckpoint] = None) -> None:
    """Draw the plans of every (kind, resolved config) for ``sentences`` (N,) of ``split`` into their arrays, in one
    seeded walk (the first config's seed): at most ``batch_size`` boundaries and ``max_rows`` paths per forward, article rows
    for an article-level planner when every kind allows. The draws depend on the seed, batch_size, max_rows and the
    device type alone (a plan cache's key holds them all). ``checkpoint``: where the walk starts (after the batches
    that an interrupted walk recorded, with its generator's state) and where it records itself as it goes."""
    check_split(split, "the plans")
    planner = planner.to(device).eval()
    rng = torch.Generator(device=device).manual_seed(draws[0][1].seed)
    done, rows_done = (0, 0) if checkpoint is None else checkpoint.start(rng)
    most = max(max(1, kind.paths_drawn(plans)) for kind, plans, _ in draws)
    per_forward = max(1, min(batch_size, max_rows // most))
    article = planner.config.encoder == "article" and all(kind.article_batches(plans) for kind, plans, _ in draws)
    batches = split_batches(split, sentences, planner.config.num_actions, per_forward, planner, article, skip=done)
    with open_bar(f"plans {split.name}", len(sentences), "boundaries", checkpoint is not None,
                  completed=rows_done) as bar:
        for rows, boundaries in batches:
            with torch.no_grad(), autocast(device, precision):
                for kind, plans, arrays in draws:
                    arrays.write(rows, kind.draw(boundaries, plans, rng, planner))
            done, rows_done = done + 1, rows_done + len(rows)
            bar.advance(len(rows))
            if checkpoint is not None:
                checkpoint.save(done, rows_done, rng)
    if checkpoint is not None:
        checkpoint.save(done, rows_done, rng, now=True)


def draw_plans(planner, split: PreparedSplit, plans, sentences: Optional[np.ndarray] = None, *,
               device: str | torch.device = "cpu", precision: str = "fp32", batch_size: int = 256,
               max_rows: int = MAX_ROWS) -> DrawArrays:
    """What ``planner`` draws for a planner kind's resolved config ``plans`` at ``sentences`` (N,) of ``split``
    (default: every boundary), in memory: ``paths`` (N, K, T) sampled or (N, T) argmax, ``counts`` (N,), ``steps`` in expectation."""
    sentences = np.arange(split.num_sentences) if sentences is None else np.asarray(sentences, dtype=np.int64)
    kind = plans.plan_kind
    arrays = DrawArrays.allocate(kind, plans, planner.config.num_actions, len(sentences), in_memory)
    draw_split(planner, split, sentences, [(kind, plans, arrays)], torch.device(device), precision, batch_size,
               max_rows)
    return arrays


class WalkCheckpoint:
    """Where a split's seeded walk stands, so that an interrupted walk resumes to the same draws: the batches and
    boundaries done, the generator's state and each draw's path counts, in one file written atomically after the
    draws' arrays are flushed (at most every ``every_s`` seconds, and at the end). A record of another key, or one
    that cannot be read, is no record: the walk starts from its first batch."""

    def __init__(self, path: Path, key: str, draws: list[tuple[DrawingKind, object, DrawArrays]],
                 every_s: float = 60.0):
        self.path, self.key, self.draws, self.every_s = Path(path), key, draws, every_s
        self.saved = time.monotonic()

    @staticmethod
    def _read(path: Path, key: str, names: Optional[list[str]] = None) -> dict:
        """The arrays ``names`` (default: all) of the record at ``path`` if it was written under ``key``, else {};
        only the arrays asked for are read."""
        try:
            with np.load(path) as record:
                if str(record["key"]) != key:
                    return {}
                return {name: record[name] for name in (record.files if names is None else names)}
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
            return {}

    @classmethod
    def recorded(cls, path: Path, key: str) -> bool:
        """Whether ``path`` holds a readable record written under ``key`` (its key alone is read)."""
        return bool(cls._read(path, key, ["key"]))

    def start(self, rng: torch.Generator) -> tuple[int, int]:
        """(batches done, boundaries done) of the record; its counts into the draws' arrays, its state into ``rng``."""
        record = self._read(self.path, self.key)
        if not record:
            return 0, 0
        for i, (_, _, arrays) in enumerate(self.draws):
            arrays.counts[:] = record[f"counts{i}"]
        rng.set_state(torch.from_numpy(record["rng"]))
        return int(record["batches"]), int(record["rows"])

    def save(self, batches: int, rows: int, rng: torch.Generator, now: bool = False) -> None:
        if not now and time.monotonic() - self.saved < self.every_s:
            return
        for _, _, arrays in self.draws:  # the draws reach the files before the record that counts them
            arrays.flush()
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, key=np.array(self.key), batches=np.int64(batches), rows=np.int64(rows),
                     rng=rng.get_state().numpy(), **{f"counts{i}": a.counts for i, (_, _, a) in enumerate(self.draws)})
        os.replace(tmp, self.path)
        self.saved = time.monotonic()


__all__ = ["Draw", "DrawingKind", "DrawArrays", "MakeArray", "in_memory", "draw_split", "draw_plans",
           "WalkCheckpoint"]
