"""`planlm run` end to end with tiny sizes: every stage, reuse, failure isolation, the report (resume: test_resume.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planlm.pipeline import run
from planlm.utils import PlanlmError

from helpers import tiny_run_config


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "tiny"
    started = time.time()
    run(**tiny_run_config(out))
    return out, time.time() - started


def test_run_writes_every_stage_and_the_report(tiny_run):
    out, _ = tiny_run
    for folder in ("prepared", "planner", "lm/none", "lm/ours", "eval/none", "eval/oracle", "eval/ours"):
        assert (out / folder / "manifest.json").is_file(), folder
    results = json.loads((out / "results.json").read_text())
    rows = {r["name"]: r for r in results["conditions"]}
    assert set(rows) == {"none", "fixed", "cornille", "ours", "oracle"}
    for row in rows.values():
        assert row["status"] == "done"
        assert row["ppl_ci_low"] <= row["ppl"] <= row["ppl_ci_high"]
    assert rows["ours"]["K"] == 3 and rows["ours"]["T"] == 3 and rows["ours"]["conditioning"] == "planner_sampled"
    report = (out / "report.md").read_text()
    table = {line.split(" | ")[0][2:]: line for line in report.splitlines() if line.startswith("| ")}
    # the paper's Table 1 numbers (PPL, edit distance) sit beside the rows of the conditions that name them
    assert table[rows["fixed"]["label"]].endswith("| 26.67 | 4.67 |")
    assert table[rows["cornille"]["label"]].endswith("| 25.54 | 4.48 |")
    assert table[rows["ours"]["label"]].endswith("|  |  |") and report.count("26.67") == 1
    assert "Planner: next-action accuracy" in report and (out / "figures" / "planner_accuracy.png").is_file()
    assert (out / "figures" / "cluster_sizes.png").is_file()
    assert (out / "results.csv").read_text().startswith("name,")
    assert rows["ours"]["edit"] is not None and rows["ours"]["edit_ci_low"] <= rows["ours"]["edit"]
    assert "ours-num_paths" in report and (out / "figures" / "ours-num_paths-sweep_num_paths.png").is_file()


def test_rerun_reuses_every_stage(tiny_run):
    out, first_seconds = tiny_run
    before = {p: p.stat().st_mtime for p in out.glob("*/**/manifest.json")}
    started = time.time()
    run(**tiny_run_config(out))
    assert time.time() - started < max(20.0, first_seconds / 2)
    after = {p: p.stat().st_mtime for p in out.glob("*/**/manifest.json")}
    assert before == after  # no stage rebuilt


def test_failed_condition_is_reported_and_others_survive(tmp_path, tiny_run):
    out, _ = tiny_run
    config = tiny_run_config(out)
    # A fixed action outside the codebook fails in train-lm; the other conditions are reused.
    config["conditions"] = config["conditions"][:2] + [
        {"name": "broken", "conditioning": {"conditioning": "fixed", "fixed_action": 999}}]
    config["sweeps"] = []
    run(**config)
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["conditions"]}
    assert rows["broken"]["status"] == "failed" and rows["broken"]["error"]
    assert rows["none"]["status"] == "done" and rows["fixed"]["status"] == "done"
    assert "broken" in (out / "report.md").read_text()


def test_condition_with_its_own_planner_trains_and_uses_it(tiny_run):
    out, _ = tiny_run
    config = tiny_run_config(out)
    ours = config["conditions"][3]
    config["conditions"] = [config["conditions"][0], ours,
                            {**ours, "name": "ours_causal", "planner": {"model": {"dynamics": "causal"}}}]
    config["sweeps"] = []
    run(**config)
    own = json.loads((out / "planners" / "ours_causal" / "config.json").read_text())
    assert own["dynamics"] == "causal" and own["d_model"] == 32  # merged over the shared planner section
    assert json.loads((out / "planner" / "config.json").read_text())["dynamics"] == "recurrent"
    lm_config = json.loads((out / "lm" / "ours_causal" / "planned_lm.json").read_text())
    assert Path(lm_config["planner_dir"]).resolve() == (out / "planners" / "ours_causal").resolve()
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["conditions"]}
    assert rows["ours_causal"]["status"] == "done" and rows["ours_causal"]["ppl"] > 0


def test_bad_section_is_one_line_error_before_anything_runs(tmp_path):
    config = tiny_run_config(tmp_path / "bad")
    config["planner"]["train"]["lrr"] = 1.0
    with pytest.raises(PlanlmError, match="planner"):
        run(**config)
    config = tiny_run_config(tmp_path / "bad")
    config["conditions"][0]["planer"] = {}
    with pytest.raises(PlanlmError, match=r"conditions\[none\] has unknown key\(s\) \['planer'\]"):
        run(**config)
    assert not (tmp_path / "bad").exists()


def _cli(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planlm.cli", *args], capture_output=True, text=True, **kwargs)


def test_shipped_configs_validate_offline(tmp_path):
    root = Path(__file__).resolve().parents[1]
    for name in ("demo.yaml", "offline-full.yaml", "paper.yaml"):
        result = _cli(["run", "--config", str(root / "configs" / name), "--out_dir", str(tmp_path / name),
                       "--dry_run", "true"])
        assert result.returncode == 0, result.stderr[-2000:]
        assert "config valid" in result.stdout
    result = _cli(["run", "--config", str(root / "configs" / "demo.yaml"), "--print_config"])
    assert result.returncode == 0 and "conditions:" in result.stdout
