"""Plans in expectation (``plans.expectation``): the expected action embedding under the planner's step
distributions, through the plan sources, the caches, both adapters and the real commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers import read_csv, tiny_planned_lm, tiny_planner, use_planner
from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.models.adapter import AdapterConfig, build_adapter
from planlm.plans.cache import load_expected
from planlm.plans.config import PlanConfig
from planlm.plans.contexts import boundary_contexts
from planlm.plans.registry import plan_source
from planlm.plans.sampling import sample_plans


def adapter(prepared: PreparedDataset, kind: str = "project_avg", horizon: int = 3):
    """A random adapter (W not zero; multipath with both gates open) over the corpus's actions."""
    torch.manual_seed(0)
    config = AdapterConfig(kind=kind, num_actions=prepared.num_actions, action_dim=prepared.embedding_dim,
                           hidden_size=16, horizon=horizon, num_heads=2)
    module = build_adapter(config, prepared.codebook).eval()
    module.projection.reset_parameters()  # W and b at PyTorch's init, not the no-op zero
    if kind == "multipath":
        with torch.no_grad():
            module.alpha_path.fill_(1.0)
            module.alpha_sample.fill_(1.0)
    return module


def plan_vectors(module, source, sentences) -> torch.Tensor:
    with torch.no_grad():
        return module(*source(sentences))


@pytest.fixture(scope="module")
def planner_dir(tmp_path_factory, synthetic_cycle):
    folder = tmp_path_factory.mktemp("expectation") / "planner"
    tiny_planner(PreparedDataset(synthetic_cycle), max_sentences=4).save_pretrained(folder)
    return folder


def test_at_t1_the_expected_plan_vector_is_the_many_path_limit(synthetic_cycle, planner_dir):
    """T = 1: one path in expectation = the exact expectation of the plan vector = the K -> infinity average of
    sampled plan vectors (within Monte Carlo error), and = sum_a p(a) Emb(a) from the planner's logits."""
    prepared = PreparedDataset(synthetic_cycle)
    split = prepared["validation"]
    sentences = np.arange(12)
    module = adapter(prepared)
    plans = dict(kind="planner_sampled", horizon=1, planner_dir=str(planner_dir))  # every one of A = 8 actions kept
    expected = plan_vectors(module, plan_source(PlanConfig(**plans, expectation=True).resolve(), prepared, split,
                                                sentences=sentences), sentences)  # (N, D)
    num_paths = 4000
    many = plan_source(PlanConfig(**plans, num_paths=num_paths).resolve(), prepared, split, sentences=sentences)
    paths, _, _ = many(sentences)  # (N, K, 1)
    with torch.no_grad():
        per_path = module.projection(module.action_embedding(paths[:, :, 0]))  # (N, K, D) each path's vector
    average, error = per_path.mean(1), per_path.std(1) / num_paths ** 0.5  # (N, D)
    z = ((expected - average) / error.clamp(min=1e-6)).abs()
    assert float(z.max()) < 5.0 and float(z.mean()) < 1.5  # Monte Carlo error, not a bias
    assert torch.allclose(plan_vectors(module, many, sentences), average, atol=1e-5)  # the adapter's own mean
    # exact: the planner's first-step distribution times the action embeddings
    planner = tiny_planner(prepared, max_sentences=4)
    context, mask = boundary_contexts(split, sentences, planner.config.max_sentences)
    probs = planner.first_step_logits(context, mask).softmax(-1)  # (N, A)
    with torch.no_grad():
        exact = module.projection(probs @ module.action_embedding.weight)
    assert torch.allclose(expected, exact, atol=2e-3)  # float16 probabilities


@pytest.mark.parametrize("kind", ["project_avg", "multipath"])
def test_a_one_hot_distribution_is_the_sampled_path(synthetic_cycle, kind):
    """Each step's distribution on the drawn action alone gives the sampled plan's vector (both adapters; extra
    actions at probability 0), and the action embedding learns through the expectation."""
    prepared = PreparedDataset(synthetic_cycle)
    module = adapter(prepared, kind)
    torch.manual_seed(1)
    paths = torch.randint(0, prepared.num_actions, (5, 2, 3))  # (N, K, T)
    paths[1, 1] = paths[1, 0]  # a repeated path (encoded once by multipath)
    mask = torch.ones_like(paths, dtype=torch.bool)
    mask[2, 1, 2:] = False
    others = torch.randint(0, prepared.num_actions, (5, 2, 3, 2))
    actions = torch.cat([paths.unsqueeze(-1), others], -1)  # (N, K, T, 3)
    probs = torch.tensor([1.0, 0.0, 0.0]).expand_as(actions).contiguous()
    with torch.no_grad():
        assert torch.allclose(module(actions, mask, probs), module(paths, mask), atol=1e-5)
    soft = torch.softmax(torch.randn(actions.shape), -1)
    module(actions, mask, soft).sum().backward()
    assert module.action_embedding.weight.grad.abs().sum() > 0
    with torch.no_grad():  # batch-independent: a row's vector does not depend on its neighbours
        assert torch.allclose(module(actions, mask, soft)[:2], module(actions[:2], mask[:2], soft[:2]), atol=1e-5)


def test_caches_in_expectation_have_their_own_key_and_match_the_planner(synthetic_cycle, planner_dir, tmp_path):
    prepared = PreparedDataset(synthetic_cycle)
    split = prepared["validation"]
    common = dict(planner_dir=str(planner_dir), num_paths=2, horizon=3)
    sampled = sample_plans(str(synthetic_cycle), PlanConfig(**common), splits=["validation"],
                           runtime=Runtime(device="cpu"))
    expected = sample_plans(str(synthetic_cycle), PlanConfig(**common, expectation=True),
                            splits=["validation"], runtime=Runtime(device="cpu"))
    assert expected != sampled and expected.name.endswith("-expected64")
    manifest = json.loads((expected / "manifest.json").read_text())
    assert manifest["config"]["expectation"] == {"top_actions": 64} and "expectation" not in \
        json.loads((sampled / "manifest.json").read_text())["config"]  # caches of sampled actions keep their key
    kept = manifest["expectation"]["kept"]["validation"]
    assert 1.0 - 1e-2 < kept["min"] <= kept["mean"] <= 1.0 + 1e-2  # all 8 actions kept, in float16
    actions, probs = load_expected(expected, "validation")
    assert actions.shape == (split.num_sentences, 2, 3, 8) and actions.dtype == np.int16 and probs.dtype == np.float16
    np.testing.assert_array_equal(np.load(expected / "validation.npy"), np.load(sampled / "validation.npy"))  # same draws
    # the cache gives the vectors the planner computes on the fly (the same boundaries: the same draws)
    module, sentences = adapter(prepared), np.arange(split.num_sentences)
    for kind in ("planner_sampled", "planner_argmax"):
        plans = dict(kind=kind, num_paths=2, horizon=3, expectation=True)
        cached = plan_source(PlanConfig(**plans, plans_dir=str(expected)).resolve(), prepared, split)
        direct = plan_source(PlanConfig(**plans, planner_dir=str(planner_dir)).resolve(), prepared, split,
                             sentences=sentences)
        assert torch.equal(plan_vectors(module, cached, sentences), plan_vectors(module, direct, sentences))
    one = plan_source(PlanConfig(kind="planner_argmax", num_paths=1, horizon=3, expectation=True,
                                 plans_dir=str(expected)).resolve(), prepared, split)(sentences[:3])
    assert one.action_paths.shape == (3, 1, 3, 8) and one.path_mask.shape == (3, 1, 3)  # K = 1: one copy
    # a cache is never read for the other setting
    with pytest.raises(PlanlmError, match="holds only sampled actions.*sample-plans --plans.expectation true"):
        plan_source(PlanConfig(kind="planner_sampled", num_paths=2, horizon=3, expectation=True,
                               plans_dir=str(sampled)).resolve(), prepared, split)
    with pytest.raises(PlanlmError, match="holds plans in expectation \\(top 64 actions per step\\); set "
                                          "--plans.expectation true"):
        plan_source(PlanConfig(kind="planner_sampled", num_paths=2, horizon=3, plans_dir=str(expected)).resolve(),
                    prepared, split)


@pytest.mark.parametrize("plans, message", [
    (PlanConfig(kind="oracle", expectation=True), "--plans.expectation true with --plans.kind oracle: oracle plans "
                                                "have no planner distribution"),
    (PlanConfig(kind="fixed", expectation=True), "with --plans.kind fixed"),
    (PlanConfig(expectation=True), "with --plans.kind none"),
    (PlanConfig(kind="planner_sampled", expectation=True, path_policy={"kind": "entropy"}), "needs no adaptive paths"),
])
def test_bad_settings_are_one_line_errors(plans, message):
    with pytest.raises(PlanlmError, match=message) as error:
        plans.resolve()
    assert "\n" not in str(error.value)


def test_a_model_trained_in_expectation_is_evaluated_in_expectation_unless_told():
    trained = PlanConfig(kind="planner_sampled", planner_dir="p", expectation=True).resolve()
    assert PlanConfig(num_paths=3).resolve(trained).expectation
    assert not PlanConfig(expectation=False).resolve(trained).expectation
    assert not PlanConfig(kind="oracle").resolve(trained).expectation  # the other kinds have no distribution
    assert "expectation" not in PlanConfig(kind="planner_sampled", planner_dir="p").resolve().cache_key()
    assert trained.cache_key()["top_actions"] == 64 and "in expectation (top 64)" in trained.label()


def test_sample_plans_cli_refuses_expectation_with_an_adaptive_policy(synthetic_cycle, planner_dir, capsys):
    from planlm.cli import main

    with pytest.raises(SystemExit):
        main(["sample-plans", "--plans.planner_dir", str(planner_dir), "--prepared_dir", str(synthetic_cycle),
              "--plans.num_paths", "4", "--plans.expectation", "true", "--plans.path_policy.kind", "entropy"])
    err = capsys.readouterr().err.strip()
    assert "needs no adaptive paths" in err and len(err.splitlines()) == 1


def test_train_evaluate_sweep_and_generate_in_expectation_through_the_cli(synthetic_cycle, planner_dir, tmp_path):
    """Trained on samples and evaluated in expectation; trained in expectation throughout; the compute sweep's
    point of its own; generation."""
    from planlm.cli import main

    prepared = PreparedDataset(synthetic_cycle)
    base = ["--prepared_dir", str(synthetic_cycle), "--plans.kind", "planner_sampled", "--plans.horizon", "2",
            "--plans.planner_dir", str(planner_dir), "--train.max_steps", "3", "--train.batch_size", "8",
            "--train.context_length", "32", "--train.stride", "31",
            "--model.model_config", '{"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, '
                                    '"n_positions": 32}']
    main(["train-lm", "--out_dir", str(tmp_path / "sampled"), *base])
    main(["train-lm", "--out_dir", str(tmp_path / "expected"), *base, "--plans.expectation", "true",
          "--adapter.kind", "multipath"])
    trained = json.loads((tmp_path / "expected" / "planned_lm.json").read_text())["plans"]
    assert trained["expectation"] and "top_actions" not in trained
    assert json.loads((tmp_path / "expected" / "manifest.json").read_text())["plans_dir"].endswith("-expected64")
    evaluation = ["--prepared_dir", str(synthetic_cycle), "--max_articles", "4", "--context_length", "32",
                  "--bootstrap_samples", "20", "--runtime.device", "cpu"]
    main(["evaluate", "--model_dir", str(tmp_path / "sampled"), "--out_dir", str(tmp_path / "eval-sampled"),
          *evaluation, "--plans.expectation", "true"])
    main(["evaluate", "--model_dir", str(tmp_path / "expected"), "--out_dir", str(tmp_path / "eval-expected"),
          *evaluation])
    for name in ("sampled", "expected"):
        metrics = json.loads((tmp_path / f"eval-{name}" / "metrics.json").read_text())
        assert metrics["expectation"] and np.isfinite(metrics["ppl"]) and metrics["paths_mean"] == 1
    main(["sweep", "--model_dir", str(tmp_path / "sampled"), "--out_dir", str(tmp_path / "compute"), "--kind",
          "compute", "--num_paths", "[1, 3]", "--policies", "[]", "--expectation", "true", *evaluation])
    rows = read_csv(tmp_path / "compute" / "sweep_compute.csv")
    assert [(r["value"], r["policy"]) for r in rows] == [("all-1", "all"), ("all-3", "all"),
                                                         ("expected-1", "expected")]
    assert json.loads((tmp_path / "compute" / "expected-1" / "metrics.json").read_text())["expectation"]
    assert not json.loads((tmp_path / "compute" / "all-1" / "metrics.json").read_text())["expectation"]
    main(["generate", "--model_dir", str(tmp_path / "expected"), "--prepared_dir", str(synthetic_cycle), "--article",
          "0", "--boundary", "2", "--sampling.max_new_tokens", "6", "--runtime.device", "cpu", "--out_file",
          str(tmp_path / "generated.json")])
    generated = json.loads((tmp_path / "generated.json").read_text())
    plans = [s["plan"] for s in generated["sentences"] if s["plan"]]
    assert plans and all(np.asarray(p["action_paths"]).shape == (1, 2) for p in plans)
    assert prepared.num_actions == 8


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_each_stored_step_is_the_planner_distribution_given_the_sampled_prefix(synthetic_cycle, tmp_path, dynamics):
    """T > 1: the distribution stored for step t of a sampled path is the planner's at step t under teacher forcing
    on that path's own actions before t (not step 1's, nor another path's), in the cache and on the fly."""
    prepared = PreparedDataset(synthetic_cycle)
    split = prepared["validation"]
    planner = tiny_planner(prepared, max_sentences=4, dynamics=dynamics)
    planner.save_pretrained(tmp_path / "planner")
    num_actions, horizon, temperature = prepared.num_actions, 3, 0.7
    cache = sample_plans(str(synthetic_cycle), PlanConfig(planner_dir=str(tmp_path / "planner"), num_paths=3,
                                                          horizon=horizon, temperature=temperature, expectation=True),
                         splits=["validation"], runtime=Runtime(device="cpu"))  # every one of A = 8 actions kept
    paths = torch.from_numpy(np.load(cache / "validation.npy"))  # (N, K, T)
    actions, probs = (torch.from_numpy(np.array(x)) for x in load_expected(cache, "validation"))  # (N, K, T, A)
    stored = torch.zeros(*paths.shape, num_actions).scatter_(-1, actions.long(), probs.float())  # (N, K, T, A)
    sentences = np.arange(split.num_sentences)
    context, mask = boundary_contexts(split, sentences, planner.config.max_sentences)
    with torch.no_grad():
        forced = torch.stack([torch.softmax(planner(context, mask, paths[:, k]) / temperature, -1)
                              for k in range(paths.shape[1])], dim=1)  # (N, K, T, A)
    assert (forced[:, :, 1:] - forced[:, :, :1]).abs().amax() > 0.05  # the prefix moves the later steps
    gap = float((stored - forced).abs().amax())
    assert gap < 2e-3, f"cached step distributions differ from teacher forcing on the sampled prefix by {gap:.4f}"
    # on the fly (float32): the same rule, and each path's draws are from its own distributions
    direct = planner.sample_from(planner.start(context, mask, horizon), 3, temperature,
                                 torch.Generator().manual_seed(1), num_actions)
    paths, stored = direct[0], torch.zeros(*direct[0].shape, num_actions).scatter_(-1, direct[1], direct[2])
    with torch.no_grad():
        forced = torch.stack([torch.softmax(planner(context, mask, paths[:, k]) / temperature, -1)
                              for k in range(paths.shape[1])], dim=1)
    torch.testing.assert_close(stored, forced, atol=1e-5, rtol=1e-4)


def test_with_more_actions_than_it_keeps_each_step_renormalises_its_top_actions(synthetic_cycle, planner_dir,
                                                                                 monkeypatch):
    """8 actions, 3 kept per step: the kept probabilities are the planner's top 3 scaled to sum to 1 (the mass of
    the 5 dropped is spread over them), and the plan vector is sum_a p(a) Emb(a) over those 3."""
    monkeypatch.setattr("planlm.plans.config.TOP_ACTIONS", 3)
    prepared = PreparedDataset(synthetic_cycle)
    split = prepared["validation"]
    sentences = np.arange(12)
    plans = PlanConfig(kind="planner_sampled", horizon=1, planner_dir=str(planner_dir), expectation=True).resolve()
    assert plans.top_actions == 3 < prepared.num_actions
    made = plan_source(plans, prepared, split, sentences=sentences)(sentences)
    assert made.action_probs.shape == (12, 1, 1, 3)
    planner = tiny_planner(prepared, max_sentences=4)
    context, mask = boundary_contexts(split, sentences, planner.config.max_sentences)
    with torch.no_grad():
        top, ids = planner.first_step_logits(context, mask).softmax(-1).topk(3)  # (N, 3) each
    assert float((1 - top.sum(-1)).min()) > 0.05  # the dropped actions held a real share
    assert (made.action_paths[:, 0, 0] == ids).all()
    assert torch.allclose(made.action_probs[:, 0, 0], top / top.sum(-1, keepdim=True), atol=2e-3)  # float16
    assert torch.allclose(made.action_probs.sum(-1), torch.ones(12, 1, 1), atol=1e-6)
    module = adapter(prepared)
    with torch.no_grad():
        expected = module.projection(((top / top.sum(-1, keepdim=True))[..., None]
                                      * module.action_embedding(ids)).sum(1))
        assert torch.allclose(module(*made), expected, atol=2e-3)
