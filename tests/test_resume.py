"""Resume equivalence: a training run interrupted and resumed from ``checkpoints/last.ckpt`` ends with the
weights of the uninterrupted run (train-lm, train-planner, and a killed `planlm run`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers import read_csv, tiny_gpt2_config, tiny_run_config
from planlm.planner import PlannerShape
from planlm.train.lm import ConditioningConfig, LMModelConfig, LMTrainConfig, train_lm
from planlm.train.planner import PlannerTrainArgs, train_planner
from planlm.utils import read_manifest


def assert_same_tensors(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def last_checkpoint_weights(folder: Path) -> dict:
    return torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def logged_train_steps(folder: Path, logs: str = "logs") -> list[list[int]]:
    """The steps with a train/loss row in each CSV log version (one version per process that trained)."""
    versions = sorted((folder / logs).glob("version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[1]))
    return [[int(row["step"]) for row in read_csv(path) if row.get("train/loss")] for path in versions]


def test_train_lm_resumed_after_an_epoch_equals_the_uninterrupted_run(synthetic_random, tmp_path):
    """Dropout on (GPT-2's default 0.1), shuffled windows: the resumed epoch must see the same batches and the same
    dropout masks as the straight run's second epoch."""
    kwargs = dict(model=LMModelConfig(model_config=tiny_gpt2_config()),
                  conditioning=ConditioningConfig(conditioning="oracle", init_no_op=False))

    def train(out: Path, epochs: int) -> Path:
        return train_lm(str(synthetic_random), str(out), **kwargs, train=LMTrainConfig(
            batch_size=4, max_epochs=epochs, limit_train_batches=3, limit_val_batches=1, lr=1e-3,
            progress_bar=False, log_every_n_steps=1))

    straight = train(tmp_path / "straight", 2)
    interrupted = train(tmp_path / "resumed", 1)  # stops after epoch 1, as a run killed during epoch 2 would
    resumed = train(interrupted, 2)
    assert logged_train_steps(resumed) == [[0, 1, 2], [3, 4, 5]]  # resumed at step 3, not retrained
    assert read_manifest(straight)["global_step"] == read_manifest(resumed)["global_step"] == 6
    assert_same_tensors(last_checkpoint_weights(straight), last_checkpoint_weights(resumed))
    for name in ("lm/model.safetensors", "adapter.safetensors"):  # the saved (best) weights
        assert_same_tensors(load_file(str(straight / name)), load_file(str(resumed / name)))


def test_train_planner_resumed_after_an_epoch_equals_the_uninterrupted_run(synthetic_cycle, tmp_path):
    shape = PlannerShape(d_model=16, num_heads=2, dim_feedforward=32, horizon=3, dropout=0.1)

    def train(out: Path, epochs: int) -> Path:
        return train_planner(str(synthetic_cycle), str(out), shape, PlannerTrainArgs(
            batch_size=256, lr=1e-2, max_epochs=epochs, progress_bar=False, log_every_n_steps=1))

    straight = train(tmp_path / "straight", 2)
    resumed = train(train(tmp_path / "resumed", 1), 2)
    steps = logged_train_steps(resumed)
    assert len(steps) == 2 and steps[1][0] == steps[0][-1] + 1  # the second process started where the first stopped
    assert steps[0] + steps[1] == logged_train_steps(straight)[0]
    assert_same_tensors(last_checkpoint_weights(straight), last_checkpoint_weights(resumed))
    assert_same_tensors(load_file(str(straight / "model.safetensors")), load_file(str(resumed / "model.safetensors")))
    assert json.loads((resumed / "summary.json").read_text())["metrics"] == \
        json.loads((straight / "summary.json").read_text())["metrics"]
