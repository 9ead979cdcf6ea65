"""The training harness both `train-*` commands share: configurable loggers, the resume stamp, the Trainer."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from planlm.args import Runtime
from planlm.cli import main as cli_main
from planlm.errors import PlanlmError
from planlm.models.planner import PlannerSettings
from planlm.train.args import TrainArgs
from planlm.train.harness import build_trainer, fit, load_best, resume_checkpoint
from planlm.train.loggers import LOGGERS, LoggerSpec, check_loggers
from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm
from planlm.train.planner import PlannerTrainArgs, train_planner

from helpers import tiny_gpt2_config


class TinyRegression(L.LightningModule):
    """A 4 -> 1 linear layer fitted to a fixed target: the smallest module a Trainer can run."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(self.layer(inputs), targets)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        inputs, targets = batch
        self.log("val/loss", torch.nn.functional.mse_loss(self.layer(inputs), targets))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def regression_loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(16, 4, generator=generator)  # (N, 4)
    return DataLoader(TensorDataset(inputs, inputs.sum(-1, keepdim=True)), batch_size=4)


def run_tiny(out: Path, **knobs) -> tuple[L.Trainer, L.pytorch.callbacks.ModelCheckpoint, TinyRegression]:
    knobs = TrainArgs(**{"max_epochs": 2, "devices": 1, "log_every_n_steps": 1,
                         "gradient_clip_val": None, **knobs})
    trainer, best = build_trainer(knobs, Runtime(device="cpu"), out, best_filename="best",
                                  log_folders={"csv": "logs", "tensorboard": "tb"})
    module = TinyRegression()
    fit(trainer, module, regression_loader(), regression_loader(), None)
    return trainer, best, module


def test_default_loggers_write_csv_and_tensorboard_folders(tmp_path):
    trainer, best, module = run_tiny(tmp_path)
    assert (tmp_path / "logs" / "version_0" / "metrics.csv").is_file()
    assert list((tmp_path / "tb" / "version_0").glob("events.out.tfevents.*"))
    assert (tmp_path / "checkpoints" / "best.ckpt").is_file() and (tmp_path / "checkpoints" / "last.ckpt").is_file()
    trained = module.layer.weight.detach().clone()
    with torch.no_grad():
        module.layer.weight.zero_()
    load_best(module, best)  # weights_only=True: the checkpoint holds tensors and plain values only
    assert torch.equal(module.layer.weight, trained)  # val/loss fell every epoch: the best is the last


def test_chosen_loggers_only_and_a_logger_class_path(tmp_path):
    run_tiny(tmp_path / "csv", loggers=["csv"])
    assert (tmp_path / "csv" / "logs" / "version_0" / "metrics.csv").is_file()
    assert not (tmp_path / "csv" / "tb").exists()
    run_tiny(tmp_path / "path", loggers=["lightning.pytorch.loggers.CSVLogger"])  # given save_dir = the stage folder
    assert list((tmp_path / "path").glob("lightning_logs/version_0/metrics.csv"))


def test_unknown_or_missing_loggers_give_one_line_errors(monkeypatch):
    for make in (lambda loggers: LMTrainConfig(loggers=loggers), lambda loggers: PlannerTrainArgs(loggers=loggers)):
        with pytest.raises(PlanlmError, match=r"--train.loggers: unknown logger 'nope'; choose from csv") as error:
            make(["csv", "nope"])
        assert "\n" not in str(error.value)
    monkeypatch.setitem(LOGGERS, "fancy", LoggerSpec("fancy_logger.FancyLogger", ("fancy_logger",), "fancy-logger"))
    with pytest.raises(PlanlmError, match=r"logger 'fancy' needs the fancy-logger package; `pip install fancy-logger`"):
        LMTrainConfig(loggers=["fancy"])
    with pytest.raises(PlanlmError, match="cannot import logger class 'nowhere.Logger'"):
        check_loggers(["nowhere.Logger"], "--train.loggers")
    with pytest.raises(PlanlmError, match="is not a lightning.pytorch.loggers.Logger class"):
        check_loggers(["torch.nn.Linear"], "--train.loggers")


def test_cli_reports_an_unknown_logger_in_one_line(synthetic_cycle, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["train-planner", "--prepared_dir", str(synthetic_cycle), "--out_dir", str(tmp_path / "p"),
                  "--train.loggers", "[csv, nope]"])
    assert exit_info.value.code == 2
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert last_line.startswith("planlm: error:") and "unknown logger 'nope'" in last_line
    assert not (tmp_path / "p").exists()


def test_loggers_stay_out_of_the_reuse_keys(synthetic_cycle, synthetic_random, tmp_path):
    """Changing only the loggers reuses a finished folder, as changing the progress bar does."""
    shape = PlannerSettings(d_model=16, num_heads=2, dim_feedforward=32, horizon=2)
    args = dict(batch_size=128, max_epochs=1)
    planner = train_planner(str(synthetic_cycle), str(tmp_path / "planner"), shape, PlannerTrainArgs(**args))
    assert list((planner / "logs").glob("version_*/events.out.tfevents.*"))  # tensorboard shares logs/ with csv
    manifest = (planner / "manifest.json").read_text()
    train_planner(str(synthetic_cycle), str(planner), shape, PlannerTrainArgs(**args, loggers=["csv"]))
    assert (planner / "manifest.json").read_text() == manifest
    lm_args = dict(batch_size=4, max_epochs=1, limit_train_batches=1, limit_val_batches=1)
    model = LMModelConfig(model_config=tiny_gpt2_config())
    lm = train_lm(str(synthetic_random), str(tmp_path / "lm"), model=model, train=LMTrainConfig(**lm_args, loggers=["csv"]))
    assert (lm / "logs" / "version_0" / "metrics.csv").is_file() and not (lm / "tb").exists()
    manifest = (lm / "manifest.json").read_text()
    train_lm(str(synthetic_random), str(lm), model=model, train=LMTrainConfig(**lm_args))
    assert (lm / "manifest.json").read_text() == manifest


def test_resume_only_under_a_stamp_of_the_same_config(tmp_path):
    config = {"model": 1, "train": {"lr": 0.1, "max_epochs": 1}}
    last = tmp_path / "checkpoints" / "last.ckpt"

    def checkpoint():
        last.parent.mkdir(exist_ok=True)
        torch.save({"state_dict": {}}, last)

    assert resume_checkpoint(tmp_path, "stamp.json", config) is None  # no stamp: nothing to resume
    checkpoint()
    longer = {**config, "train": {"lr": 0.1, "max_epochs": 3}}
    assert resume_checkpoint(tmp_path, "stamp.json", longer) == str(last)  # only longer: resume
    assert resume_checkpoint(tmp_path, "stamp.json", longer, resume=False) is None and not last.exists()
    checkpoint()
    assert resume_checkpoint(tmp_path, "stamp.json", {**config, "train": {"lr": 0.2, "max_epochs": 1}}) is None
    assert not last.exists()  # another config: its checkpoints are deleted, never resumed
    stamp = json.loads((tmp_path / "stamp.json").read_text())
    assert stamp["config"]["train"] == {"lr": 0.2}
    checkpoint()
    assert resume_checkpoint(tmp_path, "stamp.json", {**config, "train": {"lr": 0.2, "max_epochs": 5}}) == str(last)
    # checkpoints stamped by a planlm of another format (or the bare fingerprint of an older one): never resumed
    for older in ({**stamp, "format_version": 1}, {k: v for k, v in stamp.items() if k != "format_version"}):
        (tmp_path / "stamp.json").write_text(json.dumps(older))
        checkpoint()
        assert resume_checkpoint(tmp_path, "stamp.json", {**config, "train": {"lr": 0.2, "max_epochs": 5}}) is None
        assert not last.exists()
    (tmp_path / "stamp.json").write_text(stamp["config_fingerprint"] + "\n")
    checkpoint()
    assert resume_checkpoint(tmp_path, "stamp.json", {**config, "train": {"lr": 0.2, "max_epochs": 5}}) is None
    checkpoint()
    assert resume_checkpoint(tmp_path, "stamp.json", {**config, "train": {"lr": 0.2, "max_epochs": 5}}) == str(last)
    # A stage folder that starts again as a whole under another config (train-planner): not without a stamp.
    (tmp_path / "logs").mkdir()
    assert resume_checkpoint(tmp_path, "stamp.json", {**config, "train": {"lr": 0.3}}, reset=tmp_path) is None
    assert not (tmp_path / "logs").exists() and (tmp_path / "stamp.json").is_file()
    (tmp_path / "stamp.json").unlink()
    (tmp_path / "logs").mkdir()
    resume_checkpoint(tmp_path, "stamp.json", config, reset=tmp_path)
    assert (tmp_path / "logs").is_dir()
