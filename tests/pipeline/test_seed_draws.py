"""`seed_draws`: what a seed of `planlm run` draws. ``lm`` (the default) trains the LMs per seed with the codebook,
the planners and the sweeps shared; ``method`` draws each seed's own codebook, trains its own planners and sweeps
every seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planlm.errors import PlanlmError
from planlm.models.planned_lm import recorded_plan_folders
from planlm.pipeline.run import plan_stages, run

from helpers import tiny_run_config


def _stages(out: Path, **overrides):
    config = tiny_run_config(out, **overrides)
    return plan_stages(out, config["prepare"], config["planner"], config["lm"], config.get("base_lm"),
                       config["conditions"], config["evaluate"], config.get("edit_distance"), config.get("sweeps"),
                       where="run", seeds=config.get("seeds"), **({"seed_draws": config["seed_draws"]}
                                                                  if "seed_draws" in config else {}))


def _own_cornille(config_conditions: list[dict]) -> list[dict]:
    return [{**c, "planner": {"model": {"horizon": 1}}} if c["name"] == "cornille" else c for c in config_conditions]


def test_default_keeps_the_shared_planners_and_the_first_seeds_sweeps(tmp_path):
    conditions = _own_cornille(tiny_run_config(tmp_path)["conditions"])
    default = _stages(tmp_path, seeds=[0, 1], conditions=conditions)
    explicit = _stages(tmp_path, seeds=[0, 1], conditions=conditions, seed_draws="lm")
    assert [(s.name, s.kwargs) for s in default] == [(s.name, s.kwargs) for s in explicit]
    planners = {s.name: Path(s.kwargs["out_dir"]).relative_to(tmp_path).as_posix() for s in default
                if s.command == "train_planner"}
    assert planners == {"train-planner": "planner", "train-planner cornille": "planners/cornille"}
    assert all(s.kwargs["train"].seed == 0 for s in default if s.command == "train_planner")  # its default
    sweeps = [(s.name, Path(s.kwargs["out_dir"]).relative_to(tmp_path).as_posix(), Path(s.kwargs["model_dir"]).name)
              for s in default if s.command == "sweep"]
    assert sweeps == [("sweep num_paths ours", "sweeps/ours-num_paths", "seed0"),
                      ("sweep compute ours", "sweeps/ours-compute", "seed0")]


def test_method_draws_the_planners_and_the_sweeps_per_seed(tmp_path):
    conditions = _own_cornille(tiny_run_config(tmp_path)["conditions"])
    stages = _stages(tmp_path, seeds=[3, 5], conditions=conditions, seed_draws="method", edit_distance=None)
    planners = {s.name: (Path(s.kwargs["out_dir"]).relative_to(tmp_path).as_posix(), s.kwargs["train"].seed)
                for s in stages if s.command == "train_planner"}
    assert planners == {"train-planner seed3": ("planner/seed3", 3),
                        "train-planner cornille seed3": ("planners/cornille/seed3", 3),
                        "train-planner seed5": ("planner/seed5", 5),
                        "train-planner cornille seed5": ("planners/cornille/seed5", 5)}
    lms = {s.name: (Path(s.kwargs["plans"].planner_dir).relative_to(tmp_path).as_posix(), s.needs) for s in stages
           if s.command == "train_lm" and s.kwargs["plans"].planner_dir}
    assert lms["train-lm ours seed5"] == ("planner/seed5", ["codebook seed5", "train-planner seed5"])
    assert lms["train-lm cornille seed3"] == ("planners/cornille/seed3",
                                              ["codebook seed3", "train-planner cornille seed3"])
    codebooks = [(s.name, s.kwargs["seed"], Path(s.kwargs["out_dir"]).relative_to(tmp_path).as_posix(), s.needs)
                 for s in stages if s.command == "codebook"]
    assert codebooks == [("codebook seed3", 3, "codebooks/seed3", ["prepare"]),
                         ("codebook seed5", 5, "codebooks/seed5", ["prepare"])]
    for stage in stages:  # every stage of a seed reads that seed's codebook
        if stage.command != "prepare" and "prepared_dir" in stage.kwargs:
            expected = "prepared" if stage.command == "codebook" else f"codebooks/seed{stage.seed}"
            assert Path(stage.kwargs["prepared_dir"]).relative_to(tmp_path).as_posix() == expected, stage.name
    sweeps = [(s.name, Path(s.kwargs["out_dir"]).relative_to(tmp_path).as_posix(),
               Path(s.kwargs["model_dir"]).relative_to(tmp_path).as_posix()) for s in stages if s.command == "sweep"]
    assert ("sweep num_paths ours seed5", "sweeps/ours-num_paths/seed5", "lm/ours/seed5") in sweeps and len(sweeps) == 4
    with pytest.raises(PlanlmError, match="seed_draws: method needs seeds"):
        _stages(tmp_path, seed_draws="method")
    with pytest.raises(PlanlmError, match="seed_draws 'planner' is not one of"):
        _stages(tmp_path, seeds=[0], seed_draws="planner")


@pytest.mark.slow
def test_method_run_trains_a_planner_per_seed_and_sweeps_every_seed(tmp_path):
    from safetensors.numpy import load_file

    out = tmp_path / "method"
    config = tiny_run_config(out, seeds=[0, 1], seed_draws="method", edit_distance=None)
    config["conditions"] = [c for c in config["conditions"] if c["name"] in ("fixed", "ours")]
    config["sweeps"] = config["sweeps"][:1]
    run(**config)
    codebooks = [load_file(out / "codebooks" / f"seed{s}" / "codebook.safetensors")["centroids"] for s in (0, 1)]
    assert (codebooks[0] != codebooks[1]).any()  # each seed drew its own codebook
    weights = [load_file(out / "planner" / f"seed{s}" / "model.safetensors") for s in (0, 1)]
    assert not (out / "planner" / "model.safetensors").exists()
    assert any((weights[0][k] != weights[1][k]).any() for k in weights[0])  # each seed drew its own planner
    for seed in (0, 1):
        lm = out / "lm" / "ours" / f"seed{seed}"
        folders = recorded_plan_folders(lm)
        assert Path(folders["planner_dir"]).resolve() == (out / "planner" / f"seed{seed}").resolve()
        summary = json.loads((out / "planner" / f"seed{seed}" / "summary.json").read_text())
        assert Path(summary["prepared_dir"]).resolve() == (out / "codebooks" / f"seed{seed}").resolve()
    results = json.loads((out / "results.json").read_text())
    assert results["planners"]["shared"]["seed"] == 0
    (sweep,) = results["sweeps"]
    assert sweep["sweep"] == "ours-num_paths" and sweep["seeds"] == [0, 1]
    assert sweep["interval"] == "seeds and articles"
    points = {int(float(p["value"])): p for p in sweep["points"]}
    assert set(points) == {1, 3} and set(points[3]["seed_diffs"]) == {"0", "1"}
    assert points[3]["ci_low"] <= points[3]["diff"] <= points[3]["ci_high"]
    assert points[3]["diff"] == pytest.approx(sum(points[3]["seed_diffs"].values()) / 2, rel=1e-3, abs=1e-3)
    report = (out / "report.md").read_text()
    assert "ours-num_paths: sweep num paths over seeds [0, 1]" in report
    assert "seed 0's, horizon 3" in report
    started = {p: p.stat().st_mtime_ns for p in out.glob("*/**/manifest.json")}
    run(**config)  # a rerun reuses every stage
    assert {p: p.stat().st_mtime_ns for p in started} == started
