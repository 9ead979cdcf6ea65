"""experiments/adherence_guidance.py: the validation rule (requested sentences realised, an unfinished one a miss)
picks a weight from real `planlm adherence` folders."""

from __future__ import annotations

import csv

import pytest

from experiments.adherence_guidance import choose_weight
from planlm.data.artifacts import PreparedDataset
from planlm.stage import read_manifest

from helpers import chatty_planned_lm

pytestmark = pytest.mark.lab  # a research script of experiments/: `pytest -m lab`


def test_the_rule_counts_hits_over_sentences_asked_and_picks_the_best_weight(synthetic_random, tmp_path):
    chatty_planned_lm(PreparedDataset(synthetic_random)).save_pretrained(tmp_path / "oracle")
    best, scores = choose_weight(tmp_path / "oracle", str(synthetic_random), tmp_path / "out", [1.0, 4.0])
    assert best == max(scores, key=scores.get) and set(scores) == {1.0, 4.0}
    for w, score in scores.items():
        folder = tmp_path / "out" / f"val-w{w:g}"
        with open(folder / "per_sentence.csv") as f:
            hits = sum(r["requested"] == r["realised"] for r in csv.DictReader(f) if r["condition"] == "outline")
        asked = sum(len(task["actions"]) for task in read_manifest(folder)["config"]["tasks"])
        assert score == pytest.approx(hits / asked)  # an unfinished sentence is a miss, not left out
        assert read_manifest(folder)["config"]["split"] == "validation"
