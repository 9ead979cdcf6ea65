"""experiments/joint_tables.py: the joint-training run's tables, on a made-up run folder with a known answer.
Seconds."""

from __future__ import annotations

import json

import pytest

from experiments import joint_tables
from tests.helpers import seeded_contrast

pytestmark = pytest.mark.lab  # a research script of experiments/: `pytest -m lab`

def _results():
    return {"contrasts": [seeded_contrast("ours_joint", "ours_expected", [-1.0, -0.5, -1.5], -2.0, -0.2),
                          seeded_contrast("cornille_joint", "cornille", [0.5, -0.5, 0.3], -1.0, +1.2),
                          seeded_contrast("ours_joint", "ours_joint_st", [0.4, 0.6, 0.5], +0.1, +0.9),
                          seeded_contrast("ours_joint_w0", "ours_expected", [0.0, 0.1, -0.1], -0.3, +0.3)],
            "conditions": [], "positions": []}


def _run(tmp_path, steps: dict[str, tuple[float, int]], resumed: tuple[str, int] | None = None):
    """A run folder with each condition's train-lm manifest (wall time, steps) for seeds 0-1."""
    for condition, (wall, step) in steps.items():
        for seed in (0, 1):
            folder = tmp_path / "lm" / condition / f"seed{seed}"
            folder.mkdir(parents=True)
            (folder / "manifest.json").write_text(json.dumps({"train_wall_time_s": wall * (1 + seed),
                                                              "global_step": step}))
    (tmp_path / "lm" / "ours_joint" / "seed2").mkdir()  # training, no manifest yet: not counted
    (tmp_path / "logs").mkdir()
    for condition in steps:  # a finished training whose run was restarted later: its stage reused, not resumed
        (tmp_path / "logs" / f"train-lm_{condition}_seed0.txt").write_text(
            "==== 2026-01-01 00:00:00\nfit\n==== 2026-01-01 01:00:00\n==== 2026-01-01 02:00:00\n")
    if resumed:
        (tmp_path / "logs" / f"train-lm_{resumed[0]}_seed{resumed[1]}.txt").write_text(
            "==== 2026-01-01 00:00:00\nfirst\n==== 2026-01-01 01:00:00\n"
            f"INFO: {joint_tables.RESTORED} path at lm/{resumed[0]}/seed{resumed[1]}/last.ckpt\nagain\n")
    (tmp_path / "results.json").write_text(json.dumps(_results()))
    return tmp_path


def test_contrasts_keep_the_preregistered_order_and_decide_by_the_interval():
    rows = joint_tables.contrast_rows(_results())
    assert [(r["b"], r["a"], r["role"]) for r in rows] == joint_tables.CONTRASTS
    table = joint_tables.contrasts_table(rows)
    assert len(table) == 2 + 4
    assert "| **-1.00 [-2.00, -0.20]** | -1.00 | -0.50 | -1.50 | 3 of 3 | yes |" in table[2]
    assert table[3].endswith("| 1 of 3 | not shown |")
    assert table[4].endswith("| 0 of 3 | no: A better |")
    with pytest.raises(SystemExit, match="no contrast ours_joint - ours_expected"):
        joint_tables.contrast_rows({"contrasts": []})


def test_the_cost_per_step_is_against_the_frozen_condition_and_leaves_out_resumed_trainings(tmp_path):
    run = _run(tmp_path, {"ours_expected": (100.0, 400), "ours_joint": (400.0, 400), "cornille": (50.0, 100),
                          "cornille_joint": (100.0, 100)}, resumed=("cornille_joint", 1))
    rows = {r["condition"]: r for r in joint_tables.cost_rows(run, ["ours_expected", "ours_joint", "cornille",
                                                                    "cornille_joint"])}
    assert rows["ours_expected"]["per_step"] == pytest.approx((0.25 + 0.5) / 2)
    assert rows["ours_joint"]["seeds"] == 2  # seed 2 has no manifest
    assert rows["cornille_joint"] == {"condition": "cornille_joint", "per_step": 1.0, "seeds": 1, "resumed": [1]}
    table = joint_tables.cost_table(list(rows.values()))
    assert "| ours, joint | 1.500 (2) | 4.00x ours, frozen |" in table
    assert "| Cornille et al., joint | 1.000 (1; seeds 1 resumed, left out) | 1.33x Cornille et al., frozen |" in table


def test_the_script_prints_the_tables_from_a_run_folder(tmp_path, capsys):
    run = _run(tmp_path, {"ours_expected": (100.0, 400), "ours_joint": (400.0, 400)})
    joint_tables.main(["--run", str(run), "--no_information"])
    out = capsys.readouterr().out
    assert out.count("### ") == 2 and "4.00x ours, frozen" in out  # contrasts and cost (no conditions here)


def test_the_conditions_table_names_the_reference_the_report_paired_with():
    """The joint run has no `none`: the report pairs every condition with Fixed, and the column says so."""
    condition = {"name": "ours_joint", "label": "ours, joint", "ppl": 212.0, "ppl_seed_min": 211.0,
                 "ppl_seed_max": 213.0, "paired_reference": "fixed", "paired_diff": -1.2, "paired_ci_low": -2.0,
                 "paired_ci_high": -0.4, "oracle_share": 0.2, "oracle_share_ci_low": 0.1,
                 "oracle_share_ci_high": 0.3, "plan_usage_ppl": 7.5}
    fixed = {"b": "ours_joint", "a": "fixed", "diff": -1.2, "ci_low": -2.0, "ci_high": -0.4}
    table = joint_tables.conditions_table({"conditions": [condition], "contrasts": [fixed]})
    assert table[0] == ("| model | PPL, mean over seeds [min, max] | - Fixed [95% CI] | share of the oracle's gain "
                        "[95% CI] | plan usage |") and table[1] == "|---|---|---|---|---|"
    assert table[2] == "| ours, joint | 212.00 [211.00, 213.00] | **-1.20 [-2.00, -0.40]** | 20% [10%, 30%] | 7.50 |"


def test_a_manifest_that_records_its_resumed_step_times_only_the_steps_since(tmp_path):
    run = _run(tmp_path, {"ours_expected": (100.0, 400), "ours_joint": (400.0, 400)}, resumed=("ours_joint", 1))
    for seed, first_step in ((0, 0), (1, 300)):  # seed 1 resumed at step 300: its 800 s trained 100 steps
        path = run / "lm" / "ours_joint" / f"seed{seed}" / "manifest.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "resumed_from_step": first_step}))
    rows = {r["condition"]: r for r in joint_tables.cost_rows(run, ["ours_expected", "ours_joint"])}
    assert rows["ours_joint"] == {"condition": "ours_joint", "per_step": pytest.approx((1.0 + 8.0) / 2), "seeds": 2,
                                  "resumed": []}
