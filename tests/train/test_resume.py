"""Resume equivalence: a training run interrupted and resumed from ``checkpoints/last.ckpt`` ends with the
weights of the uninterrupted run (train-lm, train-planner, and a killed `planlm run`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers import read_csv, tiny_gpt2_config, tiny_run_config
from planlm.models.planner import PlannerSettings
from planlm.plans.config import PlanConfig
from planlm.stage import read_manifest
from planlm.testing.synthetic import make_synthetic_prepared
from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm
from planlm.train.planner import PlannerTrainArgs, train_planner


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
                  plans=PlanConfig(kind="oracle"))

    def train(out: Path, epochs: int) -> Path:
        return train_lm(str(synthetic_random), str(out), **kwargs, train=LMTrainConfig(
            batch_size=4, max_epochs=epochs, limit_train_batches=3, limit_val_batches=1, lr=1e-3, log_every_n_steps=1))

    straight = train(tmp_path / "straight", 2)
    interrupted = train(tmp_path / "resumed", 1)  # stops after epoch 1, as a run killed during epoch 2 would
    resumed = train(interrupted, 2)
    assert logged_train_steps(resumed) == [[0, 1, 2], [3, 4, 5]]  # resumed at step 3, not retrained
    assert read_manifest(straight)["global_step"] == read_manifest(resumed)["global_step"] == 6
    assert_same_tensors(last_checkpoint_weights(straight), last_checkpoint_weights(resumed))
    for name in ("lm/model.safetensors", "adapter.safetensors"):  # the saved (best) weights
        assert_same_tensors(load_file(str(straight / name)), load_file(str(resumed / name)))


def test_train_planner_resumed_after_an_epoch_equals_the_uninterrupted_run(tmp_path):
    prepared = make_synthetic_prepared(tmp_path / "prepared", rule="cycle", seed=6,
                                       num_articles={"train": 40, "validation": 6, "test": 2})
    shape = PlannerSettings(d_model=16, num_heads=2, dim_feedforward=32, horizon=3, dropout=0.1)

    def train(out: Path, epochs: int) -> Path:
        return train_planner(str(prepared), str(out), shape, PlannerTrainArgs(
            batch_size=64, lr=1e-2, max_epochs=epochs, log_every_n_steps=1))

    straight = train(tmp_path / "straight", 2)
    resumed = train(train(tmp_path / "resumed", 1), 2)
    steps = logged_train_steps(resumed)
    assert len(steps) == 2 and steps[1][0] == steps[0][-1] + 1  # the second process started where the first stopped
    assert steps[0] + steps[1] == logged_train_steps(straight)[0]
    assert_same_tensors(last_checkpoint_weights(straight), last_checkpoint_weights(resumed))
    assert_same_tensors(load_file(str(straight / "model.safetensors")), load_file(str(resumed / "model.safetensors")))
    assert json.loads((resumed / "summary.json").read_text())["metrics"] == \
        json.loads((straight / "summary.json").read_text())["metrics"]


class Interrupted(Exception):
    """Raised by ``interrupt_at``: a run stopped in the middle of an epoch."""


def interrupt_at(monkeypatch, module_class, step: int) -> None:
    """Make ``module_class``'s training stop before it trains the batch of global step ``step``."""
    def on_train_batch_start(self, batch, batch_idx):
        if self.global_step == step:
            raise Interrupted

    monkeypatch.setattr(module_class, "on_train_batch_start", on_train_batch_start)


def test_train_lm_resumed_within_an_epoch_equals_the_uninterrupted_run(synthetic_random, tmp_path, monkeypatch):
    """Validation (and so last.ckpt) every 2 of an epoch's 6 batches; the run stops before step 5 and resumes
    from step 4: the rest of epoch 1 must be its last 2 batches, not its first ones again."""
    from planlm.train.lm_module import LightningLM

    kwargs = dict(model=LMModelConfig(model_config=tiny_gpt2_config()),
                  plans=PlanConfig(kind="oracle"))

    def train(out: Path) -> Path:
        return train_lm(str(synthetic_random), str(out), **kwargs, train=LMTrainConfig(
            batch_size=2, max_epochs=2, limit_train_batches=6, val_check_interval=2, limit_val_batches=1,
            lr=1e-3, log_every_n_steps=1))

    straight = train(tmp_path / "straight")
    with monkeypatch.context() as patch:
        interrupt_at(patch, LightningLM, 5)
        with pytest.raises(Interrupted):
            train(tmp_path / "resumed")
    assert torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 4
    resumed = train(tmp_path / "resumed")
    assert logged_train_steps(resumed)[-1] == list(range(4, 12))  # trained on from step 4, twelve steps in all
    assert_same_tensors(last_checkpoint_weights(straight), last_checkpoint_weights(resumed))
    for name in ("lm/model.safetensors", "adapter.safetensors"):  # the saved (best) weights
        assert_same_tensors(load_file(str(straight / name)), load_file(str(resumed / name)))


def test_train_planner_resumed_within_an_epoch_equals_the_uninterrupted_run(tmp_path, monkeypatch):
    """The planner's length-grouped batches, validated every 2 of an epoch's batches, stopped before step 3."""
    from planlm.train.planner_module import LightningPlanner

    prepared = make_synthetic_prepared(tmp_path / "prepared", rule="cycle", seed=6,
                                       num_articles={"train": 40, "validation": 6, "test": 2})
    shape = PlannerSettings(d_model=16, num_heads=2, dim_feedforward=32, horizon=3, dropout=0.1)

    def train(out: Path) -> Path:
        return train_planner(str(prepared), str(out), shape, PlannerTrainArgs(
            batch_size=16, lr=1e-2, max_epochs=2, val_check_interval=2, log_every_n_steps=1))

    straight = train(tmp_path / "straight")
    assert len(logged_train_steps(straight)[0]) >= 8  # several batches per epoch, so step 3 is within epoch 1
    with monkeypatch.context() as patch:
        interrupt_at(patch, LightningPlanner, 3)
        with pytest.raises(Interrupted):
            train(tmp_path / "resumed")
    resumed = train(tmp_path / "resumed")
    assert_same_tensors(last_checkpoint_weights(straight), last_checkpoint_weights(resumed))
    assert_same_tensors(load_file(str(straight / "model.safetensors")), load_file(str(resumed / "model.safetensors")))


def _cli(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planlm.cli", *args], capture_output=True, text=True, **kwargs)


def _kill_config(out: Path) -> dict:
    """Prepare, one oracle LM trained for 8 short epochs (a checkpoint after each), its evaluation."""
    config = tiny_run_config(out, conditions=[{"name": "oracle", "plans": {"kind": "oracle"}}],
                             edit_distance=None, sweeps=[])
    config["lm"]["train"].update(max_steps=-1, max_epochs=8, limit_train_batches=2, log_every_n_steps=1)
    return config


def _wait_for_checkpoint(path: Path, proc: subprocess.Popen, timeout: float = 600) -> dict:
    """The first complete last.ckpt the running process writes (its step and epoch)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if path.is_file():
            try:
                checkpoint = torch.load(path, map_location="cpu", weights_only=True)
                return {"global_step": checkpoint["global_step"], "epoch": checkpoint["epoch"]}
            except Exception:  # still being written
                pass
        time.sleep(0.02)
    raise AssertionError(f"{path} never appeared while the run trained (exit {proc.poll()})")


@pytest.mark.slow
def test_killed_run_resumes_the_interrupted_stage_to_the_uninterrupted_result(tmp_path):
    """Kill `planlm run` while an LM trains, after its first checkpoint; the rerun resumes that LM from
    last.ckpt (not from step 0) and ends with the weights and perplexity of an uninterrupted run."""
    reference, out = tmp_path / "reference", tmp_path / "resumed"
    for folder in (reference, out):
        folder.mkdir()
        (folder / "run.yaml").write_text(yaml.safe_dump(_kill_config(folder)))
    result = _cli(["run", "--config", str(reference / "run.yaml")])  # a process like the resumed one (same threads)
    assert result.returncode == 0, result.stderr[-2000:]
    shutil.copytree(reference / "prepared", out / "prepared")  # reused as is: the LM stage is the one under test

    proc = subprocess.Popen([sys.executable, "-m", "planlm.cli", "run", "--config", str(out / "run.yaml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        saved = _wait_for_checkpoint(out / "lm" / "oracle" / "checkpoints" / "last.ckpt", proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    model = out / "lm" / "oracle"
    assert saved["global_step"] > 0 and not (model / "manifest.json").exists()  # killed inside the LM stage
    assert not (out / "report.md").exists()

    result = _cli(["run", "--config", str(out / "run.yaml")])
    assert result.returncode == 0, result.stderr[-2000:]
    # Lightning's own line goes to the stage's log since the console keeps library output off the screen (issue 35)
    assert "Restored all states from the checkpoint" in (out / "logs" / "train-lm_oracle.txt").read_text()
    # The rerun's first training step is the one after the checkpoint: resumed, not retrained.
    assert logged_train_steps(model)[-1][0] == saved["global_step"]
    assert read_manifest(model)["global_step"] == read_manifest(reference / "lm" / "oracle")["global_step"] == 16
    assert_same_tensors(load_file(str(model / "lm" / "model.safetensors")),
                        load_file(str(reference / "lm" / "oracle" / "lm" / "model.safetensors")))
    assert_same_tensors(load_file(str(model / "adapter.safetensors")),
                        load_file(str(reference / "lm" / "oracle" / "adapter.safetensors")))
    ppl = {folder: json.loads((folder / "eval" / "oracle" / "metrics.json").read_text())["ppl"]
           for folder in (reference, out)}
    assert ppl[out] == ppl[reference]
    rows = {folder: json.loads((folder / "results.json").read_text())["conditions"] for folder in (reference, out)}
    assert [r["ppl"] for r in rows[out]] == [r["ppl"] for r in rows[reference]]


PINNED_ORDER = [4, 1, 2, 8, 5, 0, 7, 9, 6, 3]  # seed 3, epoch 1


def test_the_epoch_order_is_the_seeded_permutation_and_resumes_after_its_trained_batches():
    """``EpochShuffle`` yields (seed, epoch)'s permutation as Python ints, pinned; a resumed epoch skips the batches
    trained before the checkpoint and the next epoch starts whole."""
    from planlm.train.resume import EpochShuffle

    sampler = EpochShuffle(range(10), seed=3, batch_size=4)
    sampler.set_epoch(1)
    order = list(sampler)
    assert order == np.random.default_rng((3, 1)).permutation(10).tolist() == PINNED_ORDER
    assert all(type(index) is int for index in order)
    sampler.skip_batches = 2
    assert list(sampler) == order[8:] and list(sampler) == order

