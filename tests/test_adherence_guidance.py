"""experiments/adherence_guidance.py --tables: the results page's tables from a finished output folder, on made-up
metrics with a known answer."""

from __future__ import annotations

import json

import pytest

from experiments import adherence_guidance

pytestmark = pytest.mark.lab  # a research script of experiments/: `pytest -m lab`


def _stat(seeds: list[float]) -> dict:
    mean = sum(seeds) / len(seeds)
    return {"mean": mean, "ci_low": mean - 0.01, "ci_high": mean + 0.01, "seeds": seeds}


def _metrics(hit: float) -> dict:
    row = {"adherence": _stat([hit, hit + 0.02]), "of_asked": _stat([hit / 2, hit / 2]), "top5": _stat([0.3, 0.3]),
           "chance": _stat([0.02, 0.02]), "over_chance": _stat([hit / 0.02, (hit + 0.02) / 0.02]),
           "sentences": [150, 160], "sentences_asked": 200}
    return {"outline": row, "shuffled": row, "shuffled_asked": row}


def test_the_tables_show_every_seed_and_the_paired_difference(tmp_path):
    folders = {}
    for w, hit in (("1", 0.05), ("3", 0.15)):
        folder = tmp_path / f"test-oracle-w{w}"
        folder.mkdir()
        (folder / "metrics.json").write_text(json.dumps(_metrics(hit)))
        folders[w] = str(folder)
    difference = {"outline": {"adherence": _stat([0.1, 0.1]), "of_asked": _stat([0.05, 0.05])}}
    (tmp_path / "summary.json").write_text(json.dumps({"validation": {"1": 0.04, "3": 0.09}, "chosen": 3.0,
                                                       "test": {"oracle": {"folders": folders, "difference": difference}}}))
    text = adherence_guidance.results_tables(tmp_path)
    assert "w = 1: 4.0%, w = 3: 9.0%; chosen w = 3" in text
    rows = [line for line in text.splitlines() if line.startswith("| oracle | ")]
    assert len(rows) == 2 * 3 + 1  # three conditions at two weights, one paired difference
    assert rows[0].startswith("| oracle | 1 | outline | 6.0% [5.0, 7.0] (5.0 / 7.0) | 2.5% [1.5, 3.5] (2.5 / 2.5) |")
    assert rows[3].startswith("| oracle | 3 | outline | 16.0% [15.0, 17.0] (15.0 / 17.0) |")
    assert "| 8.0x [8.0, 8.0] (7.5 / 8.5) | 150 / 160 of 200 |" in rows[3]
    assert rows[-1] == "| oracle | outline | +10.0 [+9.0, +11.0] | +5.0 [+4.0, +6.0] |"
