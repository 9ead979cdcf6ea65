"""Scaling out: DDP with two CPU processes on gloo, through `planlm run` (slow)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from helpers import tiny_run_config


@pytest.mark.slow
def test_run_trains_with_ddp_on_two_cpu_processes(tmp_path):
    config = tiny_run_config(tmp_path / "ddp")
    for train in (config["planner"]["train"], config["lm"]["train"]):
        train.update({"accelerator": "cpu", "devices": 2, "strategy": "ddp"})
    config["conditions"] = [c for c in config["conditions"] if c["name"] in ("none", "ours")]
    config["sweeps"] = []
    path = tmp_path / "ddp.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, "-m", "planlm.cli", "run", "--config", str(path)],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    # The planner and both LMs trained in two processes; the rest of the pipeline ran once.
    assert log.count("GLOBAL_RANK: 1, MEMBER: 2/2") == 3
    assert log.count("stage 1/") == 1
    state = json.loads((tmp_path / "ddp" / "run_state.json").read_text())
    assert all(info["status"] == "done" for info in state["stages"].values())
    rows = json.loads((tmp_path / "ddp" / "results.json").read_text())["conditions"]
    assert all(r["ppl"] > 1 for r in rows)
