"""Plan kinds in one registry: a kind added from outside the package runs through train-lm,
evaluate and generate; every built-in kind's plans for a batch (``plan``) agree with its source for a split; K has
one owner; ``sample-plans`` takes the ``plans`` group; the run reads a kind's flags, not its name."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.evaluate.generate import generate
from planlm.evaluate.generator import SamplingConfig
from planlm.evaluate.perplexity import evaluate
from planlm.models.planned_lm import PlannedLM
from planlm.plans.config import PlanConfig, evaluation_plans
from planlm.plans.contexts import Boundaries, boundary_contexts
from planlm.plans.kinds import PlanKind
from planlm.plans.registry import KINDS, make_plans, plan_source, register_plan_kind
from planlm.plans.sampling import sample_plans
from planlm.plans.sources import Plans
from planlm.stage import write_manifest
from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm

from helpers import tiny_gpt2_config, tiny_planner, tiny_run_config


class UniformPlans(PlanKind):
    """A toy kind: every step of every path an action drawn uniformly (the plan kind's own random generator)."""

    name = "uniform"

    def plan(self, boundaries: Boundaries, plans: PlanConfig, rng, planner=None) -> Plans:
        shape = (len(boundaries), plans.num_paths, plans.horizon)
        paths = torch.randint(boundaries.num_actions, shape, generator=rng)  # (B, K, T)
        return Plans(paths, torch.ones(shape, dtype=torch.bool))


@pytest.fixture
def uniform():
    with pytest.raises(PlanlmError, match="--plans.kind 'uniform': choose one of none, fixed, oracle"):
        PlanConfig(kind="uniform")
    register_plan_kind(UniformPlans())
    yield
    KINDS.pop("uniform")


def test_a_kind_registered_outside_the_package_runs_through_train_evaluate_and_generate(uniform, synthetic_cycle,
                                                                                        tmp_path):
    prepared = PreparedDataset(synthetic_cycle)
    plans = PlanConfig(kind="uniform", num_paths=2, horizon=2, seed=3)
    assert plans.kind == "uniform" and plans.resolve().has_plans and not plans.resolve().plan_kind.uses_planner
    source = plan_source(plans.resolve(), prepared, prepared["validation"])
    paths, mask, _ = source(np.arange(5))
    assert paths.shape == (5, 2, 2) and mask.all() and 0 <= paths.min() and paths.max() < prepared.num_actions
    assert torch.equal(source(np.arange(5))[0], paths)  # made once: every read gives the same plans
    train = LMTrainConfig(batch_size=4, max_epochs=1, limit_train_batches=2, limit_val_batches=1, log_every_n_steps=1)
    model_dir = train_lm(str(synthetic_cycle), str(tmp_path / "lm"), LMModelConfig(model_config=tiny_gpt2_config()),
                         plans=plans, train=train)
    assert json.loads((model_dir / "planned_lm.json").read_text())["plans"]["kind"] == "uniform"
    assert PlannedLM.from_pretrained(model_dir).adapter is not None
    metrics = evaluate(str(model_dir), str(synthetic_cycle), str(tmp_path / "eval"), max_articles=3,
                       bootstrap_samples=10, runtime=Runtime(device="cpu"))
    assert metrics.conditioning == "uniform" and np.isfinite(metrics.ppl) and metrics.plan_usage is not None
    assert metrics.paths.paths_mean == 0  # no planner ran
    result = generate(str(model_dir), str(synthetic_cycle), prompt="Red water red. Water",
                      sampling=SamplingConfig(max_new_tokens=12), runtime=Runtime(device="cpu"))
    plans_made = [np.asarray(s["plan"]["action_paths"]) for s in result["sentences"] if s["plan"]]
    assert plans_made and all(p.shape == (2, 2) and p.max() < prepared.num_actions for p in plans_made)


@pytest.mark.parametrize("kind", ["fixed", "oracle", "planner_argmax"])
def test_the_plans_of_a_batch_are_those_of_the_split_source(synthetic_cycle, tmp_path, kind):
    """One PlanKind per kind: ``plan`` on a batch of boundaries (as generation calls it) and the kind's source for
    the split (as training and evaluation read it) give the same plans (deterministic kinds)."""
    prepared = PreparedDataset(synthetic_cycle)
    split = prepared["validation"]
    planner = tiny_planner(prepared, max_sentences=4)
    planner.save_pretrained(tmp_path / "planner")
    plans = PlanConfig(kind=kind, num_paths=2, horizon=3, planner_dir=str(tmp_path / "planner")).resolve()
    sentences = np.array([0, 3, 7, 12])
    context = boundary_contexts(split, sentences, planner.config.max_sentences)
    boundaries = Boundaries(len(sentences), prepared.num_actions, *context, split=split, sentences=sentences)
    made = make_plans(boundaries, plans, torch.Generator().manual_seed(0), planner)
    read = plan_source(plans, prepared, split, sentences=sentences)(sentences)
    assert torch.equal(made.action_paths, read.action_paths) and torch.equal(made.path_mask, read.path_mask)


def test_a_plan_cache_owns_its_k(synthetic_cycle, tmp_path):
    """An evaluation reading a cache of sampled plans takes the cache's K (a model trained with another K); asking
    for a K the cache does not hold is a one-line error."""
    prepared = PreparedDataset(synthetic_cycle)
    folder = tmp_path / "cache"
    folder.mkdir()
    saved = {"kind": "fixed", "min_paths": 1, "max_paths": 4, "entropy_high": None}  # all, by its former name
    write_manifest(folder, {"test": True}, num_paths=4, horizon=3, codebook_hash=prepared.codebook_hash,
                   num_actions=prepared.num_actions, path_policy=saved)
    trained = PlanConfig(kind="planner_sampled", num_paths=2, horizon=3, planner_dir="planner").resolve()
    model = SimpleNamespace(config=SimpleNamespace(plans=trained, num_actions=prepared.num_actions),
                            adapter=SimpleNamespace(config=SimpleNamespace(horizon=3)))
    plans = evaluation_plans(PlanConfig(plans_dir=str(folder)), model, "model")
    assert (plans.num_paths, plans.path_policy.max_paths, plans.planner_dir) == (4, 4, None)
    assert plans.path_policy.kind == "all"
    with pytest.raises(PlanlmError, match="holds K=4 paths, not --plans.num_paths 2") as error:
        evaluation_plans(PlanConfig(plans_dir=str(folder), num_paths=2), model, "model")
    assert "\n" not in str(error.value)
    argmax = evaluation_plans(PlanConfig(kind="planner_argmax", plans_dir=str(folder)), model, "model")
    assert argmax.num_paths == 2  # the argmax path is repeated K times, whatever the cache's K


def test_sample_plans_takes_the_plans_group(synthetic_cycle, tmp_path, capsys):
    from planlm.cli import main

    folder = tiny_planner(PreparedDataset(synthetic_cycle), max_sentences=4).save_pretrained(tmp_path / "planner")
    with pytest.raises(SystemExit):
        main(["sample-plans", "--planner_dir", str(folder), "--prepared_dir", str(synthetic_cycle)])
    err = capsys.readouterr().err.strip()
    assert "--planner_dir is --plans.planner_dir" in err and len(err.splitlines()) == 1
    with pytest.raises(PlanlmError, match="--plans.kind oracle draws nothing from a planner"):
        sample_plans(str(synthetic_cycle), PlanConfig(kind="oracle", planner_dir=str(folder)), splits=["validation"])
    # planner_argmax: the greedy path, every one of the K paths at tau 0, keyed as such
    out = sample_plans(str(synthetic_cycle), PlanConfig(kind="planner_argmax", planner_dir=str(folder), num_paths=2),
                       splits=["validation"], runtime=Runtime(device="cpu"))
    assert out.name == "K2-T3-tau0-seed0"
    paths, greedy = np.load(out / "validation.npy"), np.load(out / "validation.argmax.npy")
    assert (paths == greedy[:, None]).all()


class PlannerFree(UniformPlans):
    """A toy kind named like the planner kinds that needs no planner."""

    name = "planner_free"


class Guess(UniformPlans):
    """A toy kind whose plans a planner would make (its flag), named unlike the planner kinds."""

    name = "guess"
    uses_planner = True


def test_the_run_gives_a_planner_to_the_kinds_that_use_one_whatever_their_names(tmp_path):
    from planlm.pipeline.run import plan_stages

    for kind in (PlannerFree(), Guess()):
        register_plan_kind(kind)
    try:
        config = tiny_run_config(tmp_path, conditions=[{"name": "free", "plans": {"kind": "planner_free"}},
                                                       {"name": "guess", "plans": {"kind": "guess"}}])
        stages = plan_stages(tmp_path, config["prepare"], config["planner"], config["lm"], None,
                             config["conditions"], config["evaluate"], None, [], where="test")
    finally:
        KINDS.pop("planner_free"), KINDS.pop("guess")
    plans = {s.condition: s.kwargs["plans"] for s in stages if s.command == "train_lm"}
    assert plans["guess"].planner_dir and plans["free"].planner_dir is None
    assert [s.name for s in stages if s.command == "train_planner"] == ["train-planner"]
