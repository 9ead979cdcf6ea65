"""`planlm run` end to end with tiny sizes: every stage, reuse, failure isolation, the report (resume: test_resume.py)."""

from __future__ import annotations

import functools
import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from planlm.errors import PlanlmError
from planlm.models.planned_lm import recorded_plan_folders
from planlm.pipeline.run import StagesFailed, run
from planlm.stage import STAGE_LOCK

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
    assert not list(out.rglob(STAGE_LOCK))  # every stage released its folder, and the run its own
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
    # the compute sweep: its table, its figure and where the entropy policy's paths went
    assert "ours-compute: planning compute against perplexity" in report and "Where the paths went" in report
    assert (out / "figures" / "ours-compute-sweep_compute.png").is_file()
    assert (out / "figures" / "ours-compute-paths.png").is_file()


def test_report_shows_where_plans_act_with_intervals(tiny_run):
    from planlm.evaluate.bootstrap import read_per_article
    from planlm.evaluate.positions import read_positions

    out, _ = tiny_run
    totals, cells = read_per_article(out / "eval" / "ours"), read_positions(out / "eval" / "ours")
    assert (cells["tokens"].sum(1) == totals["tokens"]).all()
    assert cells["nll"].sum(1) == pytest.approx(totals["nll_sum"], rel=1e-9)
    section = (out / "report.md").read_text().split("## Where plans act")[1].split("\n## ")[0]
    rows = {line.split(" | ")[0][2:]: line for line in section.splitlines() if line.startswith("| ")}
    # every condition whose plans carry information, against Fixed and against none
    assert {"cornille - fixed", "cornille - none", "ours - fixed", "ours - none", "oracle - fixed",
            "oracle - none"} <= set(rows)
    assert rows["B - A"].startswith("| B - A | all tokens | token 1 | tokens 2-8 | tokens 9+ | none out |")
    assert all(rows[name].count(" [") == 7 for name in ("ours - fixed", "ours - none"))  # an interval per bin
    positions = {(p["b"], p["a"]): p for p in json.loads((out / "results.json").read_text())["positions"]}
    ours = positions[("ours", "none")]["bins"]
    assert sum(ours[name]["tokens"] for name in ("first", "early", "late")) == ours["all"]["tokens"]
    assert ours["all"]["ci_low"] <= ours["all"]["diff"] <= ours["all"]["ci_high"]


def test_rerun_reuses_every_stage(tiny_run):
    out, first_seconds = tiny_run
    before = {p: p.stat().st_mtime for p in out.glob("*/**/manifest.json")}
    started = time.time()
    run(**tiny_run_config(out))
    assert time.time() - started < max(20.0, first_seconds / 2)
    after = {p: p.stat().st_mtime for p in out.glob("*/**/manifest.json")}
    assert before == after  # no stage rebuilt


def test_failed_condition_is_reported_and_others_survive(tmp_path, tiny_run, capsys):
    out, _ = tiny_run
    config = tiny_run_config(out)
    # A plan cache that is not there fails in train-lm; the other conditions are reused.
    config["conditions"] = config["conditions"][:2] + [
        {"name": "broken", "plans": {"kind": "planner_sampled", "plans_dir": str(tmp_path / "no-cache")}}]
    config["sweeps"] = []
    with pytest.raises(StagesFailed, match="stages did not finish") as failed:
        run(**config)
    assert failed.value.exit_status == 1  # `planlm run` exits 1: a scheduler sees the failure
    err = capsys.readouterr().err
    assert f"train-lm broken: failed: PlanlmError: {tmp_path / 'no-cache'}" in err  # the cause, not only logs/
    assert "evaluate broken: skipped: needs ['train-lm broken']" in err
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
    lm_folders = recorded_plan_folders(out / "lm" / "ours_causal")
    assert Path(lm_folders["planner_dir"]).resolve() == (out / "planners" / "ours_causal").resolve()
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["conditions"]}
    assert rows["ours_causal"]["status"] == "done" and rows["ours_causal"]["ppl"] > 0


def test_seeds_train_every_condition_once_per_seed_and_new_seeds_only(tiny_run, capsys):
    out, _ = tiny_run  # reuses its prepared corpus; new condition names keep its single-seed folders apart
    config = tiny_run_config(out, seeds=[0], sweeps=[], edit_distance=None)
    config["conditions"] = [{"name": "plain", "plans": {"kind": "none"}},
                            {"name": "oracle_seeded", "plans": {"kind": "oracle"}}]
    run(**config)
    first = {p: p.stat().st_mtime_ns for p in out.glob("[le][mv]*/*/seed0/manifest.json")}
    assert len(first) == 4  # lm/ and eval/ of both conditions
    config["seeds"] = [0, 1]
    run(**config)
    assert {p: p.stat().st_mtime_ns for p in first} == first  # seed 0 reused, only seed 1 trained
    assert (out / "lm" / "oracle_seeded" / "seed1" / "manifest.json").is_file()
    assert json.loads((out / "lm" / "plain" / "seed1" / "manifest.json").read_text())["config"]["train"]["seed"] == 1
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["conditions"]}
    oracle = rows["oracle_seeded"]
    seed_ppls = [json.loads((out / "eval" / "oracle_seeded" / f"seed{s}" / "metrics.json").read_text())["ppl"]
                 for s in (0, 1)]
    assert oracle["ppl"] == pytest.approx(sum(seed_ppls) / 2) and oracle["evaluated_seeds"] == [0, 1]
    assert oracle["ppl_seed_min"] == min(seed_ppls) and oracle["ppl_seed_std"] > 0
    assert oracle["ppl_ci_low"] <= oracle["ppl_seed_mean_nll"] <= oracle["ppl_ci_high"]
    assert oracle["plan_usage_ppl"] is not None and rows["plain"]["plan_usage_ppl"] is None  # skipped for none
    assert oracle["paired_reference"] == "plain" and oracle["paired_diff"] is not None
    assert "over seeds [0, 1]" in (out / "report.md").read_text()
    capsys.readouterr()
    result = _cli(["compare", "--a", str(out / "eval" / "plain"), "--b", str(out / "eval" / "oracle_seeded")])
    assert result.returncode == 0 and "seed 0:" in result.stdout and "seed 1:" in result.stdout
    assert "over 2 seeds" in result.stdout
    for bad in ([], [1, 1]):
        with pytest.raises(PlanlmError, match=r"seeds .* each once"):
            run(**{**config, "seeds": bad})


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


def _dry_run(capsys, *args: str) -> str:
    """``planlm run ... --dry_run true`` in this process (a subprocess would import torch and Lightning again for
    each config: 15 s each); its stdout, after checking that it validated."""
    from planlm.cli import main

    capsys.readouterr()
    main(["run", *args, "--dry_run", "true"])
    out = capsys.readouterr().out
    assert "config valid" in out, out[-2000:]
    return out


def test_shipped_configs_validate_offline(tmp_path, capsys):
    root = Path(__file__).resolve().parents[2]
    for name in ("demo.yaml", "offline-full.yaml", "paper.yaml", "pretrained-offline.yaml"):
        _dry_run(capsys, "--config", str(root / "configs" / name), "--out_dir", str(tmp_path / name))
    from planlm.cli import main

    with pytest.raises(SystemExit) as printed:  # --print_config prints the merged config and exits
        main(["run", "--config", str(root / "configs" / "demo.yaml"), "--print_config"])
    assert printed.value.code in (0, None) and "conditions:" in capsys.readouterr().out
    # the joint-training overlay on the demo: its own run folder and conditions
    out = _dry_run(capsys, "--config", str(root / "configs" / "demo.yaml"), "--config",
                   str(root / "configs" / "demo-joint.yaml"), "--out_dir", str(tmp_path / "joint"))
    assert "train-lm ours_joint seed1" in out and "train-lm ours seed1" not in out


def test_one_planner_per_horizon_in_the_paper_config(tmp_path):
    """Cornille et al. is T = 1 read from a planner trained with horizon 1: conditions with equal planner
    sections share one planner, and a condition without one uses the shared planner."""
    from planlm.pipeline.run import plan_stages

    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "paper.yaml").read_text())
    stages = plan_stages(tmp_path, config["prepare"], config["planner"], config["lm"], config.get("base_lm"),
                         config["conditions"], config["evaluate"], config.get("edit_distance"), config.get("sweeps"),
                         where="paper.yaml")
    planners = {Path(s.kwargs["out_dir"]).name: s.kwargs["model"].horizon for s in stages
                if s.command == "train_planner"}
    assert planners == {"planner": 10, "cornille": 1, "T5K1": 5}
    planner_of = {s.condition: Path(s.kwargs["plans"].planner_dir).name for s in stages
                  if s.command == "train_lm" and s.kwargs["plans"].planner_dir}
    assert planner_of["cornille"] == planner_of["T1K10"] == "cornille" and planner_of["T5K10"] == "T5K1"
    assert planner_of["T10K10"] == "planner"


def test_sigterm_stops_the_run_instead_of_failing_one_condition(tiny_run, monkeypatch):
    """Lightning turns SIGTERM into SIGTERMException (a SystemExit): the run stops with status 143 and records
    the stage as interrupted; it used to be recorded as a failed condition and the run went on."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    pipeline = importlib.import_module("planlm.pipeline.run")  # the module (the package's `run` is the function)

    out, _ = tiny_run
    config = tiny_run_config(out)
    real = pipeline.load_command

    def load(command):
        function = real(command)

        @functools.wraps(function)  # the stage binding reads its signature
        def terminated(*args, **kwargs):
            raise SIGTERMException()
        return terminated if command == "edit_distance" else function

    monkeypatch.setattr(pipeline, "load_command", load)
    with pytest.raises(SystemExit) as stopped:
        run(**config)
    assert stopped.value.code == pipeline.TERMINATED
    stages = json.loads((out / "run_state.json").read_text())["stages"]
    interrupted = [name for name, s in stages.items() if s["status"] == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0].startswith("edit-distance") and list(stages)[-1] == interrupted[0]
