"""experiments/evidence_tables.py: the evidence run's tables from its results.json, on a made-up run with a known
answer. Seconds."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from experiments import evidence_tables, power_analysis
from tests.helpers import seeded_contrast

pytestmark = pytest.mark.lab  # a research script of experiments/: `pytest -m lab`

SEEDS = ["0", "1", "2"]


def _results():
    contrasts = [seeded_contrast("oracle", "fixed", [-6.0, -7.0, -5.0], -8.0, -4.0),
                 seeded_contrast("ours", "fixed", [-1.0, -0.5, -1.5], -2.0, -0.1),
                 seeded_contrast("cornille", "fixed", [-1.0, 0.5, -0.5], -2.5, +1.5),
                 seeded_contrast("ours", "ours_t1", [0.2, -0.2, 0.3], -0.5, +0.7),
                 seeded_contrast("ours", "ours_pa", [0.0, 0.01, -0.01], -0.05, +0.05),
                 seeded_contrast("ours", "cornille", [1.0, 1.5, 0.5], +0.2, +2.0)]
    points = [{"value": k, "K": k, "T": 5, "tau": 1.0, "ppl": 200.0 - k / 10,
               "seed_diffs": dict(zip(SEEDS, [0.0] * 3 if k == 1 else [-k / 10] * 3)),
               "diff": 0.0 if k == 1 else -k / 10, "ci_low": 0.0 if k == 1 else -k / 10 - 0.1,
               "ci_high": 0.0 if k == 1 else -k / 10 + 0.05} for k in (1, 5, 20)]
    return {"contrasts": contrasts, "conditions": [], "positions": [],
            "sweeps": [{"kind": "num_paths", "reference": 1, "seeds": SEEDS, "points": points}]}


def test_the_claims_table_decides_each_claim_by_its_interval_and_counts_the_seeds():
    rows = evidence_tables.claim_rows(_results())
    verdicts = {(r["b"], r["a"]): evidence_tables.verdict(r) for r in rows}
    assert verdicts == {("oracle", "fixed"): "yes", ("ours", "fixed"): "yes", ("cornille", "fixed"): "not shown",
                        ("K=20", "K=1"): "yes", ("ours", "ours_t1"): "no difference shown",
                        ("ours", "ours_pa"): "no difference shown", ("ours", "cornille"): "no: A better"}
    k = next(r for r in rows if r["b"] == "K=20")
    assert k["diff"] == pytest.approx(-2.0) and k["seed_diffs"] == {"0": -2.0, "1": -2.0, "2": -2.0}
    readme = evidence_tables.claims_table(rows, evidence_tables.README_CLAIMS)
    assert len(readme) == 2 + 6 and not any("Project and Avg" in line for line in readme)
    assert "| 2 of 3 |" in next(line for line in readme if "Cornille et al. - Fixed" in line)
    every = evidence_tables.contrasts_table(rows)
    assert len(every) == 2 + 7 and "| -1.00 | +0.50 | -0.50 |" in every[4]


def test_the_spread_splits_the_whole_methods_seed_variance_into_the_lms_and_the_rest():
    rows = evidence_tables.spread_rows(evidence_tables.claim_rows(_results()))
    ours = next(r for r in rows if (r["b"], r["a"]) == ("ours", "fixed"))
    known = next(c for c in power_analysis.CONTRASTS if c.name == "ours - Fixed")
    groups = [list(iv.per_seed) for iv in known.intervals]
    lm_var = sum((len(g) - 1) * np.var(g, ddof=1) for g in groups) / sum(len(g) - 1 for g in groups)
    assert ours["method_sd"] == pytest.approx(0.5)
    assert ours["lm_sd"] == pytest.approx(math.sqrt(lm_var))
    assert ours["planner_sd"] ** 2 + lm_var == pytest.approx(0.25)
    assert next(r for r in rows if r["b"] == "K=20")["lm_sd"] is None  # one seed measured before: no LM-only sd


def test_the_script_prints_every_table_from_a_run_folder(tmp_path, capsys):
    (tmp_path / "results.json").write_text(json.dumps(_results()))
    evidence_tables.main(["--run", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.count("### ") == 4  # claims, contrasts, sweep, spread (no conditions nor positions in this run)
    with pytest.raises(SystemExit, match="no results.json"):
        evidence_tables.main(["--run", str(tmp_path / "missing")])


def test_a_second_run_is_shown_beside_the_first_contrast_byseeded_contrast():
    results, other = _results(), _results()
    other["contrasts"][1] = seeded_contrast("ours", "fixed", [-2.0, -1.5, -2.5], -3.0, -1.0)
    table = evidence_tables.overlay_tables(results, other, evidence_tables.claim_rows(results))
    ours = next(line for line in table if line.startswith("| ours - Fixed"))
    assert "**-1.00 [-2.00, -0.10]** | **-2.00 [-3.00, -1.00]** | -2.00, -1.50, -2.50 |" in ours
    assert len(table) == 2 + 7


def _information(first: float, last: float, unigram: float = 4.1) -> dict:
    return {"unigram_nll": [unigram] * 5, "teacher_forced": {"nats": [first] + [first - 0.05] * 4},
            "free_running": {"nats": [first, 0.5, 0.4, 0.3, last]}}


def test_the_planners_information_of_two_runs_is_shown_with_every_seed():
    runs = {"runs/a": {"ours' planner": {0: _information(0.8, 0.2), 1: _information(0.7, 0.1)},
                       "Cornille et al.'s planner": {}},
            "runs/b": {"ours' planner": {0: _information(1.0, 0.4, 4.0), 1: _information(1.2, 0.3, 4.2)}}}
    table = evidence_tables.information_table(runs)
    assert len(table) == 2 + 2  # a planner without seeds gets no row
    assert table[2] == "| runs/a | ours' planner | 4.100 | **0.750** (0.800, 0.700) | 0.150 (step 5) |"
    assert table[3] == "| runs/b | ours' planner | 4.100 | **1.100** (1.000, 1.200) | 0.350 (step 5) |"
    assert evidence_tables.information_table({"runs/a": {"ours' planner": {}}}) == []
