"""Adaptive planning compute: the path policies on hand-made distributions, mixed-K batching, the plan cache
key, bad input, and the policy through evaluate, the compute sweep and the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.models.adapter import AdapterConfig, build_adapter
from planlm.models.planned_lm import PlannedLM
from planlm.plans.cache import load_path_counts
from planlm.plans.draws import draw_plans
from planlm.plans.policy import PathPolicy, entropy_num_paths, path_mask_from_counts, paths_summary, sample_with_policy
from planlm.plans.sampling import sample_plans

from helpers import read_csv, tiny_planned_lm, tiny_planner, use_planner
from planlm.plans.config import PlanConfig


class HandMadePlanner:
    """A planner stand-in with given first-step logits (B, A) and independent steps drawn from them."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits
        self.config = type("Config", (), {"num_actions": logits.shape[1]})()
        self.calls: list[list[int]] = []

    def first_step_logits(self, context_embeds, context_mask):
        return self.logits[: len(context_embeds)]

    def sample_paths(self, context_embeds, context_mask, num_paths, horizon, temperature, generator=None, state=None):
        rows = context_embeds[:, 0, 0].long()  # which boundary each row is (hand-made contexts carry it)
        counts = num_paths if torch.is_tensor(num_paths) else torch.full((len(rows),), num_paths)
        self.calls.append(counts.tolist())
        probs = torch.softmax(self.logits[rows] / temperature, -1)  # (B, A)
        draws = torch.multinomial(probs.repeat_interleave(int(counts.max()) * horizon, 0), 1, generator=generator)
        paths = draws.view(len(rows), int(counts.max()), horizon)
        return torch.where(torch.arange(paths.shape[1])[None, :, None] < counts[:, None, None], paths, 0)


def contexts(batch: int):
    return torch.arange(batch, dtype=torch.float32)[:, None, None].expand(batch, 1, 2), torch.ones(batch, 1).bool()


def test_entropy_policy_maps_entropy_linearly_between_min_and_max_paths():
    num_actions = 8
    logits = torch.full((4, num_actions), -1e9)
    logits[0, 0] = 0  # certain: H = 0
    logits[1, :2] = 0  # two actions at 1/2: H = log 2 = a third of log 8
    logits[2, :4] = 0  # four: two thirds
    logits[3] = 0  # uniform: log 8
    counts = entropy_num_paths(logits, PathPolicy("entropy", min_paths=2, max_paths=32))
    assert counts.tolist() == [2, 2 + math.ceil(30 / 3), 2 + math.ceil(60 / 3), 32]
    # entropy_high: the entropy that already gets max_paths
    assert entropy_num_paths(logits, PathPolicy("entropy", 1, 10, entropy_high=math.log(2))).tolist() == [1, 10, 10, 10]


def test_entropy_policy_batch_comes_back_at_max_paths_even_when_no_boundary_needs_them():
    logits = torch.full((3, 8), -1e9)
    logits[:, 0] = 0  # all certain
    logits[2, 1] = 0  # one unsure between two
    paths, counts = sample_with_policy(HandMadePlanner(logits), *contexts(3), PathPolicy("entropy", 1, 30), 2, 1.0,
                                       torch.Generator().manual_seed(0))
    assert counts.tolist() == [1, 1, 11] and paths.shape == (3, 30, 2) and (paths[:, 11:] == 0).all()


def test_policy_all_draws_exactly_the_planners_paths(synthetic_cycle):
    planner = tiny_planner(PreparedDataset(synthetic_cycle), max_sentences=4)
    context, mask = torch.randn(5, 3, planner.config.embedding_dim), torch.ones(5, 3, dtype=torch.bool)
    expected = planner.sample_paths(context, mask, 4, 3, 1.0, torch.Generator().manual_seed(3))
    paths, counts = sample_with_policy(planner, context, mask, PathPolicy().resolve(4), 3, 1.0,
                                       torch.Generator().manual_seed(3))
    assert torch.equal(paths, expected) and counts.tolist() == [4] * 5


def test_a_policy_saved_as_fixed_is_read_as_all(synthetic_cycle, tmp_path):
    """Model folders and plan caches made before the policy all had its name record it as fixed: they are read as
    all, while a config that names fixed is an error."""
    assert PathPolicy.saved({"kind": "fixed", "min_paths": 1, "max_paths": 3, "entropy_high": None}) == \
        PathPolicy("all", 1, 3)
    assert PathPolicy.saved({"kind": "entropy", "min_paths": 2}) == PathPolicy("entropy", 2)
    with pytest.raises(PlanlmError, match="'fixed' is not a policy; choose one of all, entropy"):
        PathPolicy("fixed")
    model = tiny_planned_lm(PreparedDataset(synthetic_cycle))
    model.config.plans = {**model.config.plans, "path_policy": {"kind": "fixed", "min_paths": 1, "max_paths": 2,
                                                                "entropy_high": None}}
    from planlm.plans.config import trained_plans

    assert trained_plans(model).path_policy == PathPolicy("all", 1, model.config.plans["num_paths"])


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_per_boundary_counts_sample_valid_paths_in_one_batch(synthetic_cycle, dynamics):
    planner = tiny_planner(PreparedDataset(synthetic_cycle), max_sentences=4, dynamics=dynamics)
    context, mask = torch.randn(4, 3, planner.config.embedding_dim), torch.ones(4, 3, dtype=torch.bool)
    counts = torch.tensor([1, 5, 2, 5])
    paths = planner.sample_paths(context, mask, counts, 3, 1.0, torch.Generator().manual_seed(0))
    assert paths.shape == (4, 5, 3) and (paths[0, 1:] == 0).all() and (paths[2, 2:] == 0).all()
    assert paths.max() < planner.config.num_actions


@pytest.mark.parametrize("adapter", ["project_avg", "multipath"])
def test_mixed_k_batch_equals_each_boundary_alone(adapter):
    torch.manual_seed(0)
    config = AdapterConfig(kind=adapter, num_actions=9, action_dim=8, hidden_size=16, horizon=3, num_heads=2)
    module = build_adapter(config).eval()
    module.projection.reset_parameters()  # W and b at PyTorch's init, not the no-op zero: plan vectors that move
    if adapter == "multipath":
        with torch.no_grad():
            module.alpha_path.fill_(1.0)
            module.alpha_sample.fill_(1.0)
    counts = torch.tensor([1, 4, 2, 7])
    paths = torch.randint(0, 9, (4, 7, 3))  # (B, K_max, T); beyond each count: arbitrary padding
    batched = module(paths, path_mask_from_counts(counts, 7, 3))  # (B, D)
    for b, count in enumerate(counts.tolist()):
        alone = module(paths[b:b + 1, :count], None)  # (1, D) only its own paths
        torch.testing.assert_close(batched[b:b + 1], alone, atol=1e-5, rtol=1e-5)


def save_planner(folder, prepared_dir):
    return tiny_planner(PreparedDataset(prepared_dir), max_sentences=4).save_pretrained(folder)


def cache(planner_dir, prepared_dir, out_dir=None, **plans):
    """`sample-plans` of the validation split on CPU with the plans group (planner_dir and the given fields)."""
    return sample_plans(str(prepared_dir), PlanConfig(planner_dir=str(planner_dir), **plans), splits=["validation"],
                        runtime=Runtime(device="cpu"), out_dir=out_dir)


def test_plan_cache_stores_counts_and_is_keyed_by_the_policy(synthetic_cycle, tmp_path):
    planner_dir = save_planner(tmp_path / "planner", synthetic_cycle)
    every = cache(planner_dir, synthetic_cycle, num_paths=8)
    entropy = PathPolicy("entropy", 1, entropy_high=0.5)
    adaptive = cache(planner_dir, synthetic_cycle, num_paths=8, path_policy=entropy)
    widest = cache(planner_dir, synthetic_cycle, num_paths=8, path_policy=PathPolicy("entropy", 2))
    assert len({every, adaptive, widest}) == 3  # one default folder per policy
    assert (load_path_counts(every, "validation") == 8).all()
    counts = load_path_counts(adaptive, "validation")
    manifest = json.loads((adaptive / "manifest.json").read_text())
    assert manifest["config"]["path_policy"]["kind"] == "entropy" and "path_policy" not in \
        json.loads((every / "manifest.json").read_text())["config"]  # all keeps the old key
    assert manifest["paths"]["validation"]["paths_mean"] == pytest.approx(counts.mean())
    # Same folder, another policy: the cache is resampled, never reused.
    shared = tmp_path / "shared"
    cache(planner_dir, synthetic_cycle, str(shared), num_paths=8)
    before = json.loads((shared / "manifest.json").read_text())["config_fingerprint"]
    cache(planner_dir, synthetic_cycle, str(shared), num_paths=8, path_policy=entropy)
    after = json.loads((shared / "manifest.json").read_text())
    assert after["config_fingerprint"] != before and after["config"]["path_policy"]["entropy_high"] == 0.5
    np.testing.assert_array_equal(load_path_counts(shared, "validation"), counts)
    # the planner's draws of the same policy, seed and order give the cached paths
    split = PreparedDataset(synthetic_cycle)["validation"]
    plans = PlanConfig(kind="planner_sampled", num_paths=8, horizon=3, path_policy=entropy).resolve()
    drawn = draw_plans(tiny_planner(PreparedDataset(synthetic_cycle), max_sentences=4), split, plans)
    paths, out_counts = drawn.paths, drawn.counts
    np.testing.assert_array_equal(paths, np.load(shared / "validation.npy"))
    np.testing.assert_array_equal(out_counts, counts)


@pytest.mark.parametrize("settings, message", [
    ({"min_paths": 5, "max_paths": 2}, "min_paths 5 > --path_policy.max_paths 2; lower min_paths or raise max_paths"),
    ({"kind": "bandit"}, "'bandit' is not a policy; choose one of all, entropy"),
    ({"kind": "converge"}, "'converge' is not a policy; choose one of all, entropy"),
    ({"min_paths": 0}, "min_paths 0 must be >= 1"),
])
def test_bad_policy_settings_give_one_line_errors(settings, message):
    with pytest.raises(PlanlmError, match=message.replace("(", r"\(").replace("[", r"\[")) as error:
        PathPolicy(**settings)
    assert "\n" not in str(error.value)


def test_bad_policy_through_the_cli_is_one_line(synthetic_cycle, tmp_path, capsys):
    from planlm.cli import main

    planner_dir = save_planner(tmp_path / "planner", synthetic_cycle)
    with pytest.raises(SystemExit):
        main(["sample-plans", "--plans.planner_dir", str(planner_dir), "--prepared_dir", str(synthetic_cycle),
              "--plans.num_paths", "4", "--plans.path_policy.kind", "entropy", "--plans.path_policy.min_paths", "6"])
    err = capsys.readouterr().err.strip()
    assert "min_paths 6 > K = 4" in err and len(err.splitlines()) == 1


@pytest.fixture(scope="module")
def planned(tmp_path_factory, synthetic_cycle):
    prepared = PreparedDataset(synthetic_cycle)
    root = tmp_path_factory.mktemp("adaptive_models")
    tiny_planner(prepared, max_sentences=4).save_pretrained(root / "planner")
    model = tiny_planned_lm(prepared, adapter="project_avg")
    use_planner(model, str(root / "planner"))
    model.save_pretrained(root / "model")
    return root / "model"


def test_evaluate_records_paths_and_times_and_the_cache_carries_counts(planned, synthetic_cycle, tmp_path):
    from planlm.evaluate.perplexity import evaluate

    policy = PathPolicy("entropy", 1, entropy_high=1.0)
    metrics = evaluate(str(planned), str(synthetic_cycle), str(tmp_path / "direct"), max_articles=5,
                       plans=PlanConfig(num_paths=6, path_policy=policy), bootstrap_samples=20,
                       runtime=Runtime(device="cpu"),
                       plan_usage=False)
    counts = np.load(tmp_path / "direct" / "num_paths.npy")
    assert metrics.paths.paths_mean == pytest.approx(counts.mean())
    assert sum(metrics.paths.paths_hist.values()) == len(counts)
    assert 1 <= counts.min() and counts.max() <= 6 and metrics.path_policy["max_paths"] == 6
    assert metrics.planner_time_s > 0 and metrics.lm_time_s > 0
    # The same plans through a cache: the counts travel with the paths, the perplexity is the same.
    planner_dir = PlannedLM.from_pretrained(planned).plan_folders["planner_dir"]  # the card's, not the config's
    cache = sample_plans(str(synthetic_cycle), PlanConfig(planner_dir=planner_dir, num_paths=6, path_policy=policy),
                         splits=["test"], runtime=Runtime(device="cpu"), batch_size=256)
    cached = evaluate(str(planned), str(synthetic_cycle), str(tmp_path / "cached"),
                      plans=PlanConfig(plans_dir=str(cache)), max_articles=5, bootstrap_samples=20,
                      runtime=Runtime(device="cpu"), plan_usage=False)
    assert cached.paths.paths_mean == pytest.approx(float(load_path_counts(cache, "test")[:len(counts)].mean()))
    assert cached.path_policy["kind"] == "entropy"
    with pytest.raises(PlanlmError, match="sampled under path policy entropy"):
        evaluate(str(planned), str(synthetic_cycle), str(tmp_path / "clash"), max_articles=5,
                 runtime=Runtime(device="cpu"),
                 plans=PlanConfig(plans_dir=str(cache), path_policy=PathPolicy("entropy", 2)), plan_usage=False)
    # An evaluation under the policy all keeps its old reuse key (no path_policy in it) and samples K everywhere.
    every = evaluate(str(planned), str(synthetic_cycle), str(tmp_path / "all"), max_articles=5,
                     plans=PlanConfig(num_paths=6), bootstrap_samples=20, runtime=Runtime(device="cpu"), plan_usage=False)
    assert every.paths.paths_hist == {6: len(counts)}
    assert "path_policy" not in json.loads((tmp_path / "all" / "manifest.json").read_text())["config"]["plan_spec"]


def test_compute_sweep_through_the_cli(planned, synthetic_cycle, tmp_path):
    from planlm.cli import main

    main(["sweep", "--model_dir", str(planned), "--prepared_dir", str(synthetic_cycle), "--out_dir",
          str(tmp_path / "compute"), "--kind", "compute", "--num_paths", "[1, 4]", "--policies",
          '[{"kind": "entropy", "entropy_high": 1.0}, {"kind": "entropy", "min_paths": 2}]',
          "--max_articles", "4", "--bootstrap_samples", "20", "--runtime.device", "cpu"])
    rows = read_csv(tmp_path / "compute" / "sweep_compute.csv")
    assert [r["value"] for r in rows] == ["all-1", "all-4", "entropy-1-4-H-1", "entropy-2-4"]
    assert {r["reference"] for r in rows} == {"all-4"} and float(rows[1]["paired_diff"]) == 0.0
    assert float(rows[0]["paths_mean"]) == 1 and float(rows[1]["paths_fraction"]) == 1.0
    assert all(1 <= float(r["paths_mean"]) <= 4 for r in rows)
    went = json.loads((tmp_path / "compute" / "entropy-1-4-H-1" / "where_paths_went.json").read_text())
    assert went["most"][0]["paths"] >= went["fewest"][0]["paths"] and len(went["most"][0]["top_actions"]) == 3
    assert (tmp_path / "compute" / "sweep_compute.png").read_bytes()[:4] == b"\x89PNG"


def test_paths_summary_counts_every_boundary():
    summary = paths_summary(np.array([1, 1, 4, 8]), max_paths=8)
    assert summary["paths_hist"] == {1: 2, 4: 1, 8: 1} and summary["paths_mean"] == 3.5
    assert summary["paths_fraction_of_max"] == pytest.approx(3.5 / 8)


def test_generation_plans_each_sentence_end_under_the_policy(synthetic_cycle):
    from planlm.data.resources import load_tokenizer
    from planlm.evaluate.generate import synthetic_embed_fn
    from planlm.evaluate.generator import PlannedGenerator, SamplingConfig
    
    from helpers import chatty_planned_lm

    prepared = PreparedDataset(synthetic_cycle)
    cond = PlanConfig(kind="planner_sampled", num_paths=6, horizon=3, planner_dir="unused",
                      path_policy=PathPolicy("entropy", min_paths=2)).resolve()
    generator = PlannedGenerator(chatty_planned_lm(prepared), load_tokenizer("gpt2"), cond,
                                 planner=tiny_planner(prepared), embed_fn=synthetic_embed_fn(prepared), seed=2)
    result = generator.generate(generator.prompt_from_text("Red water red."), SamplingConfig(max_new_tokens=30))
    assert len(generator.paths_sampled) == result.planner_calls >= 2  # one boundary per planner call here
    assert all(2 <= k <= 6 for k in generator.paths_sampled)
    for sentence in result.sentences:  # each plan shows its own paths; the padding ones are masked
        if sentence["plan"]:
            valid = [any(step) for step in sentence["plan"]["path_mask"]]
            assert 2 <= sum(valid) <= 6 and valid == sorted(valid, reverse=True)
