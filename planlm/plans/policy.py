"""How many paths each sentence boundary gets: the per-boundary K policy (adaptive planning compute).

The paper samples the same K paths at every boundary and names that cost as its limitation. A
``PathPolicy`` decides K per boundary instead, between ``min_paths`` and ``max_paths``:

- ``all``: every boundary gets all ``max_paths`` (the paper; ``max_paths`` defaults to the command's K).
- ``entropy``: K grows linearly with the entropy H of the planner's first-step distribution,
  K = min_paths + ceil((max_paths - min_paths) * min(1, H / entropy_high)), with ``entropy_high`` the
  entropy that gets ``max_paths`` (default log A: the uniform distribution). A confident planner gets
  ``min_paths``; one unsure between two actions of A = 8 gets a third of the range.

Batched, never one boundary at a time: a batch of B boundaries comes back as ``action_paths (B, K_max, T)``
plus ``num_paths (B,)``; the paths of boundary b beyond ``num_paths[b]`` are padding, masked out by
``path_mask_from_counts`` (the adapters drop a path with no valid step), so boundaries with different K
share one adapter call. Plan caches store ``num_paths`` next to the paths (``planlm.plans.cache``).

Letters: B boundaries, K paths (K_max the most any boundary gets), T horizon, A actions.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal, Optional

import numpy as np
import torch

from planlm.errors import PlanlmError

POLICIES = ("all", "entropy")
SAVED_NAMES = {"fixed": "all"}
"""Policy names that model folders and plan caches made before a policy took its present name record."""


@dataclass
class PathPolicy:
    """How many sampled paths each sentence boundary gets (adaptive planning compute)."""

    kind: Literal["all", "entropy"] = "all"
    """all (K = max_paths at every boundary) or entropy (K from the planner's first-step entropy)."""
    min_paths: int = 1
    """Fewest paths a boundary gets (entropy)."""
    max_paths: Optional[int] = None
    """Most paths a boundary gets; None: the command's num_paths (K)."""
    entropy_high: Optional[float] = None
    """entropy: first-step entropy in nats that gets max_paths; None: log(num_actions), the uniform distribution."""

    def __post_init__(self):
        if self.kind not in POLICIES:
            raise PlanlmError(f"--path_policy.kind {self.kind!r} is not a policy; choose one of {', '.join(POLICIES)}")
        if self.min_paths < 1:
            raise PlanlmError(f"--path_policy.min_paths {self.min_paths} must be >= 1; set it to 1 or more")
        if self.max_paths is not None and self.max_paths < self.min_paths:
            raise PlanlmError(f"--path_policy.min_paths {self.min_paths} > --path_policy.max_paths {self.max_paths}; "
                              f"lower min_paths or raise max_paths")
        if self.entropy_high is not None and not self.entropy_high > 0:
            raise PlanlmError(f"--path_policy.entropy_high {self.entropy_high} must be > 0 nats (or null: log A)")

    @classmethod
    def saved(cls, record: dict) -> "PathPolicy":
        """The policy a model folder or a plan cache records (``asdict``), under its present name."""
        return cls(**{**record, "kind": SAVED_NAMES.get(record.get("kind"), record.get("kind", "all"))})

    def resolve(self, num_paths: int) -> "PathPolicy":
        """This policy with max_paths filled in from the command's K (one-line error when it cannot be)."""
        max_paths = num_paths if self.max_paths is None else self.max_paths
        if self.min_paths > max_paths:
            raise PlanlmError(f"--path_policy.min_paths {self.min_paths} > K = {max_paths} (--num_paths); lower "
                              f"min_paths or raise --num_paths / --path_policy.max_paths")
        return PathPolicy(self.kind, self.min_paths, max_paths, self.entropy_high)

    @property
    def adaptive(self) -> bool:
        return self.kind != "all"

    def cache_key(self) -> Optional[dict]:
        """What plan caches and evaluations are keyed on: None for all (so caches made before policies existed
        stay valid), else every field."""
        return asdict(self) if self.adaptive else None

    def label(self) -> str:
        """A short name, e.g. ``all K=10``, ``entropy 1-50`` or ``entropy 1-50 H 0.7``."""
        if not self.adaptive:
            return f"all K={self.max_paths}"
        text = f"{self.kind} {self.min_paths}-{self.max_paths}"
        if self.entropy_high is not None:
            text += f" H {self.entropy_high:g}"
        return text


def policy_keyed(settings: dict) -> dict:
    """A config dict (``asdict`` of settings holding a ``path_policy``) as reuse keys hold it: the policy only
    when adaptive, so caches, models and evaluations made before policies existed stay valid."""
    policy = settings.get("path_policy")
    key = {name: value for name, value in settings.items() if name != "path_policy"}
    if policy and PathPolicy.saved(policy).adaptive:
        key["path_policy"] = policy
    return key


def entropy_num_paths(logits: torch.Tensor, policy: PathPolicy, temperature: float = 1.0) -> torch.Tensor:
    """logits (B, A) of the planner's first step -> paths per boundary (B,) long under the entropy policy.

    The entropy is that of the distribution the paths are drawn from (logits / temperature)."""
    num_actions = logits.shape[-1]
    log_probs = torch.log_softmax(logits.float() / max(temperature, 1e-6), dim=-1)  # (B, A)
    entropy = -(log_probs.exp() * log_probs).sum(-1)  # (B,) nats
    high = policy.entropy_high if policy.entropy_high is not None else math.log(max(num_actions, 2))
    share = (entropy / high).clamp(0.0, 1.0)  # (B,)
    extra = torch.ceil((policy.max_paths - policy.min_paths) * share - 1e-6).clamp(min=0).long()  # (B,)
    return policy.min_paths + extra


def path_mask_from_counts(num_paths: torch.Tensor, max_paths: int, horizon: int) -> torch.Tensor:
    """num_paths (B,) -> path_mask (B, K_max, T) bool: the first num_paths[b] paths of each boundary."""
    valid = torch.arange(max_paths, device=num_paths.device)[None, :] < num_paths[:, None]  # (B, K)
    return valid[:, :, None].expand(-1, -1, horizon).contiguous()


def paths_summary(num_paths: np.ndarray, max_paths: Optional[int] = None) -> dict:
    """Accounting of paths over boundaries: mean, min, max, total and the histogram {K: boundaries}."""
    num_paths = np.asarray(num_paths, dtype=np.int64)
    if not len(num_paths):
        return {"paths_mean": 0.0, "paths_total": 0, "paths_hist": {}}
    values, counts = np.unique(num_paths, return_counts=True)
    summary = {"paths_mean": float(num_paths.mean()), "paths_min": int(num_paths.min()),
               "paths_max": int(num_paths.max()), "paths_total": int(num_paths.sum()),
               "paths_hist": {int(v): int(c) for v, c in zip(values, counts)}}
    if max_paths:
        summary["paths_fraction_of_max"] = float(num_paths.mean() / max_paths)
    return summary


@torch.no_grad()
def sample_with_policy(planner, context_embeds: torch.Tensor, context_mask: torch.Tensor, policy: PathPolicy,
                       horizon: int, temperature: float, generator: torch.Generator | None = None,
                       state=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Paths of a batch of boundaries under ``policy`` (resolved: max_paths set).

    context_embeds (B, S, E), context_mask (B, S) -> action_paths (B, K_max, T) long (padding beyond a
    boundary's count), num_paths (B,) long. ``all`` is exactly ``planner.sample_paths`` (same draws).
    ``state``: the contexts' start state (``Planner.start``) when the caller holds it (the same draws)."""
    batch = context_embeds.shape[0]
    device = context_embeds.device
    if not policy.adaptive or temperature == 0:
        paths = planner.sample_paths(context_embeds, context_mask, policy.max_paths, horizon, temperature, generator,
                                     state=state)
        return paths, torch.full((batch,), policy.max_paths, dtype=torch.long, device=device)
    first_logits = planner.first_step_logits(context_embeds, context_mask) if state is None else state.logits  # (B, A)
    counts = entropy_num_paths(first_logits, policy, temperature)
    paths = planner.sample_paths(context_embeds, context_mask, counts, horizon, temperature, generator, state=state)
    padding = policy.max_paths - paths.shape[1]  # no boundary of this batch may have needed K_max
    return torch.nn.functional.pad(paths, (0, 0, 0, padding)), counts  # (B, K_max, T), (B,)
