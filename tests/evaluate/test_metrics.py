"""The typed results of the evaluation commands (PerplexityMetrics, EditDistanceMetrics, AdherenceMetrics): each
metrics.json is its record's to_dict(), byte for byte what the untyped dict wrote, and a metrics.json of an older
planlm loads."""

from __future__ import annotations

import json

import numpy as np

from planlm.evaluate.bootstrap import seeded_interval
from planlm.evaluate.metrics import (AdherenceMetrics, EditDistanceMetrics, PathCounts, PerplexityMetrics,
                                    PlanUsage, SeededInterval)
from planlm.jsonio import write_json
from planlm.plans.policy import paths_summary

# A metrics.json as planlm wrote it before the type (the tests' tiny run, evaluation "ours"), in its order.
WRITTEN = {
    "ppl": 32080.389568, "ci_low": 30000.5, "ci_high": 34000.25, "confidence": 0.95, "nll": 10.376, "tokens": 1200,
    "articles": 6, "unscored_tokens": 6, "protocol": "stride-32 (64-token windows)",
    "note": "the first token of every article is not scored (it has no context)", "stride": 32,
    "context_length": 64, "windows": 44, "wall_time_s": 0.5, "plan_time_s": 0.1, "lm_time_s": 0.3,
    "planner_time_s": 0.05, "adapter_time_s": 0.01, "plans_from_cache": True,
    "path_policy": {"kind": "all", "max_paths": 3}, "cache_planner_time_s": 0.2, "paths_mean": 3.0,
    "paths_min": 3, "paths_max": 3, "paths_total": 90, "paths_hist": {"3": 30}, "paths_fraction_of_max": 1.0,
    "tokens_per_s": 2400.0, "conditioning": "planner_sampled", "K": 3, "T": 3, "tau": 1.0, "expectation": False,
    "top_actions": None, "seed": 0, "fixed_action": None, "planner_dir": "/run/planner", "plans_dir": "/run/plans",
    "model_dir": "/run/lm/ours", "prepared_dir": "/run/prepared", "split": "test", "device": "cpu",
    "precision": "auto", "plan_usage_nats": 0.002, "ppl_shuffled_plans": 32150.0, "plan_usage_ppl": 69.6,
    "plan_usage_ci_low": -10.0, "plan_usage_ci_high": 150.0,
}


def test_metrics_json_round_trips_byte_for_byte(tmp_path):
    for record in (WRITTEN, {k: v for k, v in WRITTEN.items() if not k.startswith(("plan_usage", "ppl_shuffled"))}):
        write_json(tmp_path / "before.json", record)
        metrics = PerplexityMetrics.from_dict(json.loads((tmp_path / "before.json").read_text()))
        write_json(tmp_path / "after.json", metrics.to_dict())
        assert (tmp_path / "after.json").read_bytes() == (tmp_path / "before.json").read_bytes()
    assert PerplexityMetrics.from_dict(WRITTEN).plan_usage == PlanUsage(
        plan_usage_nats=0.002, ppl_shuffled_plans=32150.0, plan_usage_ppl=69.6, plan_usage_ci_low=-10.0,
        plan_usage_ci_high=150.0)


def test_an_older_metrics_json_loads_with_what_it_lacks_as_none(tmp_path):
    old = {"ppl": 41.5, "ci_low": 40.0, "ci_high": 43.0, "tokens": 100, "articles": 2, "retired_key": 1}
    (tmp_path / "metrics.json").write_text(json.dumps(old))
    metrics = PerplexityMetrics.load(tmp_path)
    assert (metrics.ppl, metrics.tokens) == (41.5, 100) and metrics.paths is None and metrics.plan_usage is None
    assert "paths_min" not in metrics.to_dict() and metrics.to_dict()["conditioning"] is None


# An edit-distance metrics.json as planlm wrote it before the type (planner_sampled plans, K=2), in its order.
EDIT_WRITTEN = {
    "edit_distance": 1.5, "ci_low": 0.75, "ci_high": 2.25, "normalized": 0.6, "normalized_ci_low": 0.3,
    "normalized_ci_high": 0.9, "confidence": 0.95, "boundaries": 4, "articles": 3, "generated_tokens": 48,
    "wall_time_s": 1.25, "tokens_per_s": 38.4, "conditioning": "planner_sampled", "K": 2, "T": 3, "tau": 1.0,
    "temperature": 1.0, "top_k": None, "top_p": None, "new_tokens": 12, "context_length": 128,
    "model_dir": "/run/lm/ours", "prepared_dir": "/run/prepared", "split": "test",
    "path_policy": {"kind": "all", "max_paths": 2}, "paths_mean": 2.0, "paths_min": 2, "paths_max": 2,
    "paths_total": 16, "paths_hist": {"2": 8}, "paths_fraction_of_max": 1.0,
}
# Fixed plans draw no path: paths_summary writes only its mean, total and histogram.
EDIT_FIXED = {**{k: v for k, v in EDIT_WRITTEN.items() if k not in ("paths_min", "paths_max", "paths_fraction_of_max")},
              "conditioning": "fixed", "paths_mean": 0.0, "paths_total": 0, "paths_hist": {}}


def interval(mean):
    return {"mean": mean, "ci_low": mean - 0.1, "ci_high": mean + 0.1, "seeds": [mean - 0.01, mean + 0.01],
            "seed_se": 0.01, "document_se": 0.04, "documents": 8, "confidence": 0.95, "bootstrap_samples": 200}


# An adherence metrics.json as planlm wrote it before the type: outline first (no paired row), then fixed.
ADHERENCE_WRITTEN = {
    "outline": {"adherence": interval(0.6), "top5": interval(0.9), "chance": interval(0.15),
                "chance_top5": interval(0.5), "over_chance": interval(4.0), "sentences": [16, 15],
                "sentences_asked": 16},
    "fixed": {"adherence": interval(0.2), "top5": interval(0.5), "chance": interval(0.14),
              "chance_top5": interval(0.45), "over_chance": interval(1.4), "sentences": [14, 16],
              "sentences_asked": 16, "outline_minus": interval(0.4)},
}


def rewritten(cls, record: dict, tmp_path):
    """(the bytes planlm wrote, the bytes its record writes once read back from the folder)."""
    write_json(tmp_path / "metrics.json", record)
    write_json(tmp_path / "after.json", cls.load(tmp_path).to_dict())
    return (tmp_path / "metrics.json").read_bytes(), (tmp_path / "after.json").read_bytes()


def test_edit_distance_metrics_json_round_trips_byte_for_byte(tmp_path):
    for record in (EDIT_WRITTEN, EDIT_FIXED):
        before, after = rewritten(EditDistanceMetrics, record, tmp_path)
        assert after == before
    fixed = EditDistanceMetrics.from_dict(EDIT_FIXED)
    assert fixed.paths.paths_min is None and fixed.paths.paths_total == 0 and "paths_min" not in fixed.to_dict()
    assert EditDistanceMetrics.from_dict(EDIT_WRITTEN).paths.paths_hist == {"2": 8}
    # every key paths_summary writes, in its order, with and without the planner's K and with no boundary at all
    for counts, max_paths in ((np.array([1, 1, 4, 8]), 8), (np.array([2, 2]), None), (np.zeros(0), 4)):
        summary = paths_summary(counts, max_paths)
        assert PathCounts(**summary).to_dict() == summary and list(PathCounts(**summary).to_dict()) == list(summary)


def test_an_older_edit_distance_metrics_json_loads_with_what_it_lacks_as_none(tmp_path):
    old = {"edit_distance": 2.0, "ci_low": 1.0, "ci_high": 3.0, "boundaries": 6, "conditioning": "oracle"}
    (tmp_path / "metrics.json").write_text(json.dumps(old))
    metrics = EditDistanceMetrics.load(tmp_path)
    assert (metrics.edit_distance, metrics.boundaries, metrics.conditioning) == (2.0, 6, "oracle")
    assert metrics.normalized is None and metrics.paths is None and "paths_max" not in metrics.to_dict()


def test_adherence_metrics_json_round_trips_byte_for_byte(tmp_path):
    before, after = rewritten(AdherenceMetrics, ADHERENCE_WRITTEN, tmp_path)
    assert after == before
    metrics = AdherenceMetrics.from_dict(ADHERENCE_WRITTEN)
    assert list(metrics.conditions) == ["outline", "fixed"] and metrics.conditions["outline"].outline_minus is None
    assert metrics.conditions["fixed"].outline_minus == SeededInterval(**interval(0.4))
    # every key of the intervals adherence writes, in their order (a key seeded_interval gains must gain a field)
    real = seeded_interval(lambda weights, s: weights[:, 0] + s, num_seeds=2, num_articles=4, num_samples=20)
    assert SeededInterval.from_dict(real).to_dict() == real and list(real) == list(interval(0.5))
    # the manifest's summary: every interval's mean, as the dict's {name: value["mean"]} gave it
    assert {c: m.means() for c, m in metrics.conditions.items()} == {
        c: {name: value["mean"] for name, value in m.items() if isinstance(value, dict)}
        for c, m in ADHERENCE_WRITTEN.items()}


def test_an_older_adherence_metrics_json_loads_with_what_it_lacks_as_none(tmp_path):
    old = {"outline": {"adherence": interval(0.5), "chance": interval(0.1), "sentences": [4]}}
    (tmp_path / "metrics.json").write_text(json.dumps(old))
    outline = AdherenceMetrics.load(tmp_path).conditions["outline"]
    assert outline.adherence.mean == 0.5 and outline.sentences == [4]
    assert outline.top5 is None and outline.sentences_asked is None and outline.means() == {"adherence": 0.5,
                                                                                            "chance": 0.1}
