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
    # the overlay names only its one key, as configs/demo-bigplanner.yaml does: the corpus and sizes stay the base's
    overlay.write_text(yaml.safe_dump({"overlay_of": str(base), "prepare": {"planner_corpus": {"rest_of_train": True}}}))
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


@pytest.mark.parametrize("base_name, overlay_name", [("demo.yaml", "demo-bigplanner.yaml"),
                                                     ("evidence.yaml", "evidence-bigplanner.yaml"),
                                                     ("pretrained-offline.yaml", "pretrained-offline-bigplanner.yaml")])
def test_a_bigplanner_overlay_is_its_base_plus_the_planner_corpus_and_the_demos_big_planner(base_name, overlay_name,
                                                                                           capsys):
    """Merged, each larger-planner config is its base with the planner corpus, its own folder and the planner recipe
    of configs/demo-bigplanner.yaml (the causal g for 3 epochs), the base's planner otherwise."""
    configs = Path(__file__).resolve().parents[2] / "configs"

    def merged(*names):
        with pytest.raises(SystemExit):
            cli_main(["run", *[arg for name in names for arg in ("--config", str(configs / name))], "--print_config"])
        return yaml.safe_load(capsys.readouterr().out)

    base, big = merged(base_name), merged(base_name, overlay_name)
    assert big["prepare"].pop("planner_corpus") == {"rest_of_train": True} and big["prepare"] == base["prepare"]
    assert big.pop("out_dir") != base.pop("out_dir")
    assert big["planner"]["model"].pop("dynamics") == "causal" and "dynamics" not in base["planner"]["model"]
    assert big["planner"]["train"].pop("max_epochs") == 3 and base["planner"]["train"].pop("max_epochs") > 3
    for config in (big, base):  # the pretrained base's planner in fp32; the larger one's in bf16 where native
        config["planner"].get("runtime", {}).pop("precision", None)
        if not config["planner"].get("runtime", True):
            del config["planner"]["runtime"]
    assert big == base
