"""The ``sample-plans`` command: the planner's plans for every sentence boundary of a prepared corpus, drawn once
into the plan cache (``planlm.plans.cache``) that training and evaluation read.

The cache holds the draws of two planner kinds of one ``PlanConfig`` (``planlm.plans.kinds``): K sampled paths per
boundary (``planner_sampled``, under its path policy) and the greedy path (``planner_argmax``), in one
seeded walk over each split (``draw_split``: each boundary's context is the true text before it).

Letters: K paths, T horizon, M top actions, N_sent sentences of a split.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Optional

import numpy as np

from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset, PreparedSplit
from planlm.errors import PlanlmError
from planlm.files import file_sha256
from planlm.jsonio import fingerprint
from planlm.models.planner import WEIGHTS_FILE, Planner
from planlm.plans.cache import default_plans_dir, expected_mass
from planlm.plans.config import PlanConfig, check_planner_horizon
from planlm.plans.contexts import MAX_ROWS, check_split
from planlm.plans.draws import DrawArrays, WalkCheckpoint, draw_split
from planlm.plans.kinds import PlannerKind
from planlm.plans.policy import paths_summary
from planlm.stage import StageDir
from planlm.stage.integrity import STAGE_LOCK, record_files


def sample_plans(prepared_dir: str, plans: PlanConfig = PlanConfig(), splits: Optional[list[str]] = None,
                 out_dir: Optional[str] = None, batch_size: int = 256, runtime: Runtime = Runtime()) -> Path:
    """Sample K action paths of T steps for every sentence boundary and cache them on disk.

    Each boundary's paths come from the true text before it. The cache folder is keyed by the planner's
    weights (sha256), the prepared corpus, K, T, tau, seed, batch size, device type, precision and the path
    policy; rerunning with the same key reuses it, a different key recomputes it.

    Args:
        prepared_dir: Prepared corpus whose boundaries get plans (same codebook as the planner's).
        plans: The plans to draw, as train-lm takes them: planner_dir (a ``planlm train-planner`` folder; required),
            kind (planner_sampled, or planner_argmax: tau 0), num_paths K (default 10; the most any boundary gets
            under an adaptive path_policy), horizon T (default: the planner's), temperature tau (0 = argmax), seed,
            path_policy (all or entropy), expectation (also store every step's distribution, its 64 most likely
            actions and their float16 probabilities, for the sampled and argmax paths).
        splits: Splits to cover; default: every split of the prepared corpus.
        out_dir: Cache folder; default ``<planner_dir>/plans/K{K}-T{T}-tau{tau}-seed{seed}`` (plus the policy).
        batch_size: Boundaries per forward pass.
        runtime: The planner's device and arithmetic (runtime.device, runtime.precision; part of the key).

    Returns:
        The plan cache folder.
    """
    prepared = PreparedDataset(prepared_dir)
    if not plans.planner_dir:
        raise PlanlmError("sample-plans: set --plans.planner_dir to a `planlm train-planner` folder")
    planner = Planner.for_corpus(plans.planner_dir, prepared)
    plans = _cached_plans(plans, planner.config.horizon)
    if batch_size < 1:
        raise PlanlmError(f"sample-plans: --batch_size={batch_size} must be >= 1")
    splits = list(prepared.manifest.get("splits", ["train", "validation", "test"])) if splits is None else splits
    split_views = {name: prepared.split(name) for name in splits}
    for split in split_views.values():
        check_split(split, "--splits")
    expected = plans.top_actions if plans.expectation else 0
    out = Path(out_dir) if out_dir else default_plans_dir(plans.planner_dir, plans.num_paths, plans.horizon,
                                                          plans.temperature, plans.seed, plans.path_policy, expected)
    torch_device, precision = runtime.torch_device(), runtime.resolved_precision()
    key = _cache_key(plans, prepared, prepared_dir, splits, batch_size, torch_device.type, precision)
    with StageDir(out, key, keep_partial=True) as stage:
        if stage.reused:
            return out
        walk_key = fingerprint(key)
        _drop_stale(out, walk_key, splits)
        paths, planner_time, kept = {}, {}, {}
        for name, split in split_views.items():
            began = time.perf_counter()
            paths[name] = _sample_split(planner, split, out, plans, batch_size, torch_device, precision, walk_key)
            planner_time[name] = time.perf_counter() - began
            if expected:
                kept[name] = expected_mass(out, name)
        stage.finish(num_paths=plans.num_paths, horizon=plans.horizon, temperature=plans.temperature, seed=plans.seed,
                     planner_hash=key["planner_hash"], planner_dir=str(Path(plans.planner_dir).resolve()),
                     codebook_hash=prepared.codebook_hash, num_actions=prepared.num_actions,
                     prepared_dir=key["prepared_dir"], splits=splits,
                     counts={name: split.num_sentences for name, split in split_views.items()},
                     path_policy=asdict(plans.path_policy), paths=paths, planner_time_s=planner_time,
                     expectation={"top_actions": expected, "kept": kept} if expected else None,
                     files=_record_files_but_walks(out, splits))
    for name in splits:
        _walk_path(out, name).unlink(missing_ok=True)
    return out


# Seconds between two records of a split's walk: what an interrupted sample-plans redoes at most.
CHECKPOINT_EVERY_S = 60.0


def _walk_path(out: Path, split: str) -> Path:
    return out / f"{split}.walk.npz"


def _drop_stale(out: Path, walk_key: str, splits: list[str]) -> None:
    """Keep the files of the splits whose walk an interrupted run of this key recorded; drop every other file."""
    resumable = {name for name in splits if WalkCheckpoint.recorded(_walk_path(out, name), walk_key)}
    for path in out.iterdir():
        if path.name == STAGE_LOCK or (path.name.split(".")[0] in resumable and not path.name.endswith(".tmp")):
            continue
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def _record_files_but_walks(out: Path, splits: list[str]) -> dict:
    """The manifest's record of the cache's files, without the walk records (dropped once it is written)."""
    walks = {_walk_path(out, name).name for name in splits}
    return {name: entry for name, entry in record_files(out).items() if name not in walks}


def _cache_key(plans: PlanConfig, prepared: PreparedDataset, prepared_dir: str, splits: list[str], batch_size: int,
               device_type: str, precision: str) -> dict:
    """A plan cache's reuse key: the planner's weights, the corpus and its codebook, the config's draw and how it
    ran."""
    key = {"planner_hash": file_sha256(Path(plans.planner_dir) / WEIGHTS_FILE),
           "prepared_dir": str(Path(prepared_dir).resolve()), "codebook_hash": prepared.codebook_hash,
           "num_paths": plans.num_paths, "horizon": plans.horizon, "temperature": plans.temperature, "seed": plans.seed,
           "splits": splits, "batch_size": batch_size, "max_rows": MAX_ROWS, "device_type": device_type,
           "precision": precision}
    if plans.path_policy.adaptive:  # all keeps the key of the caches made before policies existed
        key["path_policy"] = plans.path_policy.cache_key()
    if plans.expectation and plans.top_actions:  # sampled actions alone keep the key of the caches made before
        key["expectation"] = {"top_actions": plans.top_actions}  # expectation existed
    return key


def _cached_plans(plans: PlanConfig, planner_horizon: int) -> PlanConfig:
    """The resolved config of a cache: sample-plans' defaults (planner_sampled, K = 10, the planner's T) under
    ``plans``; only a planner kind has draws to cache."""
    plans = plans.resolve(PlanConfig(kind="planner_sampled", num_paths=10, horizon=planner_horizon))
    if not isinstance(plans.plan_kind, PlannerKind):
        raise PlanlmError(f"sample-plans: --plans.kind {plans.kind} draws nothing from a planner; use planner_sampled "
                          f"or planner_argmax")
    check_planner_horizon(plans, planner_horizon)
    return plans


def _sample_split(planner: Planner, split: PreparedSplit, out: Path, plans: PlanConfig, batch_size: int, device,
                  precision: str, walk_key: str) -> dict:
    """Write one split's greedy paths and sampled paths (with their counts; in expectation, also the distribution
    of every step of both) into the cache; return its paths summary. A walk that an interrupted run of the same
    key recorded (``WalkCheckpoint``) continues after its last record, into the same files."""
    walk = _walk_path(out, split.name)

    def allocate(resume: bool) -> list[tuple[PlannerKind, PlanConfig, DrawArrays]]:
        draws = []
        for kind in ("planner_argmax", "planner_sampled"):  # the greedy path first: it draws nothing
            drawn = replace(plans, kind=kind).resolve()
            prefix = "argmax." if drawn.plan_kind.greedy else ""

            def memmap(name: str, shape: tuple, dtype, prefix: str = prefix) -> np.ndarray:
                path = out / f"{split.name}.{prefix}{name}npy"
                if resume:
                    array = np.lib.format.open_memmap(path, mode="r+")
                    if array.shape != shape or array.dtype != dtype:
                        raise ValueError(f"{path}: not the array its walk record describes")
                    return array
                path.unlink(missing_ok=True)  # a new file, never written into
                return np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)

            arrays = DrawArrays.allocate(drawn.plan_kind, drawn, planner.config.num_actions, split.num_sentences,
                                         memmap)
            draws.append((drawn.plan_kind, drawn, arrays))
        return draws

    draws = None
    if WalkCheckpoint.recorded(walk, walk_key):
        try:
            draws = allocate(resume=True)
        except (OSError, ValueError):  # a file of the recorded walk is missing or damaged: start the walk again
            walk.unlink()
    draws = draws or allocate(resume=False)
    checkpoint = WalkCheckpoint(walk, walk_key, draws, every_s=CHECKPOINT_EVERY_S)
    draw_split(planner, split, np.arange(split.num_sentences), draws, device, precision, batch_size,
               checkpoint=checkpoint)  # its last record flushes the arrays
    counts = draws[1][2].counts
    del draws
    np.save(out / f"{split.name}.num_paths.npy", counts)
    return paths_summary(counts, plans.num_paths)
