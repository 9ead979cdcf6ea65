"""The Hub, both directions, offline: model cards, folders round trip, Hub ids from a pre-populated local cache."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard

from helpers import tiny_planned_lm, tiny_planner
from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.models.planned_lm import PlannedLM, add_evaluation
from planlm.models.planner import Planner

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def put_in_hub_cache(cache, repo_id: str, folder) -> None:
    """The layout snapshot_download leaves: models--org--name/refs/main -> the commit, snapshots/<commit>/ files."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def logits(model: PlannedLM, prepared: PreparedDataset) -> torch.Tensor:
    split = prepared.split("test")
    ids = torch.from_numpy(np.array(split.input_ids[:24]))[None]  # (1, L)
    paths = torch.tensor([[[1, 2, 3], [4, 5, 6]]])  # (N=1, K=2, T=3)
    with torch.no_grad():
        return model(ids, action_paths=paths, plan_index=torch.zeros_like(ids)).logits


def test_saved_folder_round_trips_with_a_model_card(synthetic_random, tmp_path):
    prepared = PreparedDataset(synthetic_random)
    model = tiny_planned_lm(prepared)
    folder = model.save_pretrained(tmp_path / "lm", tokenizer=model.load_tokenizer(),
                                   training={"corpus_fingerprint": "f" * 16, "val_ppl": 9.5, "global_step": 3})
    loaded = PlannedLM.from_pretrained(folder)
    assert torch.equal(logits(loaded, prepared), logits(model, prepared))
    data = ModelCard.load(folder / "README.md").data
    assert data.library_name == "planlm" and "plans-oracle" in data.tags
    block = data.to_dict()["planlm"]
    assert block["plans"]["kind"] == "oracle" and block["plans"]["num_paths"] == 2 and block["plans"]["horizon"] == 3
    assert block["adapter"]["kind"] == "project_avg"
    assert block["codebook_hash"] == prepared.codebook_hash
    assert block["training"]["corpus_fingerprint"] == "f" * 16

    metrics = {"ppl": 41.5, "ci_low": 40.0, "ci_high": 43.0, "split": "test", "protocol": "reference stride-1",
               "conditioning": "oracle", "K": 2, "T": 3, "tau": 1.0, "prepared_dir": str(synthetic_random)}
    assert add_evaluation(folder, metrics) and add_evaluation(folder, {**metrics, "ppl": 40.5})  # the same: replaced
    assert add_evaluation(folder, {**metrics, "K": 1, "ppl": 44.0})  # other plans: a second entry
    data = ModelCard.load(folder / "README.md").data
    assert sorted(r.metric_value for r in data.eval_results) == [40.5, 44.0]
    assert {r.metric_type for r in data.eval_results} == {"perplexity"}
    assert data.to_dict()["planlm"]["training"]["val_ppl"] == 9.5  # kept through the refresh


def test_hub_ids_load_from_the_local_cache_offline(synthetic_random, offline_cache, tmp_path):
    prepared = PreparedDataset(synthetic_random)
    model = tiny_planned_lm(prepared)
    put_in_hub_cache(offline_cache, "planlm-test/tiny-lm", model.save_pretrained(tmp_path / "lm"))
    planner = tiny_planner(prepared)
    put_in_hub_cache(offline_cache, "planlm-test/tiny-planner", planner.save_pretrained(tmp_path / "planner"))

    from_hub = PlannedLM.from_pretrained("planlm-test/tiny-lm")
    assert torch.equal(logits(from_hub, prepared), logits(model, prepared))
    assert from_hub.folder.parent.parent.name == "models--planlm-test--tiny-lm"
    planner_from_hub = Planner.from_pretrained("planlm-test/tiny-planner")
    for name, value in planner.state_dict().items():
        assert torch.equal(planner_from_hub.state_dict()[name], value), name
    assert ModelCard.load(from_hub.folder / "README.md").data.library_name == "planlm"


def test_a_hub_id_missing_from_the_cache_offline_is_one_line(offline_cache):
    for load in (PlannedLM.from_pretrained, Planner.from_pretrained):
        with pytest.raises(PlanlmError) as error:
            load("planlm-test/not-cached")
        message = str(error.value)
        assert "\n" not in message and "planlm-test/not-cached" in message and "hf download" in message


def test_push_needs_a_complete_folder_and_a_network(synthetic_random, offline_cache, tmp_path):
    model = tiny_planned_lm(PreparedDataset(synthetic_random))
    with pytest.raises(PlanlmError, match="save_pretrained"):
        model.push_to_hub("planlm-test/tiny-lm")  # never saved: no folder
    folder = model.save_pretrained(tmp_path / "lm")
    with pytest.raises(PlanlmError, match="offline"):
        model.push_to_hub("planlm-test/tiny-lm")
    (folder / "README.md").unlink()
    with pytest.raises(PlanlmError, match="no model card"):
        model.push_to_hub("planlm-test/tiny-lm")


def test_evaluate_adds_its_perplexity_to_the_card(synthetic_random, tmp_path):
    from planlm.evaluate.perplexity import evaluate

    prepared = PreparedDataset(synthetic_random)
    folder = tiny_planned_lm(prepared).save_pretrained(tmp_path / "lm")
    metrics = evaluate(str(folder), str(synthetic_random), str(tmp_path / "eval"), stride=64, max_articles=2,
                       bootstrap_samples=20, runtime=Runtime(device="cpu"), plan_usage=False)
    data = ModelCard.load(folder / "README.md").data
    assert [r.metric_value for r in data.eval_results] == [metrics.ppl]
    entry = data.to_dict()["planlm"]["evaluations"][0]
    assert entry["split"] == "test" and entry["conditioning"] == "oracle" and entry["tokens"] == metrics.tokens
