"""Reuse never serves stale results: evaluate, edit-distance, sweep and train-lm outputs are rebuilt when the
model or the planner in their input folder changes (same paths, same settings), and `planlm run` rebuilds
every stage downstream of a changed setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import read_csv, tiny_gpt2_config, tiny_planned_lm, tiny_planner, tiny_run_config, use_planner
from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.evaluate.edit_distance import edit_distance
from planlm.evaluate.generator import ProtocolSampling
from planlm.evaluate.perplexity import evaluate
from planlm.evaluate.sweeps import sweep
from planlm.plans.config import PlanConfig
from planlm.stage import read_manifest
from planlm.testing.synthetic import make_synthetic_prepared
from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm


def save_planner(prepared: PreparedDataset, folder: Path, seed: int) -> Path:
    tiny_planner(prepared, seed=seed).save_pretrained(folder)
    return folder


def save_model(prepared: PreparedDataset, folder: Path, seed: int, planner_dir: Path) -> Path:
    """A planner_sampled planned LM (K=2, T=3) whose config names ``planner_dir``."""
    model = tiny_planned_lm(prepared, seed=seed)
    use_planner(model, str(planner_dir))
    model.save_pretrained(folder)
    return folder


@pytest.fixture
def folders(synthetic_random, tmp_path):
    prepared = PreparedDataset(synthetic_random)
    planner = save_planner(prepared, tmp_path / "planner", seed=0)
    return prepared, planner, save_model(prepared, tmp_path / "model", seed=0, planner_dir=planner)


def created(folder: Path) -> str:
    return read_manifest(folder)["created"] + str((folder / "manifest.json").stat().st_mtime_ns)


def assert_rebuilt_on_change(run, prepared, planner, model) -> None:
    """``run(out)`` into one folder gives new results after another model, then another planner, is
    written into the input folders, and each equals a run into a fresh folder (not a stale reuse)."""
    first = run("stage")
    save_model(prepared, model, seed=1, planner_dir=planner)  # another LM and adapter, same folder
    second = run("stage")
    assert second != first and second == run("fresh_model")
    save_planner(prepared, planner, seed=1)  # another planner, same folder: other plans
    third = run("stage")
    assert third != second and third == run("fresh_planner")


def test_evaluate_is_rebuilt_when_the_model_or_the_planner_in_its_folder_changes(folders, tmp_path):
    prepared, planner, model = folders
    kwargs = dict(max_articles=3, stride=32, context_length=64, bootstrap_samples=20,
                  runtime=Runtime(device="cpu"))

    def run(out: str) -> list[dict]:
        evaluate(str(model), str(prepared.path), str(tmp_path / out), **kwargs)
        return read_csv(tmp_path / out / "per_article.csv")

    assert_rebuilt_on_change(run, prepared, planner, model)


def test_edit_distance_is_rebuilt_when_the_model_or_the_planner_in_its_folder_changes(folders, tmp_path):
    prepared, planner, model = folders
    kwargs = dict(split="validation", max_articles=3, max_boundaries_per_article=1, sampling=ProtocolSampling(max_new_tokens=8),
                  context_length=32,
                  bootstrap_samples=20, runtime=Runtime(device="cpu"))

    def run(out: str) -> list[str]:
        edit_distance(str(model), str(prepared.path), str(tmp_path / out), **kwargs)
        return [row["generated_text"] for row in read_csv(tmp_path / out / "per_boundary.csv")]

    assert_rebuilt_on_change(run, prepared, planner, model)


def test_sweep_is_rebuilt_when_the_model_or_the_planner_in_its_folder_changes(folders, tmp_path):
    prepared, planner, model = folders
    kwargs = dict(num_paths=[2], max_articles=1, stride=32, context_length=64, bootstrap_samples=20,
                  runtime=Runtime(device="cpu"))

    def run(out: str) -> list[str]:
        sweep(str(model), str(prepared.path), str(tmp_path / out), **kwargs)
        return [row["ppl"] for row in read_csv(tmp_path / out / "sweep_num_paths.csv")]

    assert run("reused") == run("reused")  # unchanged inputs: reused
    assert_rebuilt_on_change(run, prepared, planner, model)


def test_train_lm_is_rebuilt_when_the_planner_in_its_folder_changes(tmp_path):
    """The plans come from the planner: a retrained planner in the same folder means other training plans."""
    prepared_dir = make_synthetic_prepared(tmp_path / "prepared", rule="random", seed=7,
                                           num_articles={"train": 20, "validation": 4, "test": 2})
    prepared = PreparedDataset(prepared_dir)
    planner = save_planner(prepared, tmp_path / "planner", seed=0)

    def train() -> Path:
        return train_lm(str(prepared_dir), str(tmp_path / "model"),
                        model=LMModelConfig(model_config=tiny_gpt2_config()),
                        plans=PlanConfig(kind="planner_sampled", num_paths=2, horizon=2, planner_dir=str(planner)),
                        train=LMTrainConfig(batch_size=4, limit_train_batches=1, limit_val_batches=1))

    out = train()
    first = read_manifest(out)
    save_planner(prepared, planner, seed=1)
    second = read_manifest(train())
    assert second["planner_hash"] != first["planner_hash"]  # retrained on the new planner's plans
    assert second["plans_manifest"]["planner_hash"] == second["planner_hash"]
    assert json.loads((out / "planned_lm.json").read_text())["planner_hash"] == second["planner_hash"]


def _stage_fingerprints(out: Path) -> dict[str, str]:
    """Stage name -> the config fingerprint of its folder's manifest, for every stage of the last run."""
    stages = json.loads((out / "run_state.json").read_text())["stages"]
    return {name: read_manifest(info["out_dir"])["config_fingerprint"] for name, info in stages.items()}


def _ran_now(out: Path) -> set[str]:
    return {name for name, info in json.loads((out / "run_state.json").read_text())["stages"].items()
            if info["ran_now"]}


@pytest.mark.slow
def test_run_rebuilds_every_stage_downstream_of_a_changed_setting(tmp_path):
    from planlm.pipeline.run import run

    out = tmp_path / "run"
    config = tiny_run_config(out, edit_distance={"max_articles": 1, "max_boundaries_per_article": 1,
                                                 "sampling": {"max_new_tokens": 6},
                                                 "context_length": 64, "bootstrap_samples": 20},
                             sweeps=[{"condition": "ours", "kind": "num_paths", "num_paths": [1, 2], "stride": 32,
                                      "context_length": 64, "max_articles": 2, "bootstrap_samples": 20}])
    config["conditions"] = [c for c in config["conditions"] if c["name"] in ("none", "ours")]
    config["planner"]["train"]["max_epochs"] = 1
    config["lm"]["train"]["max_steps"] = 2
    config["evaluate"]["max_articles"] = 2
    run(**config)
    first = _stage_fingerprints(out)
    assert len(first) == 9  # prepare, planner, 2 x (train-lm, evaluate, edit-distance), sweep

    # The planner alone changes: it and everything its plans feed rebuild; the plain LM and its outputs are reused.
    config["planner"]["train"]["lr"] = 0.001
    run(**config)
    second = _stage_fingerprints(out)
    planner_fed = {"train-planner", "train-lm ours", "evaluate ours", "edit-distance ours", "sweep num_paths ours"}
    assert {name for name in first if second[name] != first[name]} == planner_fed == _ran_now(out)

    # The actions change upstream: every stage rebuilds, on 6 actions.
    config["prepare"]["actions"]["num_actions"] = 6
    run(**config)
    third = _stage_fingerprints(out)
    assert all(third[name] != second[name] for name in first) and _ran_now(out) == set(first)
    assert json.loads((out / "planner" / "config.json").read_text())["num_actions"] == 6
    assert json.loads((out / "lm" / "ours" / "planned_lm.json").read_text())["num_actions"] == 6
    for point in ("num_paths-1", "num_paths-2"):  # the sweep's evaluations were recomputed too
        assert read_manifest(out / "sweeps" / "ours-num_paths" / point)["config"]["prepared"] == \
            read_manifest(out / "prepared")["config_fingerprint"]
