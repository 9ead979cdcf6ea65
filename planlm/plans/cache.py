"""The on-disk plan cache: where ``planlm sample-plans`` puts a cache, reading it back, and checking it against
the plans a command asks for (``check_cache``).

Plan cache folder (``planlm sample-plans``; default ``<planner_dir>/plans/K{K}-T{T}-tau{tau}-seed{seed}``)::

    manifest.json        written last: num_paths, horizon, temperature, seed, planner_hash (sha256 of the
                         planner's model.safetensors), codebook_hash, num_actions, prepared_dir, counts
    <split>.npy          (N_sent, K, T) int64  sampled paths; row s = the paths for boundary s
    <split>.num_paths.npy (N_sent,) int64      paths of boundary s under the path policy (K for all): the
                                               paths of row s beyond it are padding (planlm.plans.policy)
    <split>.argmax.npy   (N_sent, T) int64     the greedy path of boundary s

An adaptive path policy (``--path_policy``) is part of the cache key and of the default folder name
(``...-seed{seed}-{kind}-{fingerprint}``); the manifest records the paths per boundary of every split.

Plans in expectation (``sample-plans --expectation true``, ``PlanConfig.expectation``; key and folder name
``...-expected{M}``) add, for every step of every path, the M = ``top_actions`` most likely actions of the
distribution it was drawn from and their probabilities (not renormalised: the manifest's ``expectation.kept``
records the mass they hold, mean and least per split; the plan sources renormalise)::

    <split>.expected_actions.npy         (N_sent, K, T, M) int16 (int32 beyond 32,767 actions)
    <split>.expected_probs.npy           (N_sent, K, T, M) float16
    <split>.argmax.expected_actions.npy  (N_sent, T, M)    the planner's distribution (tau 1) at each step
    <split>.argmax.expected_probs.npy    (N_sent, T, M)    of the greedy path

At A = 1,024 and T = 10 that is 4 M T = 2.5 KB per boundary and path at M = 64, against 20 KB for the whole
float16 distribution.

Letters: K paths, T horizon, N_sent sentences.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.jsonio import fingerprint
from planlm.plans.policy import PathPolicy
from planlm.stage.integrity import load_npy, stage_manifest


def default_plans_dir(planner_dir: str | Path, num_paths: int, horizon: int, temperature: float, seed: int,
                      policy: PathPolicy | None = None, top_actions: int = 0) -> Path:
    name = f"K{num_paths}-T{horizon}-tau{temperature:g}-seed{seed}"
    if policy is not None and policy.adaptive:  # a cache sampled under one policy is never read for another
        name += f"-{policy.kind}-{fingerprint(policy.cache_key())[:8]}"
    if top_actions:  # plans in expectation: a folder of their own
        name += f"-expected{top_actions}"
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


def check_cache(plans, prepared: PreparedDataset | None = None) -> dict:
    """The manifest of the plan cache ``plans.plans_dir`` (a planner kind's resolved ``PlanConfig``), after checking
    its horizon, K (but for the argmax path), plans in expectation and (with ``prepared``) codebook."""
    where = Path(plans.plans_dir) / "manifest.json"
    manifest = cache_manifest(plans.plans_dir, prepared)
    if int(manifest["horizon"]) != plans.horizon:
        raise PlanlmError(f"{where}: cached horizon T={manifest['horizon']} but --plans.horizon {plans.horizon}; "
                          f"set horizon: {manifest['horizon']} or sample plans with T={plans.horizon}")
    if not plans.plan_kind.greedy and int(manifest["num_paths"]) != plans.num_paths:
        raise PlanlmError(f"{where}: cached K={manifest['num_paths']} paths but --plans.num_paths "
                          f"{plans.num_paths}; set num_paths: {manifest['num_paths']} or sample plans with "
                          f"K={plans.num_paths}")
    _check_cached_expectation(plans, manifest, where)
    return manifest


def _check_cached_expectation(plans, manifest: dict, where: Path) -> None:
    """A cache of plans in expectation is read only in expectation, with its top_actions, and vice versa."""
    cached = cached_top_actions(manifest)
    if plans.expectation and not cached:
        raise PlanlmError(f"{where}: the plan cache holds only sampled actions, not the step distributions "
                          f"--plans.expectation true reads; sample one with `planlm sample-plans --plans.expectation "
                          f"true` (or set --plans.expectation false)")
    if cached and not plans.expectation:
        raise PlanlmError(f"{where}: the plan cache holds plans in expectation (top {cached} actions per step); set "
                          f"--plans.expectation true, or give a cache sampled without --plans.expectation")
    if cached and cached != plans.top_actions:
        raise PlanlmError(f"{where}: the cached plans in expectation keep the top {cached} actions per step, not the "
                          f"{plans.top_actions} planlm keeps now; sample the cache again with `planlm sample-plans`")


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


def expected_action_dtype(num_actions: int) -> type:
    """The smallest integer type of the cached top actions of plans in expectation."""
    return np.int16 if num_actions <= np.iinfo(np.int16).max else np.int32


def cached_top_actions(manifest: dict) -> int:
    """The top_actions of a cache of plans in expectation, 0 for a cache of sampled actions only."""
    return int((manifest.get("expectation") or {}).get("top_actions") or 0)


def load_expected(plans_dir: str | Path, split: str, *, argmax: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Memory-mapped plans in expectation of one split: the top actions and their probabilities,
    (N_sent, K, T, M) each, or (N_sent, T, M) of the greedy path with ``argmax``."""
    prefix = Path(plans_dir) / (f"{split}.argmax" if argmax else split)
    arrays = []
    for part in ("actions", "probs"):
        path = Path(f"{prefix}.expected_{part}.npy")
        if not path.is_file():
            raise PlanlmError(f"{path}: missing from a plan cache in expectation; rerun `planlm sample-plans "
                              f"--expectation true --out_dir {plans_dir}` into an empty folder")
        arrays.append(load_npy(path, fix=_fix(plans_dir)))
    return arrays[0], arrays[1]


def expected_mass(plans_dir: str | Path, split: str) -> dict:
    """How much of each step's distribution the cached top actions hold (1 = exact): mean and least over the
    sampled steps of one split."""
    _, probs = load_expected(plans_dir, split)
    mass = np.asarray(probs, dtype=np.float32).sum(-1)  # (N_sent, K, T)
    return {"mean": float(mass.mean()) if mass.size else 1.0, "min": float(mass.min()) if mass.size else 1.0}
