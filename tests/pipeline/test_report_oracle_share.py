"""The report's share of the oracle's gain: every planned condition's (ppl - Fixed) / (oracle - Fixed), with its
interval, in the results table and results.json, when the run has a fixed and an oracle condition (the kinds' flags
say which conditions these are)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planlm.evaluate.bootstrap import oracle_gain_share, write_per_article
from planlm.pipeline.layout import RunLayout
from planlm.pipeline.report import write_report
from planlm.pipeline.results import collect_results
from planlm.pipeline.tables import results_table
from planlm.plans.kinds import PlanKind
from planlm.plans.registry import KINDS, register_plan_kind

TOKENS = np.full(24, 80)
SOURCES = [f"speech{i // 3}" for i in range(24)]  # 8 documents of 3 pieces


def write_evaluation(folder, nll: np.ndarray, conditioning: str) -> None:
    folder.mkdir(parents=True)
    write_per_article(folder / "per_article.csv", [
        {"article": i, "id": f"{SOURCES[i]}#{i % 3}", "nll_sum": repr(float(n)), "tokens": int(t)}
        for i, (n, t) in enumerate(zip(nll, TOKENS))])  # no source column given: read back from the ids
    (folder / "metrics.json").write_text(json.dumps({
        "ppl": float(np.exp(nll.sum() / TOKENS.sum())), "ci_low": 1.0, "ci_high": 2.0, "conditioning": conditioning,
        "K": 1, "T": 1, "tau": 1.0, "tokens": int(TOKENS.sum()), "articles": 24, "protocol": "test"}))


def test_share_of_the_oracle_gain_for_every_planned_condition(tmp_path):
    layout = RunLayout(tmp_path / "run")
    rng = np.random.default_rng(0)
    level = 3.0 + rng.normal(0, 0.1, 8)[np.arange(24) // 3]
    gains = {"none": 0.0, "fixed": 0.01, "ours": 0.06, "oracle": 0.21}
    kinds = {"none": "none", "fixed": "fixed", "ours": "planner_sampled", "oracle": "oracle"}
    nll = {}
    for seed in (0, 1):
        for name, gain in gains.items():
            nll[name, seed] = (level - gain - rng.normal(0, 0.005, 24)) * TOKENS
            write_evaluation(layout.evaluation(name) / f"seed{seed}", nll[name, seed], kinds[name])
    conditions = [{"name": name} for name in gains]
    rows = {r["name"]: r for r in collect_results(layout.root, conditions, None, [0, 1])}
    ours = rows["ours"]
    expected = oracle_gain_share(*(np.stack([nll[name, 0], nll[name, 1]]) for name in ("fixed", "ours", "oracle")),
                                 TOKENS, clusters=SOURCES)
    assert ours["oracle_share"] == pytest.approx(expected["share"]) and 0.2 < ours["oracle_share"] < 0.3
    assert ours["oracle_share_ci_low"] == pytest.approx(expected["ci_low"])
    assert ours["oracle_share_ci_low"] < ours["oracle_share"] < ours["oracle_share_ci_high"]
    assert ours["oracle_share_of"] == ["fixed", "oracle"]
    assert all(rows[name]["oracle_share"] is None for name in ("none", "fixed", "oracle"))
    line = next(line for line in results_table(list(rows.values())) if line.startswith("| ours |"))
    assert f"| {ours['oracle_share']:.0%} [{ours['oracle_share_ci_low']:.0%}, {ours['oracle_share_ci_high']:.0%}] |" \
        in line
    write_report(layout.root, conditions=conditions, seeds=[0, 1], actions_shown=0)
    saved = {r["name"]: r for r in json.loads(layout.results_json.read_text())["conditions"]}
    assert saved["ours"]["oracle_share"] == pytest.approx(ours["oracle_share"])
    assert "share of the oracle's gain over Fixed [95% CI]" in layout.report.read_text()


def test_no_share_column_without_a_fixed_condition(tmp_path):
    layout = RunLayout(tmp_path / "run")
    for name, kind in (("none", "none"), ("ours", "planner_sampled"), ("oracle", "oracle")):
        write_evaluation(layout.evaluation(name), np.full(24, 3.0) * TOKENS, kind)
    rows = collect_results(layout.root, [{"name": n} for n in ("none", "ours", "oracle")])
    assert all(r["oracle_share"] is None for r in rows)
    assert "share of the oracle" not in results_table(rows)[0]


class Toy(PlanKind):
    """A kind registered by the test: only its flags count here (the report makes no plans)."""

    def plan(self, boundaries, plans, rng, planner=None):
        raise AssertionError("the report makes no plans")


@pytest.fixture
def toy_kinds():
    kinds = {"zeros": {"constant": True}, "peek": {"reads_future": True}, "guess": {"uses_planner": True}}
    for name, flags in kinds.items():
        register_plan_kind(type(f"Toy_{name}", (Toy,), {"name": name, **flags})())
    yield
    for name in kinds:
        KINDS.pop(name)


def test_the_share_reads_the_kinds_flags_not_their_names(tmp_path, toy_kinds):
    """Floor, ceiling and the conditions that get a share are the kinds with constant plans, with the true future
    and with a planner, whatever their names; a kind this process has not registered gets no share."""
    layout = RunLayout(tmp_path / "run")
    rng = np.random.default_rng(0)
    level = 3.0 + rng.normal(0, 0.1, 8)[np.arange(24) // 3]
    gains = {"floor": ("zeros", 0.01), "mine": ("guess", 0.06), "elsewhere": ("unregistered", 0.06),
             "ceiling": ("peek", 0.21)}
    for seed in (0, 1):
        for name, (kind, gain) in gains.items():
            write_evaluation(layout.evaluation(name) / f"seed{seed}",
                             (level - gain - rng.normal(0, 0.005, 24)) * TOKENS, kind)
    rows = {r["name"]: r for r in collect_results(layout.root, [{"name": n} for n in gains], None, [0, 1])}
    assert rows["mine"]["oracle_share_of"] == ["floor", "ceiling"] and 0.2 < rows["mine"]["oracle_share"] < 0.3
    assert all(rows[name]["oracle_share"] is None for name in ("floor", "elsewhere", "ceiling"))
