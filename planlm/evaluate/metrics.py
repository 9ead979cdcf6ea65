"""``PerplexityMetrics``: what one ``planlm evaluate`` measured, typed. ``metrics.json`` is its ``to_dict()``, key for
key and in the same order as the dict it replaced, so old evaluation folders load with ``from_dict`` (a key written
before its field existed reads as None) and new ones are byte for byte what planlm wrote before."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from planlm.stage.integrity import fix_for, load_json

# Fields left out of metrics.json when None (written only when measured), as the dict before them did.
_WHEN_MEASURED = {"when_measured": True}


@dataclass(kw_only=True)
class PlanUsage:
    """How much the LM reads its plans: the split scored again with the plans shuffled across its sentences."""

    plan_usage_nats: float
    """Shuffled minus own NLL, nats per token (positive: the LM reads its plans)."""
    ppl_shuffled_plans: float
    plan_usage_ppl: float
    """Perplexity with shuffled plans minus with its own, with its paired bootstrap interval (below)."""
    plan_usage_ci_low: float
    plan_usage_ci_high: float

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> PlanUsage:
        """The plan-usage fields of a metrics.json (None where it has none)."""
        return cls(**{f.name: record.get(f.name) for f in dataclasses.fields(cls)})


@dataclass(kw_only=True)
class PerplexityMetrics:
    """Perplexity with its bootstrap interval over source documents, the compute it took and the settings it ran
    with. Fields are in metrics.json's order; a field may be None in a folder written before it existed."""

    ppl: float
    ci_low: float
    ci_high: float
    confidence: float
    nll: float
    """Mean NLL per scored token (nats)."""
    tokens: int
    """Scored tokens."""
    articles: int
    unscored_tokens: int
    protocol: str
    note: str
    stride: int
    context_length: int
    windows: int
    wall_time_s: float
    plan_time_s: float
    lm_time_s: float
    planner_time_s: float
    adapter_time_s: float
    plans_from_cache: bool
    path_policy: dict
    cache_planner_time_s: Optional[float]
    """With a plan cache: the planner's time for the whole split, as sample-plans measured it."""
    paths_mean: float
    """Paths per boundary (``planlm.plans.policy.paths_summary``)."""
    paths_min: Optional[int] = field(default=None, metadata=_WHEN_MEASURED)
    paths_max: Optional[int] = field(default=None, metadata=_WHEN_MEASURED)
    paths_total: int
    paths_hist: dict
    """{paths: boundaries} (keys are strings once read back from JSON)."""
    paths_fraction_of_max: Optional[float] = field(default=None, metadata=_WHEN_MEASURED)
    tokens_per_s: float
    conditioning: str
    K: int
    T: int
    tau: float
    expectation: bool
    top_actions: Optional[int]
    seed: Optional[int]
    fixed_action: Optional[int]
    planner_dir: Optional[str]
    plans_dir: Optional[str]
    model_dir: str
    prepared_dir: str
    split: str
    device: str
    precision: str
    plan_usage: Optional[PlanUsage] = field(default=None, metadata=_WHEN_MEASURED)
    """With ``--plan_usage``: its fields follow the others in metrics.json, flat."""

    def to_dict(self) -> dict[str, Any]:
        """The contents of metrics.json."""
        record = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get("when_measured"):
                continue
            if isinstance(value, PlanUsage):
                record.update(dataclasses.asdict(value))
            else:
                record[f.name] = value
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> PerplexityMetrics:
        """The metrics of a metrics.json (of any planlm version: missing keys read as None)."""
        usage = PlanUsage.from_dict(record)
        usage = usage if any(value is not None for value in dataclasses.astuple(usage)) else None
        return cls(**{f.name: record.get(f.name) for f in dataclasses.fields(cls) if f.name != "plan_usage"},
                   plan_usage=usage)

    @classmethod
    def load(cls, eval_dir: str | Path) -> PerplexityMetrics:
        """The metrics of an evaluation folder; one-line DamagedArtifact when its metrics.json is unreadable."""
        return cls.from_dict(load_json(Path(eval_dir) / "metrics.json", fix_for(eval_dir)))
