"""Scaling out: DDP with two CPU processes on gloo, through `planlm run` (slow)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from helpers import tiny_run_config


@pytest.mark.slow
def test_run_trains_with_ddp_on_two_cpu_processes(tmp_path):
    config = tiny_run_config(tmp_path / "ddp")
    for section in (config["planner"], config["lm"]):
        section["train"].update({"devices": 2, "strategy": "ddp"})
        section["runtime"] = {"device": "cpu"}
    config["conditions"] = [c for c in config["conditions"] if c["name"] in ("none", "ours")]
    config["sweeps"] = []
    path = tmp_path / "ddp.yaml"
    path.write_text(yaml.safe_dump(config))
    # --verbose true: the libraries' output (Lightning's rank banners) stays on the console instead of logs/
    result = subprocess.run([sys.executable, "-m", "planlm.cli", "run", "--config", str(path), "--verbose", "true"],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    # The planner and both LMs trained in two processes; the rest of the pipeline ran once.
    assert log.count("GLOBAL_RANK: 1, MEMBER: 2/2") == 3
    assert len(re.findall(r"\[ *1/\d+\] prepare \.\.\.", log)) == 1  # the pipeline started once, not once per rank
    state = json.loads((tmp_path / "ddp" / "run_state.json").read_text())
    assert all(info["status"] == "done" for info in state["stages"].values())
    rows = json.loads((tmp_path / "ddp" / "results.json").read_text())["conditions"]
    assert all(r["ppl"] > 1 for r in rows)


def test_a_distributed_stage_reaches_its_child_process_as_plain_yaml(tmp_path, monkeypatch):
    """The stage's arguments (dataclasses, PlanConfig's enum kind) go to `planlm train-lm --config` as YAML;
    an enum once made yaml.safe_dump fail, and every DDP condition with it."""
    import planlm.pipeline.run as pipeline
    from planlm.pipeline.run import _run_distributed, plan_stages

    config = tiny_run_config(tmp_path / "ddp")
    config["lm"]["train"].update({"devices": 2, "strategy": "ddp"})
    config["lm"]["runtime"] = {"device": "cpu"}
    sections = {k: config.get(k) for k in ("prepare", "planner", "lm", "base_lm", "conditions", "evaluate",
                                           "edit_distance", "sweeps")}
    stage = next(s for s in plan_stages(tmp_path / "ddp", **sections, where="run.yaml")
                 if s.command == "train_lm" and s.condition == "ours")
    seen = {}

    def child(command, **kwargs):
        seen["command"], seen["config"] = command, yaml.safe_load(open(command[command.index("--config") + 1]))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", child)
    assert pipeline._is_distributed(stage)
    _run_distributed(stage)
    assert seen["command"][3:5] == ["train-lm", "--config"]
    assert seen["command"][-2:] == ["--verbose", "false"]  # the child routes its library output as the run does
    assert seen["config"]["plans"]["kind"] == "planner_sampled" and seen["config"]["train"]["devices"] == 2
