"""PerplexityMetrics, the typed result of `planlm evaluate`: metrics.json is its to_dict(), byte for byte what the
untyped dict wrote, and a metrics.json of an older planlm loads."""

from __future__ import annotations

import json

from planlm.evaluate.metrics import PerplexityMetrics, PlanUsage
from planlm.jsonio import write_json

# A metrics.json as planlm wrote it before the type (the tests' tiny run, evaluation "ours"), in its order.
WRITTEN = {
    "ppl": 32080.389568, "ci_low": 30000.5, "ci_high": 34000.25, "confidence": 0.95, "nll": 10.376, "tokens": 1200,
    "articles": 6, "unscored_tokens": 6, "protocol": "stride-32 (64-token windows)",
    "note": "the first token of every article is not scored (it has no context)", "stride": 32,
    "context_length": 64, "windows": 44, "wall_time_s": 0.5, "plan_time_s": 0.1, "lm_time_s": 0.3,
    "planner_time_s": 0.05, "adapter_time_s": 0.01, "plans_from_cache": True,
    "path_policy": {"kind": "fixed", "max_paths": 3}, "cache_planner_time_s": 0.2, "paths_mean": 3.0,
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
    assert (metrics.ppl, metrics.tokens) == (41.5, 100) and metrics.paths_mean is None and metrics.plan_usage is None
    assert "paths_min" not in metrics.to_dict() and metrics.to_dict()["conditioning"] is None
