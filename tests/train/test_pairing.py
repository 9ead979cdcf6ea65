"""Conditions of one run are paired: the same start weights, the same windows in the same order and the
same dropout stream, whatever adapter each condition builds; only the plans differ."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from planlm.data.artifacts import PreparedDataset
from planlm.models.adapter import AdapterSettings
from planlm.plans.config import PlanConfig
from planlm.stage import write_manifest
from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm
from planlm.train.lm_module import LightningLM

from helpers import tiny_gpt2_config

TINY = tiny_gpt2_config()  # dropout 0.1


def quick(**overrides) -> LMTrainConfig:
    base = dict(batch_size=4, max_epochs=1, limit_train_batches=3, limit_val_batches=1, lr=1e-3,
                log_every_n_steps=1)
    return LMTrainConfig(**{**base, **overrides})


def oracle_plan_cache(folder: Path, prepared_dir: Path) -> Path:
    """A plan cache whose argmax path (T = 1) of every boundary is the true next action: the oracle's plans."""
    prepared = PreparedDataset(prepared_dir)
    folder.mkdir(parents=True)
    for split in ("train", "validation"):
        actions = np.asarray(prepared[split].actions, dtype=np.int64)
        np.save(folder / f"{split}.npy", actions[:, None, None])  # (N, K=1, T=1)
        np.save(folder / f"{split}.argmax.npy", actions[:, None])  # (N, T=1)
    write_manifest(folder, {"oracle": True}, num_paths=1, horizon=1, temperature=0.0, seed=0, planner_hash="oracle",
                   planner_dir=None, codebook_hash=prepared.codebook_hash, num_actions=prepared.num_actions,
                   prepared_dir=str(prepared_dir), splits=["train", "validation"])
    return folder


def test_two_conditions_given_identical_plans_train_to_identical_weights(synthetic_random, tmp_path):
    cache = str(oracle_plan_cache(tmp_path / "plans", synthetic_random))
    routes = {"oracle": PlanConfig(kind="oracle"), "argmax": PlanConfig(kind="planner_argmax", plans_dir=cache)}
    weights = {}
    for name, plans in routes.items():
        out = train_lm(str(synthetic_random), str(tmp_path / name), model=LMModelConfig(model_config=TINY),
                       plans=plans, train=quick())
        weights[name] = {**load_file(str(out / "lm" / "model.safetensors")),
                         **{f"adapter.{k}": v for k, v in load_file(str(out / "adapter.safetensors")).items()}}
    assert weights["oracle"].keys() == weights["argmax"].keys()
    for key, value in weights["oracle"].items():
        assert torch.equal(value, weights["argmax"][key]), key
    first = load_file(str(tmp_path / "oracle" / "adapter.safetensors"))["projection.weight"]
    assert first.abs().sum() > 0  # they did train (the projection starts at zero)


def test_none_and_fixed_see_the_same_windows_in_the_same_order(synthetic_random, tmp_path, monkeypatch):
    seen: dict[str, list] = {}
    run = "none"
    original = LightningLM.training_step

    def recording_step(self, batch, batch_idx):
        seen.setdefault(run, []).append(batch["input_ids"].clone())
        return original(self, batch, batch_idx)

    monkeypatch.setattr(LightningLM, "training_step", recording_step)
    multipath = AdapterSettings(kind="multipath")
    conditions = {"none": (PlanConfig(kind="none"), multipath),
                  "fixed": (PlanConfig(kind="fixed", num_paths=2, horizon=2), multipath),
                  "other_seed": (PlanConfig(kind="none"), multipath)}
    for run, (plans, adapter) in conditions.items():
        train_lm(str(synthetic_random), str(tmp_path / run), model=LMModelConfig(model_config=TINY), plans=plans,
                 adapter=adapter, train=quick(max_epochs=2, limit_train_batches=2, seed=int(run == "other_seed")))
    assert len(seen["none"]) == len(seen["fixed"]) == 4  # 2 batches x 2 epochs
    for ids_none, ids_fixed in zip(seen["none"], seen["fixed"]):
        assert torch.equal(ids_none, ids_fixed)  # the multipath adapter's parameters shift nothing
    assert not all(torch.equal(a, b) for a, b in zip(seen["none"], seen["other_seed"]))  # the seed does
    assert not torch.equal(seen["none"][0], seen["none"][2])  # and each epoch reshuffles


def test_finetuning_from_init_from_trains_in_train_mode(synthetic_random, tmp_path, monkeypatch):
    base = train_lm(str(synthetic_random), str(tmp_path / "base"), model=LMModelConfig(model_config=TINY),
                    train=quick(limit_train_batches=1))
    modes: list[bool] = []
    original = LightningLM.training_step

    def recording_step(self, batch, batch_idx):
        modes.extend(module.training for module in self.model.modules())
        return original(self, batch, batch_idx)

    monkeypatch.setattr(LightningLM, "training_step", recording_step)
    train_lm(str(synthetic_random), str(tmp_path / "next"), model=LMModelConfig(init_from=str(base)),
             plans=PlanConfig(kind="oracle"), train=quick(limit_train_batches=1))
    assert modes and all(modes)  # dropout is on in the LM loaded from the base folder


def test_plan_usage_of_a_model_without_plans_is_skipped_or_a_one_line_error(synthetic_random, tmp_path):
    """(What plan usage measures on a model that reads its plans: test_perplexity's trained oracle model.)"""
    from planlm.errors import PlanlmError
    from planlm.evaluate.perplexity import evaluate

    none = train_lm(str(synthetic_random), str(tmp_path / "none"), model=LMModelConfig(model_config=TINY),
                    train=quick(limit_train_batches=1))
    assert evaluate(str(none), str(synthetic_random), str(tmp_path / "eval-none"),
                    split="validation", stride=64).plan_usage is None  # unset: skipped for none
    with pytest.raises(PlanlmError, match="plan usage.*plans kind none") as error:
        evaluate(str(none), str(synthetic_random), str(tmp_path / "eval-none-2"), split="validation", plan_usage=True)
    assert "\n" not in str(error.value)
