"""Edit distance under planner conditioning: the planner's plans reach the generated continuations."""

from __future__ import annotations

import pytest

from helpers import chatty_planned_lm, read_csv, use_planner
from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.evaluate.edit_distance import action_edit_distance, edit_distance
from planlm.evaluate.generate import generate
from planlm.evaluate.generator import ProtocolSampling, SamplingConfig
from planlm.evaluate.metrics import EditDistanceMetrics
from planlm.plans.config import PlanConfig


def test_edit_distance_with_planner_sampled_plans(synthetic_cycle, cycle_planner, tmp_path):
    prepared = PreparedDataset(synthetic_cycle)
    cycle_planner.save_pretrained(tmp_path / "planner")
    model = chatty_planned_lm(prepared)  # writes short sentences: generation re-plans at each
    use_planner(model, str(tmp_path / "planner"))
    model.save_pretrained(tmp_path / "model")
    # seed 6: the first continuation ends two sentences
    kwargs = dict(max_articles=3, max_boundaries_per_article=1, sampling=ProtocolSampling(max_new_tokens=12), seed=6,
                  bootstrap_samples=20, runtime=Runtime(device="cpu"))

    metrics = edit_distance(str(tmp_path / "model"), str(synthetic_cycle), str(tmp_path / "edit"), **kwargs)
    assert (metrics.conditioning, metrics.K, metrics.T) == ("planner_sampled", 2, 3)
    rows = read_csv(tmp_path / "edit" / "per_boundary.csv")
    assert len(rows) == 3
    for row in rows:
        generated = [int(a) for a in row["generated_actions"].split()]
        reference = [int(a) for a in row["reference_actions"].split()]
        assert int(row["distance"]) == action_edit_distance(generated, reference)[0] and reference
    # The first boundary's continuation is exactly `planlm generate` from that article prefix with the same seed:
    # the same prompt, the same planner calls (re-planning at generated sentence ends) and the same draws.
    first = rows[0]
    generated = generate(str(tmp_path / "model"), str(synthetic_cycle), article=int(first["article"]),
                         boundary=int(first["boundary"]), sampling=SamplingConfig(max_new_tokens=12), seed=6,
                         runtime=Runtime(device="cpu"))
    assert generated["text"] == first["generated_text"] and generated["planner_calls"] >= 3
    assert all(s["plan"] and len(s["plan"]["action_paths"]) == 2 for s in generated["sentences"])
    # The plans matter: the fixed action instead of the planner's plans writes other continuations.
    edit_distance(str(tmp_path / "model"), str(synthetic_cycle), str(tmp_path / "fixed"), plans=PlanConfig(kind="fixed"), **kwargs)
    fixed = read_csv(tmp_path / "fixed" / "per_boundary.csv")
    assert [r["generated_text"] for r in fixed] != [r["generated_text"] for r in rows]
    assert EditDistanceMetrics.load(tmp_path / "fixed").conditioning == "fixed"


def test_edit_distance_takes_the_protocols_sampling_only(tmp_path):
    with pytest.raises(PlanlmError, match="sampling is a ProtocolSampling .* got SamplingConfig"):
        edit_distance("model", "prepared", str(tmp_path / "edit"), sampling=SamplingConfig(top_k=5))
    assert not (tmp_path / "edit").exists()
    # The protocol's settings are checked where they are declared, once for both classes.
    with pytest.raises(PlanlmError, match="--sampling.max_new_tokens 0 must be >= 1"):
        ProtocolSampling(max_new_tokens=0)
    protocol = ProtocolSampling(max_new_tokens=12, temperature=0.5, plan_guidance=2)
    assert protocol.sampling() == SamplingConfig(max_new_tokens=12, temperature=0.5, plan_guidance=2.0)
