"""The report of a run folder: rows read through RunLayout, paired differences against `none`, statuses."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from planlm.evaluate.bootstrap import write_per_article
from planlm.pipeline.layout import RunLayout
from planlm.pipeline.report import write_report
from planlm.pipeline.results import collect_results
from planlm.pipeline.tables import results_table
from tests.helpers import seeded_contrast

TOKENS = np.full(20, 50)


def write_evaluation(folder, nll_per_token: float, conditioning: str, shift: np.ndarray, document: str = "") -> None:
    """An evaluation folder of 20 articles of 50 tokens: per-article NLL sums and metrics.json; each article its own
    source document, or all 20 pieces of one ``document``."""
    folder.mkdir(parents=True)
    nll = (nll_per_token + shift) * TOKENS
    ids = [f"{document}#{i}" if document else f"doc{i}" for i in range(len(TOKENS))]
    write_per_article(folder / "per_article.csv", [{"article": i, "id": ids[i], "nll_sum": repr(float(n)),
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


def test_evaluation_time_is_relative_to_the_one_argmax_path_whatever_its_label(tmp_path):
    layout = RunLayout(tmp_path / "run")
    shift = np.zeros(20)
    for name, seconds in (("none", 1.0), ("joint", 3.0), ("argmax", 4.0), ("ours", 8.0)):
        write_evaluation(layout.evaluation(name), 3.0, "x", shift)
        metrics = layout.evaluation(name) / "metrics.json"
        metrics.write_text(json.dumps({**json.loads(metrics.read_text()), "wall_time_s": seconds}))
    argmax = {"kind": "planner_argmax", "num_paths": 1, "horizon": 1}
    conditions = [{"name": "none", "plans": {"kind": "none"}},
                  {"name": "joint", "plans": argmax, "train": {"joint": True}},  # not the frozen baseline
                  {"name": "argmax", "paper": "some other label", "plans": argmax},
                  {"name": "ours", "plans": {"kind": "planner_sampled", "num_paths": 5}}]
    rows = {r["name"]: r["relative_eval_time"] for r in collect_results(layout.root, conditions)}
    assert rows == {"none": 0.25, "joint": 0.75, "argmax": 1.0, "ours": 2.0}
    # without that role the first timed condition is the reference
    rows = {r["name"]: r["relative_eval_time"] for r in collect_results(layout.root, conditions[:2] + conditions[3:])}
    assert rows == {"none": 1.0, "joint": 3.0, "ours": 8.0}


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


def _planner_summary(folder, unigram_nll: list[float], planner_nll: list[float]) -> None:
    """A planner folder's summary.json as train-planner writes it, before the information was stored."""
    folder.mkdir(parents=True)
    nll = {"top1": [0.1] * len(planner_nll), "top5": [0.3] * len(planner_nll), "count": [9] * len(planner_nll)}
    metrics = {"planner_teacher_forced": {**nll, "nll": planner_nll},
               "planner_free_running": {**nll, "nll": [n + 0.5 for n in planner_nll]},
               "unigram": {**nll, "nll": unigram_nll}}
    (folder / "summary.json").write_text(json.dumps({"horizon": len(planner_nll), "metrics": metrics,
                                                     "num_boundaries": 9, "eval_split": "validation"}))


def test_report_and_results_give_every_planners_information_per_step(run_dir):
    layout = RunLayout(run_dir)
    _planner_summary(layout.planner, [4.0, 4.0], [3.0, 3.5])
    _planner_summary(layout.own_planner("cornille"), [4.0], [3.6])
    text = write_report(run_dir, conditions=[{"name": "none"}, {"name": "oracle"}]).read_text()
    assert "## Planner information per horizon step" in text
    assert "| 1 | 4.000 | +1.000 (25.0%) | +0.500 (12.5%) |" in text  # shared planner, step 1
    assert "| 2 | 4.000 | +0.500 (12.5%) | +0.000 (0.0%) |" in text
    assert "Planner `cornille`" in text and "| 1 | 4.000 | +0.400 (10.0%) | -0.100 (-2.5%) |" in text
    planners = json.loads(layout.results_json.read_text())["planners"]
    assert planners["shared"]["information"]["teacher_forced"]["nats"] == pytest.approx([1.0, 0.5])
    assert planners["cornille"]["information"]["free_running"]["share"] == pytest.approx([-0.025])


def test_contrasts_pair_two_conditions_with_seed_noise_and_a_bad_pair_is_refused(tmp_path):
    from planlm.errors import PlanlmError
    from planlm.pipeline.run import run

    layout = RunLayout(tmp_path / "run")
    shift = np.random.default_rng(0).normal(0, 0.05, 20)
    for seed, gain in enumerate([0.045, 0.04]):  # two seeds that agree: the t interval on 1 df excludes 0
        write_evaluation(layout.evaluation("cornille") / f"seed{seed}", 3.0, "planner_argmax", shift)
        write_evaluation(layout.evaluation("ours") / f"seed{seed}", 3.0 - gain, "planner_sampled", shift)
    conditions = [{"name": "cornille"}, {"name": "ours"}]
    text = write_report(layout.root, conditions=conditions, seeds=[0, 1], contrasts=[["ours", "cornille"]]).read_text()
    contrast = json.loads(layout.results_json.read_text())["contrasts"][0]
    assert (contrast["b"], contrast["a"], contrast["interval"]) == ("ours", "cornille", "seeds and articles")
    assert contrast["ci_low"] <= contrast["seed_diffs"]["0"] < contrast["seed_diffs"]["1"] < contrast["ci_high"] < 0
    assert contrast["relative"] == pytest.approx(math.exp(-0.0425) - 1, abs=2e-3)
    assert "## Paired contrasts" in text and "| ours - cornille |" in text
    assert "| ours better |" in text and "This run decides 1 of its 1 contrasts (ours - cornille)." in text
    with pytest.raises(PlanlmError, match=r"\['ours', 'fixed'\] is not a pair"):
        write_report(layout.root, conditions=conditions, seeds=[0, 1], contrasts=[["ours", "fixed"]])
    with pytest.raises(PlanlmError, match="report.contrasts"):  # refused before any stage runs
        run(out_dir=str(tmp_path / "bad"), conditions=conditions, report={"contrasts": [["ours", "fixed"]]})
    assert not (tmp_path / "bad").exists()


def test_a_contrast_is_decided_when_its_interval_excludes_0():
    from planlm.pipeline.results import decision

    def contrast(low, high, diffs=(-1.0, -0.5), documents=30):
        return seeded_contrast("ours", "fixed", list(diffs), low, high) | {"documents": documents}

    assert decision(contrast(-2.0, -0.1)) == "ours better"
    assert decision(contrast(0.1, 2.0)) == "fixed better"
    assert decision(contrast(-2.0, 0.5)) == "no"
    # An interval that carries no noise cannot decide, whichever side of 0 it lies.
    assert decision(contrast(-2.0, -0.1, diffs=[-1.0])) == "cannot: 1 seed, so no seed noise"
    assert decision(contrast(-2.0, -0.1, documents=1)) == "cannot: 1 source document, so no document noise"
    assert decision(contrast(-0.7, -0.7)) == "cannot: an interval of zero width"
    assert decision(contrast(7.66, 7.66, diffs=[7.66], documents=1)) == (
        "cannot: 1 seed, so no seed noise; 1 source document, so no document noise; an interval of zero width")
    single = {"b": "ours", "a": "fixed", "ci_low": -2.0, "ci_high": -0.1, "seed_diffs": None}  # no seed<N>/ folders
    assert decision(single) == "cannot: 1 seed, so no seed noise"


@pytest.mark.parametrize("seeds, document, why", [
    ([None], "", "1 seed, so no seed noise"),
    ([0, 1], "speech", "1 source document, so no document noise"),
    ([None], "speech", "1 seed, so no seed noise; 1 source document, so no document noise; an interval of zero width"),
])
def test_a_run_of_one_seed_or_one_document_decides_nothing_and_says_why(tmp_path, seeds, document, why):
    layout = RunLayout(tmp_path / "run")
    shift = np.random.default_rng(0).normal(0, 0.05, 20)
    for seed in seeds:  # fixed is 0.5 nats worse on every piece and seed: a gap no interval of noise would cross
        folder = (lambda name: layout.evaluation(name) / f"seed{seed}") if seed is not None else layout.evaluation
        write_evaluation(folder("ours"), 3.0, "planner_sampled", shift, document)
        write_evaluation(folder("fixed"), 3.5, "constant", shift + 0.01 * (seed or 0), document)
    text = write_report(layout.root, conditions=[{"name": "fixed"}, {"name": "ours"}],
                        seeds=None if seeds == [None] else seeds, contrasts=[["ours", "fixed"]]).read_text()
    contrast = json.loads(layout.results_json.read_text())["contrasts"][0]
    assert contrast["diff"] < 0 and contrast["decided"] == f"cannot: {why}"
    assert contrast["documents"] == (1 if document else 20)
    line = next(line for line in text.splitlines() if line.startswith("| ours - fixed |"))
    assert f"| cannot: {why} |" in line and "better" not in line
    assert f"This run decides 0 of its 1 contrasts; 1 cannot be decided ({why})." in text


def test_the_report_measures_a_planners_information_on_the_test_split(synthetic_cycle, tmp_path):
    """The validation split chose the planner's checkpoint: the report measures its information on test."""
    from planlm.data.artifacts import PreparedDataset
    from planlm.train.planner_metrics import baseline_metrics, evaluate_planner, planner_information

    from helpers import tiny_planner

    layout = RunLayout(tmp_path / "run")
    prepared = PreparedDataset(synthetic_cycle)
    planner = tiny_planner(prepared)
    _planner_summary(layout.planner, [4.0, 4.0, 4.0], [3.0, 3.5, 3.9])  # the summary's own: on validation
    planner.save_pretrained(layout.planner)
    summary = json.loads((layout.planner / "summary.json").read_text())
    (layout.planner / "summary.json").write_text(json.dumps({**summary, "prepared_dir": str(synthetic_cycle),
                                                             "train_split": "train"}))
    text = write_report(layout.root, conditions=[{"name": "none"}]).read_text()
    planners = json.loads(layout.results_json.read_text())["planners"]
    measured = {}
    for split in ("test", "validation"):
        metrics = evaluate_planner(planner, prepared[split], 3)
        metrics.update(baseline_metrics(prepared["train"], prepared[split], 3, prepared.num_actions))
        measured[split] = planner_information(metrics)
    assert planners["shared"]["information_split"] == "test"
    assert planners["shared"]["information"]["teacher_forced"]["nats"] == pytest.approx(
        measured["test"]["teacher_forced"]["nats"])
    assert measured["test"]["teacher_forced"]["nats"] != pytest.approx(measured["validation"]["teacher_forced"]["nats"])
    assert "Planner `shared` (horizon 3, recurrent g; on the test split)" in text


def write_positioned_evaluation(folder, conditioning: str, nll_per_cell: np.ndarray, tokens: np.ndarray) -> None:
    """An evaluation folder whose per_article.csv sums its per_article_positions.csv: nll_per_cell and tokens
    (N_art, C) each article's NLL per token and scored tokens in every cell."""
    from planlm.evaluate.positions import PER_ARTICLE_POSITIONS, write_positions

    folder.mkdir(parents=True)
    nll = nll_per_cell * tokens
    write_per_article(folder / "per_article.csv", [{"article": i, "id": f"doc{i}", "nll_sum": repr(float(n)),
                                                    "tokens": int(t)} for i, (n, t) in enumerate(zip(nll.sum(1),
                                                                                                      tokens.sum(1)))])
    write_positions(folder / PER_ARTICLE_POSITIONS, [f"doc{i}" for i in range(len(tokens))], nll, tokens)
    ppl = math.exp(nll.sum() / tokens.sum())
    (folder / "metrics.json").write_text(json.dumps({
        "ppl": ppl, "ci_low": ppl - 1, "ci_high": ppl + 1, "conditioning": conditioning, "K": 1, "T": 1, "tau": 1.0,
        "tokens": int(tokens.sum()), "articles": len(tokens), "protocol": "test"}))


def test_where_plans_act_shows_each_bins_paired_difference_with_seeds_and_intervals(tmp_path):
    from planlm.evaluate.positions import CELLS

    layout = RunLayout(tmp_path / "run")
    per_cell = {("first", "inside"): 3, ("first", "near"): 2, ("early", "inside"): 10, ("early", "near"): 5,
                ("late", "inside"): 20, ("late", "near"): 10}  # no token has a window's length fallen out
    tokens = np.tile([per_cell.get(cell, 0) for cell in CELLS], (20, 1))  # (20 articles, C)
    first = np.array([p == "first" for p, _ in CELLS])
    rng = np.random.default_rng(0)
    base = 3.0 + rng.normal(0, 0.05, tokens.shape)
    for seed, gain in enumerate([0.24, 0.26]):  # the oracle gains only on the first token of a sentence
        write_positioned_evaluation(layout.evaluation("none") / f"seed{seed}", "none", base, tokens)
        write_positioned_evaluation(layout.evaluation("fixed") / f"seed{seed}", "fixed", base + 0.01, tokens)
        write_positioned_evaluation(layout.evaluation("oracle") / f"seed{seed}", "oracle", base - gain * first, tokens)
    (layout.evaluation("old") / "seed0").mkdir(parents=True)
    write_per_article(layout.evaluation("old") / "seed0" / "per_article.csv", [
        {"article": i, "id": f"doc{i}", "nll_sum": repr(float(n)), "tokens": int(t)}
        for i, (n, t) in enumerate(zip((base * tokens).sum(1), tokens.sum(1)))])  # before the position table
    (layout.evaluation("old") / "seed0" / "metrics.json").write_text(json.dumps({"ppl": 20.0,
                                                                                "conditioning": "oracle"}))
    conditions = [{"name": "none"}, {"name": "fixed"}, {"name": "oracle"}, {"name": "old"}]
    text = write_report(layout.root, conditions=conditions, seeds=[0, 1]).read_text()
    section = text.split("## Where plans act")[1].split("\n## ")[0]
    rows = {line.split(" | ")[0][2:]: line for line in section.splitlines() if line.startswith("| ")}
    assert set(rows) == {"B - A", "oracle - fixed", "oracle - none", "old - fixed", "old - none"}
    assert "n/a: eval/old/seed0 evaluated before the position table" in rows["old - none"]
    positions = {(p["b"], p["a"]): p for p in json.loads(layout.results_json.read_text())["positions"]}
    bins = positions[("oracle", "none")]["bins"]
    assert bins["first"]["diff"] == pytest.approx(-0.25) and bins["first"]["seed_diffs"] == pytest.approx(
        {"0": -0.24, "1": -0.26})
    assert bins["first"]["ci_low"] < -0.3 and -0.2 < bins["first"]["ci_high"] < 0  # t on 1 degree of freedom
    assert bins["late"]["diff"] == pytest.approx(0.0, abs=1e-12) and bins["far"]["diff"] is None
    assert bins["all"]["diff"] == pytest.approx(-0.25 * 5 / 50) and bins["first"]["share"] == pytest.approx(0.1)
    assert "+0.0000" in rows["oracle - none"] or "-0.0000" in rows["oracle - none"]
    assert "-0.2500 [" in rows["oracle - none"] and "(seeds: -0.2400, -0.2600)" in rows["oracle - none"]
    assert "no tokens" in rows["oracle - none"] and "token 1 (10.0%)" in section
