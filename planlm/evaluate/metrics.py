"""The typed results of the evaluation commands, one per ``metrics.json``: ``PerplexityMetrics`` (``planlm
evaluate``), ``EditDistanceMetrics`` (``planlm edit-distance``) and ``AdherenceMetrics`` (``planlm adherence``).
Each file is its record's ``to_dict()``, key for key and in the same order as the dict the record replaced, so old
folders load with ``from_dict`` (a key written before its field existed reads as None) and new ones are byte for
byte what planlm wrote before."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypeVar

from planlm.stage.integrity import fix_for, load_json

Record = TypeVar("Record", bound="MetricsRecord")


def _measured(record: Optional[type] = None, flat: bool = False) -> Any:
    """A field left out of metrics.json when None (written only when measured), as the dicts before the types did.
    ``record``: the field is that record, a dict under its key, or with ``flat`` its keys among its parent's."""
    return field(default=None, metadata={"when_measured": True, "record": record, "flat": flat})


def _nested(record: type) -> Any:
    """A field that is a record of its own (a dict under the field's key in metrics.json)."""
    return field(metadata={"record": record})


class MetricsRecord:
    """A dataclass written as a JSON object: its fields in order, None-when-unmeasured fields left out, nested
    records as their own dicts (or spliced in, ``flat``). Subclasses are dataclasses."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (the contents of metrics.json, or of its part)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get("when_measured"):
                continue
            if isinstance(value, MetricsRecord) and f.metadata.get("flat"):
                out.update(value.to_dict())
            else:
                out[f.name] = value.to_dict() if isinstance(value, MetricsRecord) else value
        return out

    @classmethod
    def from_dict(cls: type[Record], record: dict[str, Any]) -> Record:
        """The record of a JSON object written by any planlm version (missing keys read as None)."""
        return cls(**{f.name: _read_field(f, record) for f in dataclasses.fields(cls)})

    @classmethod
    def load(cls: type[Record], folder: str | Path) -> Record:
        """The metrics of a command's folder; one-line DamagedArtifact when its metrics.json is unreadable."""
        return cls.from_dict(load_json(Path(folder) / "metrics.json", fix_for(folder)))


def _read_field(f: dataclasses.Field, record: dict[str, Any]) -> Any:
    """One field of a record read from its JSON object: a flat nested record is None when none of its keys is."""
    nested = f.metadata.get("record")
    if nested is None:
        return record.get(f.name)
    if f.metadata.get("flat"):
        value = nested.from_dict(record)
        return value if any(getattr(value, g.name) is not None for g in dataclasses.fields(value)) else None
    return None if record.get(f.name) is None else nested.from_dict(record[f.name])


@dataclass(kw_only=True)
class PlanUsage(MetricsRecord):
    """How much the LM reads its plans: the split scored again with the plans shuffled across its sentences."""

    plan_usage_nats: float
    """Shuffled minus own NLL, nats per token (positive: the LM reads its plans)."""
    ppl_shuffled_plans: float
    plan_usage_ppl: float
    """Perplexity with shuffled plans minus with its own, with its paired bootstrap interval (below)."""
    plan_usage_ci_low: float
    plan_usage_ci_high: float


@dataclass(kw_only=True)
class PathCounts(MetricsRecord):
    """The paths a planner drew per boundary (per planner call in generation), over all of them: the planning
    compute (``planlm.plans.policy.paths_summary``; 0 without a planner)."""

    paths_mean: float
    paths_min: Optional[int] = _measured()
    paths_max: Optional[int] = _measured()
    paths_total: int
    paths_hist: dict
    """{paths: boundaries} (keys are strings once read back from JSON)."""
    paths_fraction_of_max: Optional[float] = _measured()
    """paths_mean / K, for plans that sample K paths."""


@dataclass(kw_only=True)
class PerplexityMetrics(MetricsRecord):
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
    paths: Optional[PathCounts] = _measured(PathCounts, flat=True)
    """The paths the planner drew; its fields are metrics.json's paths_* keys, here in that order."""
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
    plan_usage: Optional[PlanUsage] = _measured(PlanUsage, flat=True)
    """With ``--plan_usage``: its fields follow the others in metrics.json, flat."""


@dataclass(kw_only=True)
class EditDistanceMetrics(MetricsRecord):
    """The Levenshtein distance of generated and true continuations' action sequences, raw and divided by the
    reference's length, with bootstrap intervals over boundaries; the compute it took and the settings it ran with.
    Fields are in metrics.json's order; a field may be None in a folder written before it existed."""

    edit_distance: float
    """Mean over boundaries, with its interval (below)."""
    ci_low: float
    ci_high: float
    normalized: float
    """Mean of the distance divided by the reference's length, with its interval (below)."""
    normalized_ci_low: float
    normalized_ci_high: float
    confidence: float
    boundaries: int
    articles: int
    generated_tokens: int
    wall_time_s: float
    tokens_per_s: float
    """Generated tokens per second."""
    conditioning: str
    K: Optional[int]
    T: Optional[int]
    tau: Optional[float]
    temperature: float
    """The LM's sampling temperature (tau is the planner's)."""
    top_k: Optional[int]
    top_p: Optional[float]
    new_tokens: int
    """Tokens generated at each boundary, and the length of its true continuation."""
    context_length: int
    model_dir: str
    prepared_dir: str
    split: str
    path_policy: dict
    paths: Optional[PathCounts] = _measured(PathCounts, flat=True)
    """The paths the planner drew; its fields are metrics.json's paths_* keys, here in that order."""


@dataclass(kw_only=True)
class SeededInterval(MetricsRecord):
    """A statistic averaged over training seeds with its interval over documents and seeds
    (``planlm.evaluate.bootstrap.seeded_interval``)."""

    mean: float
    ci_low: float
    ci_high: float
    seeds: list[float]
    """The statistic of each seed."""
    seed_se: float
    document_se: float
    documents: int
    confidence: float
    bootstrap_samples: int


@dataclass(kw_only=True)
class ConditionAdherence(MetricsRecord):
    """One condition of ``planlm adherence``: how often its sentences realise the requested action."""

    adherence: SeededInterval = _nested(SeededInterval)
    """The fraction of complete sentences whose nearest action is the requested one."""
    top5: SeededInterval = _nested(SeededInterval)
    """The fraction whose 5 nearest actions hold the requested one."""
    chance: SeededInterval = _nested(SeededInterval)
    """Requested and realised actions paired at random (frequency-matched)."""
    chance_top5: SeededInterval = _nested(SeededInterval)
    over_chance: SeededInterval = _nested(SeededInterval)
    """Adherence / chance."""
    sentences: list[int]
    """Complete sentences written, per seed."""
    sentences_asked: int
    of_asked: Optional[SeededInterval] = _measured(SeededInterval)
    """Hits over the sentences asked for: a sentence left unfinished counts as a miss, so a condition cannot score
    by writing fewer sentences."""
    outline_minus: Optional[SeededInterval] = _measured(SeededInterval)
    """Outline's adherence minus this condition's, paired (when outline is among the conditions; not on itself)."""

    def means(self) -> dict[str, float]:
        """{statistic: mean} of every interval, in order (the manifest's summary)."""
        return {f.name: getattr(self, f.name).mean for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), SeededInterval)}


@dataclass
class AdherenceMetrics(MetricsRecord):
    """What one ``planlm adherence`` measured: metrics.json is {condition: its numbers}, in the order asked."""

    conditions: dict[str, ConditionAdherence]

    def to_dict(self) -> dict[str, Any]:
        """The contents of metrics.json."""
        return {name: condition.to_dict() for name, condition in self.conditions.items()}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> AdherenceMetrics:
        """The metrics of an adherence metrics.json."""
        return cls({name: ConditionAdherence.from_dict(condition) for name, condition in record.items()})
