"""The report of a run folder: rows read through RunLayout, paired differences against `none`, statuses."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from planlm.evaluate.bootstrap import write_per_article
from planlm.pipeline.layout import RunLayout
from planlm.pipeline.report import collect_results, results_table, write_report

TOKENS = np.full(20, 50)


def write_evaluation(folder, nll_per_token: float, conditioning: str, shift: np.ndarray) -> None:
    """An evaluation folder of 20 articles of 50 tokens: per-article NLL sums and metrics.json."""
    folder.mkdir(parents=True)
    nll = (nll_per_token + shift) * TOKENS
    write_per_article(folder / "per_article.csv", [{"article": i, "id": f"doc{i}", "nll_sum": repr(float(n)),
                                                    "tokens": int(t)} for i, (n, t) in enumerate(zip(nll, TOKENS))])
    ppl = math.exp(nll.sum() / TOKENS.sum())
    (folder / "metrics.json").write_text(json.dumps({
        "ppl": ppl, "ci_low": ppl - 1, "ci_high": ppl + 1, "conditioning": conditioning, "K": 1, "T": 1, "tau": 1.0,
        "tokens": int(TOKENS.sum()), "articles": 20, "protocol": "test", "wall_time_s": 2.0, "tokens_per_s": 500.0}))


@pytest.fixture
def run_dir(tmp_path):
    layout = RunLayout(tmp_path / "run")
    shift = np.random.default_rng(0).normal(0, 0.05, 20)
    write_evaluation(layout.evaluation("none"), 3.0, "none", shift)
    write_evaluation(layout.evaluation("oracle"), 2.9, "oracle", shift)  # 0.1 nats better on every article
    return layout.root


def test_rows_pair_every_condition_with_none_and_mark_missing_and_failed(run_dir):
    conditions = [{"name": "none"}, {"name": "oracle", "label": "Oracle"}, {"name": "ours"}, {"name": "broken"}]
    state = {"stages": {"train-lm broken": {"status": "failed", "error": "boom", "condition": "broken"}}}
    rows = {r["name"]: r for r in collect_results(run_dir, conditions, state)}
    none, oracle = rows["none"], rows["oracle"]
    assert oracle["paired_reference"] == "none" and none["paired_diff"] is None
    assert oracle["paired_diff"] == pytest.approx(oracle["ppl"] - none["ppl"], rel=1e-9)
    assert oracle["paired_ci_low"] <= oracle["paired_diff"] <= oracle["paired_ci_high"] < 0
    assert rows["ours"]["status"] == "missing" and rows["broken"]["status"] == "failed"
    assert "train-lm broken: boom" in rows["broken"]["error"]
    table = results_table(list(rows.values()))
    assert table[0].startswith("| Model | conditioning |") and any(line.startswith("| Oracle | oracle |")
                                                                  for line in table)
    assert any("failed" in line for line in table)


def test_write_report_writes_the_table_and_the_results(run_dir):
    path = write_report(run_dir, conditions=[{"name": "none"}, {"name": "oracle"}])
    text = path.read_text()
    assert "| oracle | oracle |" in text
    results = json.loads((RunLayout(run_dir).root / "results.json").read_text())
    assert {row["name"] for row in results["conditions"]} == {"none", "oracle"}


def test_paired_column_of_a_run_with_seeds_carries_seed_noise_and_shows_each_seed(tmp_path):
    layout = RunLayout(tmp_path / "run")
    shift = np.random.default_rng(0).normal(0, 0.05, 20)
    for seed, gain in enumerate([0.0, 0.1]):  # the seeds disagree: oracle gains 0 or 0.1 nats
        write_evaluation(layout.evaluation("none") / f"seed{seed}", 3.0, "none", shift)
        write_evaluation(layout.evaluation("oracle") / f"seed{seed}", 3.0 - gain, "oracle", shift)
    rows = {r["name"]: r for r in collect_results(layout.root, [{"name": "none"}, {"name": "oracle"}], None, [0, 1])}
    oracle = rows["oracle"]
    assert oracle["paired_interval"] == "seeds and articles"
    assert oracle["paired_ci_low"] <= oracle["paired_seed_diffs"][1] < oracle["paired_seed_diffs"][0] == 0.0
    line = next(line for line in results_table(list(rows.values())) if line.startswith("| oracle"))
    assert f"(seeds: +0.00, {oracle['paired_seed_diffs'][1]:+.2f})" in line
