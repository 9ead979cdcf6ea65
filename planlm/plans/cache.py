"""The on-disk plan cache: where ``planlm sample-plans`` puts a cache, and reading it back.

Plan cache folder (``planlm sample-plans``; default ``<planner_dir>/plans/K{K}-T{T}-tau{tau}-seed{seed}``)::

    manifest.json        written last: num_paths, horizon, temperature, seed, planner_hash (sha256 of the
                         planner's model.safetensors), codebook_hash, num_actions, prepared_dir, counts
    <split>.npy          (N_sent, K, T) int64  sampled paths; row s = the paths for boundary s
    <split>.num_paths.npy (N_sent,) int64      paths of boundary s under the path policy (K for fixed): the
                                               paths of row s beyond it are padding (planlm.plans.policy)
    <split>.argmax.npy   (N_sent, T) int64     the greedy path of boundary s

An adaptive path policy (``--path_policy``) is part of the cache key and of the default folder name
(``...-seed{seed}-{kind}-{fingerprint}``); the manifest records the paths per boundary of every split.

Letters: K paths, T horizon, N_sent sentences.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planlm.data.artifacts import PreparedDataset
from planlm.plans.policy import PathPolicy
from planlm.integrity import load_npy, stage_manifest
from planlm.utils import PlanlmError, fingerprint


def default_plans_dir(planner_dir: str | Path, num_paths: int, horizon: int, temperature: float, seed: int,
                      policy: PathPolicy | None = None) -> Path:
    name = f"K{num_paths}-T{horizon}-tau{temperature:g}-seed{seed}"
    if policy is not None and policy.adaptive:  # a cache sampled under one policy is never read for another
        name += f"-{policy.kind}-{fingerprint(policy.cache_key())[:8]}"
    return Path(planner_dir) / "plans" / name


def cache_manifest(plans_dir: str | Path, prepared: PreparedDataset | None = None) -> dict:
    """The manifest of the complete plan cache ``plans_dir``; with ``prepared``, after checking that its plans
    were made for that corpus's actions (codebook and num_actions). One-line error otherwise."""
    manifest = stage_manifest(plans_dir)  # one-line error for a damaged file
    if manifest is None:
        raise PlanlmError(f"{plans_dir}: no complete plan cache here (manifest.json missing); run "
                          f"`planlm sample-plans --out_dir {plans_dir}` to build it")
    if prepared is not None and (manifest.get("codebook_hash") != prepared.codebook_hash or
                                 int(manifest.get("num_actions", -1)) != prepared.num_actions):
        raise PlanlmError(f"{plans_dir}/manifest.json: plans come from a planner with another codebook (codebook_hash "
                          f"{str(manifest.get('codebook_hash'))[:12]}, {manifest.get('num_actions')} actions) than "
                          f"{prepared.path} ({prepared.codebook_hash[:12]}, {prepared.num_actions}); resample the plans "
                          f"with a planner trained on this corpus")
    return manifest


def load_plans(plans_dir: str | Path, split: str, *, prepared: PreparedDataset | None = None,
               argmax: bool = False) -> np.ndarray:
    """Memory-mapped cached plans of one split: (N_sent, K, T) int64, or (N_sent, T) with ``argmax``.

    With ``prepared``, checks that the plans were made for its actions (codebook and num_actions) and
    cover every sentence of the split.
    """
    plans_dir = Path(plans_dir)
    manifest = cache_manifest(plans_dir, prepared)
    path = plans_dir / (f"{split}.argmax.npy" if argmax else f"{split}.npy")
    if not path.is_file():
        raise PlanlmError(f"{plans_dir}: no plans for split {split!r} (has {manifest.get('splits')}); rerun "
                          f"`planlm sample-plans --splits` with it")
    plans = load_npy(path, fix=_fix(plans_dir))
    if prepared is not None and len(plans) != prepared.split(split).num_sentences:
        raise PlanlmError(f"{path}: {len(plans)} rows but {prepared.path}/{split} has "
                          f"{prepared.split(split).num_sentences} sentences; rerun `planlm sample-plans`")
    return plans


def load_path_counts(plans_dir: str | Path, split: str) -> np.ndarray | None:
    """(N_sent,) paths per boundary of a cached split (the first that many of each row are real), or None
    for a cache made before path policies (every boundary has K paths)."""
    path = Path(plans_dir) / f"{split}.num_paths.npy"
    return load_npy(path, fix=_fix(plans_dir), mmap_mode=None) if path.is_file() else None


def _fix(plans_dir: str | Path) -> str:
    return f"resample the cache: rerun `planlm sample-plans --out_dir {plans_dir}` or the `planlm run` that made it"
