"""The settings groups that commands share (issue 31): one runtime group, one precision vocabulary, one trainer
group, the sampling group of generate and edit-distance; Lightning's precision spellings still read with a one-line
note, and a group's key given flat a one-line error naming it."""

from __future__ import annotations

import inspect
from dataclasses import fields

import pytest
import yaml

from planlm.args import PRECISIONS, LMRuntime, Runtime, arithmetic, lightning_precision, read_precision
from planlm.commands import COMMANDS, load_command
from planlm.errors import PlanlmError, PlanlmWarning
from planlm.evaluate.edit_distance import edit_distance
from planlm.pipeline.sections import bind_section
from planlm.train.args import TrainArgs, recorded_runtime
from planlm.jsonio import fingerprint
from planlm.train.lm import LMTrainConfig
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


def test_reuse_keys_hold_every_knob_but_the_display_only_ones():
    """The runtime's accelerator and precision are keyed as ``accelerator`` and ``precision`` (planlm's vocabulary),
    and every knob that changes the trained model is in the key, at its default too. The fingerprints pin the keys."""
    runtime = Runtime()
    assert LMTrainConfig().reuse_key(runtime)["precision"] == "auto"
    assert LMTrainConfig().reuse_key(Runtime(precision="bf16"))["precision"] == "bf16"
    assert recorded_runtime(LMTrainConfig().reuse_key(Runtime(device="cpu", precision="bf16")))[1] == {
        "device": "cpu", "precision": "bf16"}
    assert LMTrainConfig().reuse_key(runtime)["early_stopping_patience"] is None
    assert LMTrainConfig(early_stopping_patience=2).reuse_key(runtime)["early_stopping_patience"] == 2
    planner = PlannerTrainArgs().reuse_key(runtime)
    assert {"gradient_clip_val", "limit_train_batches", "accumulate_grad_batches"} <= set(planner)
    assert not {"num_workers", "log_every_n_steps", "loggers"} & set(planner)
    assert PlannerTrainArgs(gradient_clip_val=0.5).reuse_key(runtime)["gradient_clip_val"] == 0.5
    assert [fingerprint(LMTrainConfig().reuse_key(runtime)),
            fingerprint(LMTrainConfig().reuse_key(Runtime(device="cpu", precision="bf16"))),
            fingerprint(PlannerTrainArgs().reuse_key(runtime)),
            fingerprint(PlannerTrainArgs().reuse_key(Runtime(precision="native")))] == [
        "ebc2b07a3a8a3fcc", "e0ef134697e026ff", "ea64b419d68be8a1", "92c553db6122514c"]


def test_every_command_that_runs_a_network_takes_the_one_runtime_group():
    takes = {name for name in COMMANDS if "runtime" in inspect.signature(load_command(name)).parameters}
    assert takes == {"train-planner", "train-lm", "sample-plans", "evaluate", "sweep", "generate", "edit-distance",
                     "adherence"}
    for name in takes:
        parameters = inspect.signature(load_command(name)).parameters
        expected = (LMRuntime, "LMRuntime") if name == "train-lm" else (Runtime, "Runtime")
        assert parameters["runtime"].annotation in expected, name
        assert not {"device", "precision", "speed"} & set(parameters), name
    assert {knob.name for knob in fields(Runtime)} == {"device", "precision"}  # the speed knobs: train-lm's alone


def test_the_runtime_group_checks_its_device_and_reads_lightnings_gpu():
    assert Runtime(device="gpu").device == "cuda" and Runtime(device="cuda:1").accelerator() == "cuda"
    with pytest.raises(PlanlmError, match="--runtime.device 'tpu7'"):
        Runtime(device="tpu7")
    with pytest.raises(PlanlmError, match="--runtime.loss_chunk_size must be >= 0"):
        LMRuntime(loss_chunk_size=-1)


def test_a_key_of_a_group_given_flat_is_a_one_line_error_naming_the_groups_key(tmp_path, capsys):
    from planlm import cli

    with pytest.raises(PlanlmError, match=r"run.yaml: unknown key\(s\) \['plan_guidance'\] \(plan_guidance is "
                                          r"sampling.plan_guidance\)") as error:
        bind_section(edit_distance, {"plan_guidance": 2.0}, skip={"model_dir", "prepared_dir", "out_dir"},
                     where="run.yaml")
    assert "\n" not in str(error.value)
    config = tmp_path / "edit.yaml"
    config.write_text(yaml.safe_dump({"plan_guidance": 2.0, "split": "validation"}))
    for extra, message in [(["--max_new_tokens", "7"], "unknown flag(s) ['--max_new_tokens'] (--max_new_tokens "
                                                       "is --sampling.max_new_tokens)"),
                           (["--config", str(config)], f"{config}: unknown key(s) ['plan_guidance'] (plan_guidance is "
                                                        "sampling.plan_guidance)"),
                           (["--sampling.top_k", "5"], "unknown flag --sampling.top_k; --sampling takes ['--sampling.max_new_tokens', "
                                                       "'--sampling.plan_guidance', '--sampling.temperature']")]:
        with pytest.raises(SystemExit) as exited:
            cli.main(["edit-distance", "--model_dir", "m", "--prepared_dir", "p", "--out_dir", str(tmp_path / "out"),
                      *extra])
        err = capsys.readouterr().err.strip()
        assert exited.value.code == 2 and message in err and "\n" not in err
