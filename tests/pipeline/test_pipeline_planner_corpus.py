"""`planlm run --config BASE --config OVERLAY` with `prepare.planner_corpus` (issue 36): the planner trains on more
documents than the LM, end to end on a tiny config."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml

from helpers import tiny_run_config
from planlm.cli import main as cli_main
from planlm.data.artifacts import PreparedDataset
from planlm.data.corpus import CorpusConfig, Skips, read_articles
from planlm.stage import read_manifest


def test_run_with_a_planner_corpus_overlay(tmp_path):
    out = tmp_path / "run"
    config = tiny_run_config(out, edit_distance=None, sweeps=[],
                             conditions=[{"name": "none", "plans": {"kind": "none"}},
                                         {"name": "ours", "plans": {"kind": "planner_sampled", "num_paths": 2,
                                                                    "horizon": 2}, "adapter": {"kind": "multipath"}}])
    # 60 lead sections: 12 for the LM's training split, 12 held out, the rest for the planner alone
    corpus = tmp_path / "leads.jsonl"
    leads = itertools.islice(read_articles(CorpusConfig(source="wiki-offline"), Skips()), 60)
    corpus.write_text("".join(json.dumps(article) + "\n" for article in leads))
    config["prepare"]["corpus"] = {"source": str(corpus), "num_train": 12, "num_validation": 6, "num_test": 6}
    config["planner"]["train"]["max_epochs"] = 1
    config["lm"]["train"]["max_steps"] = 2
    base, overlay = tmp_path / "base.yaml", tmp_path / "bigplanner.yaml"
    base.write_text(yaml.safe_dump(config))
    # a second --config replaces whole sections: the overlay repeats prepare (as configs/demo-bigplanner.yaml does)
    planner_corpus = {"rest_of_train": True}
    overlay.write_text(yaml.safe_dump({"overlay_of": str(base),
                                       "prepare": {**config["prepare"], "planner_corpus": planner_corpus}}))
    cli_main(["run", "--config", str(base), "--config", str(overlay)])
    assert "overlay_of" not in (out / "run_state.json").read_text()  # a file's marker, no setting of the run

    prepared = PreparedDataset(out / "prepared")
    origin = prepared.manifest["planner_origin"]
    assert origin["lm_train"] == 12 and origin["rest_of_train"] > 20
    assert prepared["planner_train"].num_articles == 12 + origin["rest_of_train"]
    assert prepared["train"].num_articles == 12  # the LM's split is the configured one
    summary = json.loads((out / "planner" / "summary.json").read_text())
    assert summary["train_split"] == "planner_train" and summary["eval_split"] == "validation"
    planner_sentences = prepared["planner_train"].num_sentences
    assert summary["global_step"] == -(-planner_sentences // config["planner"]["train"]["batch_size"])
    state = json.loads((out / "run_state.json").read_text())["stages"]
    assert all(stage["status"] == "done" for stage in state.values())
    assert read_manifest(out / "lm" / "ours")["global_step"] == 2


def test_the_demo_overlay_is_the_demo_plus_the_planner_corpus():
    configs = Path(__file__).resolve().parents[2] / "configs"
    demo = yaml.safe_load((configs / "demo.yaml").read_text())
    overlay = yaml.safe_load((configs / "demo-bigplanner.yaml").read_text())
    prepare = dict(overlay["prepare"])
    assert prepare.pop("planner_corpus") == {"rest_of_train": True}
    assert prepare == demo["prepare"] and set(overlay) == {"overlay_of", "out_dir", "prepare", "planner"}
    assert overlay["overlay_of"] == "configs/demo.yaml"
    planner = overlay["planner"]  # the demo's planner recipe with the causal g (chosen by validation information),
    assert planner["model"].pop("dynamics") == "causal"  # trained 3 epochs for the budget (0.012 nats at step 1)
    assert planner["train"].pop("max_epochs") == 3 and demo["planner"]["train"].pop("max_epochs") == 6
    assert planner == demo["planner"]


@pytest.mark.parametrize("base_name, overlay_name", [("evidence.yaml", "evidence-bigplanner.yaml"),
                                                     ("pretrained-offline.yaml", "pretrained-offline-bigplanner.yaml")])
def test_a_bigplanner_overlay_is_its_base_plus_the_planner_corpus_and_the_demos_big_planner(base_name, overlay_name):
    configs = Path(__file__).resolve().parents[2] / "configs"
    base = yaml.safe_load((configs / base_name).read_text())
    overlay = yaml.safe_load((configs / overlay_name).read_text())
    big = yaml.safe_load((configs / "demo-bigplanner.yaml").read_text())
    prepare = dict(overlay["prepare"])
    assert prepare.pop("planner_corpus") == {"rest_of_train": True}
    assert prepare == base["prepare"] and set(overlay) == {"overlay_of", "out_dir", "prepare", "planner"}
    assert overlay["overlay_of"] == f"configs/{base_name}" and overlay["out_dir"] != base["out_dir"]
    assert overlay["planner"] == big["planner"]  # the recipe chosen for a planner set of this size
