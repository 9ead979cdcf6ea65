"""Joint training of the planner with the LM (``train.joint``): the LM's loss reaches the planner, the plans of an
unchanged planner are the frozen plans in expectation, the straight-through estimator, the planner saved beside the
LM and run by its evaluation, the reuse keys of the runs without it, and bad input."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import tiny_gpt2_config, tiny_planned_lm, tiny_planner, tiny_run_config
from planlm.args import Runtime
from planlm.cli import main
from planlm.data.artifacts import PreparedDataset
from planlm.data.windows import article_windows, collate_windows
from planlm.errors import PlanlmError
from planlm.files import file_sha256
from planlm.models.planned_lm import PlannedLM
from planlm.models.planner import Planner
from planlm.plans.config import PlanConfig, check_joint_plans, trained_plans
from planlm.plans.contexts import Boundaries, ContextSource, boundary_contexts
from planlm.plans.registry import plan_kind, plan_source
from planlm.stage import read_manifest
from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm
from planlm.train.lm_module import LightningJointLM, LightningLM

TINY = json.dumps(tiny_gpt2_config(n_positions=32))


def joint_config(kind: str = "planner_sampled", **overrides) -> PlanConfig:
    """A joint run's plans: in expectation unless set (train-lm's default when the planner trains with the LM)."""
    values = dict(kind=kind, num_paths=2, horizon=3, temperature=0.7, planner_dir="planner", expectation=True)
    plans = PlanConfig(**{**values, **overrides}).resolve()
    check_joint_plans(plans)
    return plans


def planned_lm(prepared: PreparedDataset, adapter: str):
    """A tiny planned LM whose plan vectors move its logits (multipath: both ReZero gates open)."""
    model = tiny_planned_lm(prepared, adapter=adapter)
    if adapter == "multipath":
        with torch.no_grad():
            model.adapter.alpha_path.fill_(1.0)
            model.adapter.alpha_sample.fill_(1.0)
    return model


def window_batch(prepared: PreparedDataset, source, num_windows: int = 4) -> dict:
    split = prepared["validation"]
    return collate_windows(split, article_windows(split, 32, 31)[:num_windows], source)


def contexts_of(prepared: PreparedDataset, planner: Planner, plans: PlanConfig) -> ContextSource:
    return ContextSource(prepared["validation"], planner.config.max_sentences, planner.config.horizon,
                         plans.num_paths, plans.horizon)


def boundaries(prepared: PreparedDataset, planner: Planner, num: int = 12) -> Boundaries:
    context, mask = boundary_contexts(prepared["validation"], np.arange(num), planner.config.max_sentences)
    return Boundaries(num, prepared.num_actions, context, mask)


@pytest.mark.parametrize("kind, expectation, adapter", [("planner_sampled", True, "multipath"),
                                                        ("planner_sampled", False, "project_avg"),
                                                        ("planner_argmax", True, "project_avg")])
def test_the_lm_loss_reaches_the_planner(synthetic_cycle, kind, expectation, adapter):
    """The LM's loss alone (action loss weight 0) gives the planner a gradient, in expectation and
    straight-through; the planner's own action loss, added at its weight, changes it."""
    prepared = PreparedDataset(synthetic_cycle)
    planner = tiny_planner(prepared, max_sentences=4)
    plans = joint_config(kind, expectation=expectation)
    module = LightningJointLM(planned_lm(prepared, adapter), planner, plans, action_loss_weight=0.0).train()
    assert not planner.training  # no dropout in the planner
    batch, inputs = module.with_plans(window_batch(prepared, contexts_of(prepared, planner, plans)), "test")
    assert batch["action_probs"].requires_grad and "context_embeds" not in batch
    loss, _ = module.model_step(batch)
    loss.backward()
    for name in ("prediction.classifier.weight", "representation.projection.weight"):
        grad = dict(planner.named_parameters())[name].grad
        assert grad is not None and float(grad.abs().sum()) > 0, name
    planner.zero_grad()
    module.action_loss(inputs).backward()  # the planner's own loss reaches g too (its trained horizon)
    assert float(planner.dynamics.action_embedding.weight.grad.abs().sum()) > 0


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")  # the step, called without a Trainer
def test_a_joint_training_step_adds_the_planner_s_action_loss_at_its_weight(synthetic_cycle):
    """--train.planner_loss_weight 0.5: the step's loss is the LM's loss on the planner's plans plus 0.5 times the
    planner's action loss on the same boundaries (weight 0: the LM's loss alone)."""
    prepared = PreparedDataset(synthetic_cycle)
    planner = tiny_planner(prepared, max_sentences=4)
    plans = joint_config()
    module = LightningJointLM(planned_lm(prepared, "project_avg"), planner, plans, action_loss_weight=0.5).eval()
    raw = window_batch(prepared, contexts_of(prepared, planner, plans))
    with torch.no_grad():
        batch, inputs = module.with_plans(raw, "train/0/0")  # the stream of the first step of epoch 0
        lm_loss, action = float(module.model_step(batch)[0]), float(module.action_loss(inputs))
        assert action > 0.1
        assert float(module.training_step(raw, 0)) == pytest.approx(lm_loss + 0.5 * action, rel=1e-5)
        without = LightningJointLM(module.model, planner, plans, action_loss_weight=0.0).eval()
        assert float(without.training_step(raw, 0)) == pytest.approx(lm_loss, rel=1e-5)


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
@pytest.mark.parametrize("kind", ["planner_sampled", "planner_argmax"])
def test_joint_plans_of_an_unchanged_planner_are_the_plans_in_expectation(synthetic_cycle, kind, dynamics):
    """T = 3: the same draws, and each step's distribution given the path's sampled prefix, as the frozen plans in
    expectation hold them (to float16, the plans' precision), now with the planner's gradient."""
    prepared = PreparedDataset(synthetic_cycle)
    planner = tiny_planner(prepared, max_sentences=4, dynamics=dynamics)
    plans = joint_config(kind)
    made_by = plan_kind(plans.kind)
    frozen = made_by.draw(boundaries(prepared, planner), plans, torch.Generator().manual_seed(3),
                          planner).plans(plans.num_paths)
    joint = made_by.joint_plans(boundaries(prepared, planner), plans, torch.Generator().manual_seed(3), planner)
    assert torch.equal(joint.action_paths, frozen.action_paths) and torch.equal(joint.path_mask, frozen.path_mask)
    torch.testing.assert_close(joint.action_probs, frozen.action_probs, atol=1e-3, rtol=0)
    assert joint.action_probs.requires_grad and not frozen.action_probs.requires_grad
    adapter = planned_lm(prepared, "multipath").adapter
    torch.testing.assert_close(adapter(*joint), adapter(*frozen), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["planner_sampled", "planner_argmax"])
def test_straight_through_is_the_sampled_plan_forward_and_the_expectation_backward(synthetic_cycle, kind):
    prepared = PreparedDataset(synthetic_cycle)
    planner = tiny_planner(prepared, max_sentences=4)
    plans = joint_config(kind, expectation=False)
    made_by, adapter = plan_kind(plans.kind), planned_lm(prepared, "project_avg").adapter
    sampled = made_by.draw(boundaries(prepared, planner), plans, torch.Generator().manual_seed(3),
                           planner).plans(plans.num_paths)
    straight = made_by.joint_plans(boundaries(prepared, planner), plans, torch.Generator().manual_seed(3), planner)
    torch.testing.assert_close(adapter(*straight), adapter(*sampled), atol=1e-6, rtol=0)  # the drawn actions
    weights = torch.randn(len(sampled.action_paths), adapter.config.hidden_size)

    def planner_gradient(made) -> torch.Tensor:  # of a loss linear in the plan vectors
        planner.zero_grad()
        (adapter(*made) * weights).sum().backward()
        return planner.prediction.classifier.weight.grad.clone()

    expected = made_by.joint_plans(boundaries(prepared, planner), replace(plans, expectation=True),
                                   torch.Generator().manual_seed(3), planner)
    torch.testing.assert_close(planner_gradient(straight), planner_gradient(expected), atol=1e-6, rtol=1e-5)


def test_the_joint_forward_is_the_frozen_expectation_mode_at_t1(synthetic_cycle, tmp_path):
    """T = 1, K = 2: the LM's loss on the plans the joint step makes equals its loss on the frozen plans in
    expectation from the same planner (read from its folder, the split's walk), whatever was drawn."""
    prepared = PreparedDataset(synthetic_cycle)
    tiny_planner(prepared, max_sentences=4).save_pretrained(tmp_path / "planner")
    plans = PlanConfig(kind="planner_sampled", num_paths=2, horizon=1, planner_dir=str(tmp_path / "planner"),
                       expectation=True).resolve()
    model = planned_lm(prepared, "multipath")
    frozen_batch = window_batch(prepared, plan_source(plans, prepared, prepared["validation"]))
    planner = Planner.for_corpus(plans.planner_dir, prepared)
    module = LightningJointLM(model, planner, plans)
    joint_batch, _ = module.with_plans(window_batch(prepared, contexts_of(prepared, planner, plans)), "validation/0")
    with torch.no_grad():
        joint_loss, _ = module.model_step(joint_batch)
        frozen_loss, _ = LightningLM(model).model_step(frozen_batch)
    assert float(joint_loss) == pytest.approx(float(frozen_loss), rel=1e-6, abs=1e-6)


def train_args(prepared_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["train-lm", "--prepared_dir", str(prepared_dir), "--out_dir", str(out), "--model.model_config", TINY,
            "--plans.kind", "planner_sampled", "--plans.num_paths", "2", "--plans.horizon", "2",
            "--train.max_steps", "3", "--train.batch_size", "8",
            "--train.context_length", "32", "--train.stride", "31", "--train.limit_val_batches", "1",
            "--train.lr", "0.003", *extra]


def test_joint_training_moves_the_planner_that_its_evaluation_runs(synthetic_cycle, tmp_path):
    """Through the CLI: the LM's loss alone (--train.planner_loss_weight 0) moves the planner, which is saved in the
    model folder and run by its evaluation; without --train.joint the planner folder stays bit-identical and the
    model names it. A second identical run is reused."""
    prepared = PreparedDataset(synthetic_cycle)
    tiny_planner(prepared, max_sentences=4).save_pretrained(tmp_path / "planner")
    weights = tmp_path / "planner" / "model.safetensors"
    before = file_sha256(weights)
    plans = ["--plans.planner_dir", str(tmp_path / "planner")]
    joint = train_args(synthetic_cycle, tmp_path / "joint", *plans, "--train.joint", "true",
                       "--train.planner_loss_weight", "0")
    main(joint)
    own = tmp_path / "joint" / "planner"
    trained, start = Planner.from_pretrained(own), Planner.from_pretrained(tmp_path / "planner")
    moved = max(float((a - b).abs().max()) for a, b in zip(trained.state_dict().values(), start.state_dict().values()))
    assert moved > 1e-4 and file_sha256(weights) == before
    model = PlannedLM.from_pretrained(tmp_path / "joint")
    assert trained_plans(model).planner_dir == str(own) and model.config.plans["expectation"]
    manifest = read_manifest(tmp_path / "joint")
    assert manifest["config"]["train"]["joint"]
    assert manifest["joint_planner"] == "planner" and "planner/model.safetensors" in manifest["files"]
    main(joint)  # reused: nothing retrained
    assert read_manifest(tmp_path / "joint") == manifest
    main(["evaluate", "--model_dir", str(tmp_path / "joint"), "--prepared_dir", str(synthetic_cycle), "--out_dir",
          str(tmp_path / "eval"), "--max_articles", "2", "--context_length", "32", "--bootstrap_samples", "20",
          "--runtime.device", "cpu"])
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["planner_dir"] == str(own) and metrics["expectation"]

    main(train_args(synthetic_cycle, tmp_path / "frozen", *plans, "--plans.expectation", "true"))
    assert file_sha256(weights) == before and not (tmp_path / "frozen" / "planner").exists()
    frozen = PlannedLM.from_pretrained(tmp_path / "frozen")
    assert Path(trained_plans(frozen).planner_dir) == tmp_path / "planner" and not read_manifest(
        tmp_path / "frozen")["config"]["train"]["joint"]


def test_runs_without_joint_keep_their_reuse_keys():
    """The planner's training knobs are in the LM's key at their defaults too; a model's plans record no joint
    training, so an evaluation inherits a joint model's expectation, not its joint training."""
    key = LMTrainConfig().reuse_key(Runtime())
    assert key["planner_lr"] is None and key["planner_loss_weight"] == 1.0
    assert LMTrainConfig(planner_lr=1e-4).reuse_key(Runtime())["planner_lr"] == 1e-4
    trained = joint_config()
    assert "joint" not in trained.cache_key() and trained.expectation
    straight = joint_config(expectation=False)
    evaluation = PlanConfig(num_paths=3).resolve(trained)
    assert evaluation.expectation and PlanConfig().resolve(straight).expectation is False


@pytest.mark.parametrize("plans, message", [
    (dict(kind="fixed"), "--train.joint true with --plans.kind fixed: fixed plans have no planner"),
    (dict(kind="oracle"), "--train.joint true with --plans.kind oracle"),
    (dict(), "--train.joint true with --plans.kind none"),
    (dict(kind="planner_sampled", plans_dir="cache"), "drop --plans.plans_dir"),
    (dict(kind="planner_sampled", planner_dir="p", temperature=0.0), "carries no gradient"),
    (dict(kind="planner_sampled", planner_dir="p", path_policy={"kind": "entropy"}), "drop --plans.path_policy"),
])
def test_bad_joint_settings_are_one_line_errors(plans, message):
    with pytest.raises(PlanlmError, match=message) as error:
        check_joint_plans(PlanConfig(**plans).resolve())
    assert "\n" not in str(error.value)


def test_joint_runs_without_a_fitting_planner_stop_before_training(synthetic_cycle, tmp_path, capsys):
    prepared = PreparedDataset(synthetic_cycle)
    model, quick = LMModelConfig(model_config=tiny_gpt2_config()), LMTrainConfig(max_steps=1)

    def refused(out: str, message: str, plans: PlanConfig, train: LMTrainConfig = quick) -> None:
        with pytest.raises(PlanlmError, match=message) as error:
            train_lm(str(synthetic_cycle), str(tmp_path / out), model=model, plans=plans, train=train)
        assert "\n" not in str(error.value) and not (tmp_path / out / "checkpoints").exists()

    joint = replace(quick, joint=True)
    refused("m1", "--train.joint true needs --plans.planner_dir", PlanConfig(kind="planner_sampled"), joint)
    refused("m2", "--train.planner_lr trains the planner with the LM", PlanConfig(kind="oracle"),
            LMTrainConfig(planner_lr=1e-4))
    for name, info, message in (("codebook", {"codebook_hash": "0" * 64}, "trained with codebook 000000000000"),
                                ("encoder", {"encoder": "another-encoder"}, "embedded by 'another-encoder'")):
        planner = tiny_planner(prepared, max_sentences=4)
        planner.prepared_info = {**planner.prepared_info, **info}
        planner.save_pretrained(tmp_path / name)
        refused(f"m-{name}", message, PlanConfig(kind="planner_argmax", planner_dir=str(tmp_path / name)), joint)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(train_args(synthetic_cycle, tmp_path / "cli", "--plans.kind", "fixed", "--train.joint", "true"))
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "--train.joint true with --plans.kind fixed" in err and "\n" not in err


def test_the_joint_overlay_on_the_demo_validates(tmp_path, capsys):
    """configs/demo-joint.yaml: the five conditions, the joint ones with the planner of their frozen twin."""
    root = Path(__file__).resolve().parents[2]
    overlay = root / "configs" / "demo-joint.yaml"
    assert overlay.read_text().startswith("# Overlay on configs/demo.yaml")
    main(["run", "--config", str(root / "configs" / "demo.yaml"), "--config", str(overlay), "--out_dir",
          str(tmp_path / "run"), "--dry_run", "true"])
    out = capsys.readouterr().out
    assert "config valid" in out and "train-planner cornille " in out and "train-planner cornille_joint" not in out
    for name in ("ours_expected", "ours_joint", "ours_joint_st", "cornille", "cornille_joint"):
        assert f"train-lm {name} seed1" in out


@pytest.mark.slow
def test_planlm_run_trains_and_evaluates_joint_conditions(tmp_path):
    """`planlm run` end to end on tiny stages: Cornille et al.'s setting joint (its own T = 1 planner) and ours
    joint straight-through, each evaluated with the planner it trained."""
    from planlm.pipeline.run import run

    out = tmp_path / "run"
    config = tiny_run_config(out, edit_distance=None, sweeps=[], report={}, conditions=[
        {"name": "cornille_joint", "planner": {"model": {"horizon": 1}}, "train": {"joint": True},
         "plans": {"kind": "planner_argmax", "num_paths": 1, "horizon": 1}},
        {"name": "ours_joint_st", "adapter": {"kind": "multipath"}, "train": {"joint": True},
         "plans": {"kind": "planner_sampled", "num_paths": 3, "horizon": 3, "expectation": False}}])
    run(**config)
    for name, planner in (("cornille_joint", out / "planners" / "cornille_joint"), ("ours_joint_st", out / "planner")):
        metrics = json.loads((out / "eval" / name / "metrics.json").read_text())
        assert metrics["planner_dir"] == str(out / "lm" / name / "planner") and np.isfinite(metrics["ppl"])
        assert file_sha256(out / "lm" / name / "planner" / "model.safetensors") != \
            file_sha256(planner / "model.safetensors")
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["conditions"]}
    assert all(row["status"] == "done" for row in rows.values())
