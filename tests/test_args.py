"""The settings groups that commands share (issue 31): one runtime group, one precision vocabulary, one trainer
group, the sampling group of generate and edit-distance, and old keys and values still read with a one-line note."""

from __future__ import annotations

import functools
import inspect
import warnings
from dataclasses import fields

import pytest
import yaml

from planlm.args import PRECISIONS, Runtime, arithmetic, lightning_precision, read_precision, read_renamed
from planlm.commands import COMMANDS, load_command
from planlm.errors import PlanlmError, PlanlmWarning
from planlm.evaluate.perplexity import evaluate
from planlm.evaluate.edit_distance import edit_distance
from planlm.evaluate.generator import SamplingConfig
from planlm.pipeline.sections import bind_section
from planlm.train.args import TrainArgs
from planlm.jsonio import fingerprint
from planlm.train.lm import LMTrainConfig, train_lm
from planlm.train.planner import PlannerTrainArgs


@pytest.mark.parametrize("old, new", [("bf16-mixed", "bf16"), ("32-true", "fp32"), (None, "auto")])
def test_lightnings_precisions_are_read_as_planlms_with_a_note(old, new):
    with pytest.warns(PlanlmWarning, match=f"--runtime.precision {old or 'null'} is read as {new}"):
        assert Runtime(precision=old).precision == new


def test_an_unknown_precision_is_one_line_naming_the_vocabulary():
    with pytest.raises(PlanlmError, match="--precision 'fp16': choose auto, native, fp32, bf16") as error:
        read_precision("fp16", "--precision")
    assert "\n" not in str(error.value)
    assert [read_precision(p, "--precision") for p in PRECISIONS] == list(PRECISIONS)


@pytest.mark.parametrize("native", [False, True])
def test_every_precision_names_one_arithmetic_per_device(monkeypatch, native):
    monkeypatch.setattr("planlm.device.cpu_supports_bf16", lambda: native)
    assert [arithmetic(p, "cuda") for p in PRECISIONS] == ["bf16", "bf16", "fp32", "bf16"]
    assert [arithmetic(p, "cpu") for p in PRECISIONS] == ["fp32", "bf16" if native else "fp32", "fp32", "bf16"]
    assert lightning_precision("fp32", "cuda") == "32-true" and lightning_precision("auto", "cuda") == "bf16-mixed"


def test_both_trainings_share_one_trainer_group_and_keep_their_recipes():
    shared = {knob.name for knob in fields(TrainArgs)}
    assert shared <= {knob.name for knob in fields(LMTrainConfig)} & {knob.name for knob in fields(PlannerTrainArgs)}
    assert (LMTrainConfig().batch_size, PlannerTrainArgs().batch_size) == (32, 512)
    assert (LMTrainConfig().gradient_clip_val, PlannerTrainArgs().gradient_clip_val) == (1.0, None)


def test_reuse_keys_keep_their_shape_from_before_the_shared_groups():
    """A finished stage is reused after issue 31: the runtime's accelerator and precision are keyed where and as the
    trainer group keyed them (Lightning's spelling), and a knob a command gained with the shared group stays out of
    its key until it is set. The fingerprints are those of the keys before the runtime group (commit 3d2ffbc)."""
    runtime = Runtime()
    assert LMTrainConfig().reuse_key(runtime)["precision"] is None
    assert LMTrainConfig().reuse_key(Runtime(precision="bf16"))["precision"] == "bf16-mixed"
    assert "early_stopping_patience" not in LMTrainConfig().reuse_key(runtime)
    assert LMTrainConfig(early_stopping_patience=2).reuse_key(runtime)["early_stopping_patience"] == 2
    planner = PlannerTrainArgs().reuse_key(runtime)
    assert not {"gradient_clip_val", "limit_train_batches", "accumulate_grad_batches", "eval_batch_size"} & set(planner)
    assert PlannerTrainArgs(gradient_clip_val=0.5).reuse_key(runtime)["gradient_clip_val"] == 0.5
    assert [fingerprint(LMTrainConfig().reuse_key(runtime)),
            fingerprint(LMTrainConfig().reuse_key(Runtime(device="cpu", precision="bf16"))),
            fingerprint(PlannerTrainArgs().reuse_key(runtime)),
            fingerprint(PlannerTrainArgs().reuse_key(Runtime(precision="native")))] == [
        "9ab628c156fcd5e8", "8fe7fe9aded1aae4", "14c495c0476ff96f", "8fb8717d6b5ecd62"]


def test_every_command_that_runs_a_network_takes_the_one_runtime_group():
    takes = {name for name in COMMANDS if "runtime" in inspect.signature(load_command(name)).parameters}
    assert takes == {"train-planner", "train-lm", "sample-plans", "evaluate", "sweep", "generate", "edit-distance",
                     "adherence"}
    for name in takes:
        parameters = inspect.signature(load_command(name)).parameters
        assert parameters["runtime"].annotation in (Runtime, "Runtime")
        assert not {"device", "precision", "speed"} & set(parameters), name


def test_a_speed_knob_on_a_command_that_does_not_apply_it_is_a_one_line_note():
    with pytest.warns(PlanlmWarning, match="generate: --runtime.compile, --runtime.loss_chunk_size not used here"):
        Runtime(compile=True, loss_chunk_size=0).note_unused_speed("generate")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Runtime(device="cpu", precision="bf16").note_unused_speed("generate")  # device and precision are read


def test_the_runtime_group_checks_its_device_and_reads_lightnings_gpu():
    assert Runtime(device="gpu").device == "cuda" and Runtime(device="cuda:1").accelerator() == "cuda"
    with pytest.raises(PlanlmError, match="--runtime.device 'tpu7'"):
        Runtime(device="tpu7")
    with pytest.raises(PlanlmError, match="--runtime.loss_chunk_size must be >= 0"):
        Runtime(loss_chunk_size=-1)


@pytest.mark.parametrize("command, old, new", [
    (train_lm, {"train": {"precision": "bf16", "accelerator": "cpu", "lr": 0.1}, "speed": {"compile": True}},
     {"train": {"lr": 0.1}, "runtime": {"precision": "bf16", "device": "cpu", "compile": True}}),
    (evaluate, {"device": "cpu", "precision": "native", "speed": {"loss_chunk_size": 0}},
     {"runtime": {"device": "cpu", "precision": "native", "loss_chunk_size": 0}}),
])
def test_old_runtime_keys_are_read_into_the_runtime_group_with_a_note(command, old, new):
    with pytest.warns(PlanlmWarning, match="is read as 'runtime"):
        kwargs = bind_section(command, old, skip={"prepared_dir", "out_dir", "model_dir"}, where="run.yaml")
    assert kwargs["runtime"] == Runtime(**new["runtime"])
    if "train" in new:
        assert kwargs["train"].lr == 0.1


def test_read_renamed_moves_an_old_key_into_its_group_with_a_note():
    with pytest.warns(PlanlmWarning, match="run.yaml: 'new_tokens' is read as 'sampling.max_new_tokens'"):
        assert read_renamed({"new_tokens": 12, "seed": 1}, {"new_tokens": "sampling.max_new_tokens"},
                            "run.yaml") == {"seed": 1, "sampling": {"max_new_tokens": 12}}
    with pytest.raises(PlanlmError, match="same setting"):
        read_renamed({"new_tokens": 12, "sampling": {"max_new_tokens": 8}}, {"new_tokens": "sampling.max_new_tokens"},
                     "run.yaml")


def test_edit_distance_reads_its_old_flat_sampling_keys_in_a_run_section():
    old = {"new_tokens": 12, "temperature": 0.5, "top_k": 3}
    with pytest.warns(PlanlmWarning, match="'temperature' is read as 'sampling.temperature'"):
        kwargs = bind_section(edit_distance, old, skip={"model_dir", "prepared_dir", "out_dir"}, where="run.yaml")
    assert kwargs["sampling"] == SamplingConfig(max_new_tokens=12, temperature=0.5, top_k=3)


def test_edit_distance_reads_its_old_flags_and_config_keys_on_the_command_line(tmp_path, monkeypatch):
    from planlm import cli

    seen = {}
    monkeypatch.setattr("planlm.evaluate.edit_distance.edit_distance",
                        functools.wraps(edit_distance)(lambda **kwargs: seen.update(kwargs) or {}))
    config = tmp_path / "edit.yaml"
    config.write_text(yaml.safe_dump({"top_p": 0.5, "split": "validation"}))
    with pytest.warns(PlanlmWarning, match="--new_tokens is read as --sampling.max_new_tokens"):
        cli.main(["edit-distance", "--model_dir", "m", "--prepared_dir", "p", "--out_dir", str(tmp_path / "out"),
                  "--config", str(config), "--new_tokens", "7"])
    assert seen["sampling"] == SamplingConfig(max_new_tokens=7, top_p=0.5) and seen["split"] == "validation"
