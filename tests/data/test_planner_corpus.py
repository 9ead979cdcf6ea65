"""``prepare.planner_corpus``: the planner and the codebook read more documents than the LM, on tiny corpora with
the real MiniLM encoder: what reaches the planner's split, the codebook and train-planner but not the LM's windows;
no document in two splits; the note; reuse and rebuild."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planlm.data.artifacts import PreparedDataset
from planlm.data.corpus import CorpusConfig
from planlm.data.planner_corpus import PLANNER_SPLIT, PlannerCorpusConfig
from planlm.data.prepare import prepare
from planlm.models.planner import PlannerSettings
from planlm.stage import read_manifest
from planlm.train.planner import PlannerTrainArgs, train_planner

from test_prepare import tiny_config, tiny_jsonl


def pieces_config(source, **corpus) -> dict:
    """14 documents of 4 sentences cut into 2 pieces each, one piece kept per document: 4 training pieces."""
    config = tiny_config(source)
    config["corpus"] = CorpusConfig(**{"source": str(source), "num_train": 4, "num_validation": 2, "num_test": 2,
                                       "piece_sentences": 2, "pieces_per_source": 1, **corpus})
    return config


def documents(split) -> set[str]:
    return {a.get("source", a["id"]) for a in split.articles}


@pytest.fixture(scope="module")
def with_rest(tmp_path_factory):
    """The same corpus prepared without and with the rest of its training side for the planner."""
    tmp = tmp_path_factory.mktemp("rest")
    source = tiny_jsonl(tmp / "c.jsonl", 14)
    plain = prepare(str(tmp / "plain"), **pieces_config(source))
    rest = prepare(str(tmp / "rest"), **pieces_config(source), planner_corpus=PlannerCorpusConfig(rest_of_train=True))
    return source, PreparedDataset(plain), PreparedDataset(rest)


def test_the_rest_of_the_training_side_reaches_the_planner_and_the_codebook_not_the_lm(with_rest, monkeypatch):
    _, plain, rest = with_rest
    assert plain.planner_split == "train" and rest.planner_split == PLANNER_SPLIT
    planner, train = rest[PLANNER_SPLIT], rest["train"]
    # the LM's splits are the same articles and the same tokens as without the option
    for split in ("train", "validation", "test"):
        assert [a["id"] for a in rest[split].articles] == [a["id"] for a in plain[split].articles]
        np.testing.assert_array_equal(rest[split].input_ids, plain[split].input_ids)
    # the planner's split: the LM's training articles first (their embeddings copied), then the rest
    assert [a["id"] for a in planner.articles[:train.num_articles]] == [a["id"] for a in train.articles]
    np.testing.assert_array_equal(planner.embeddings[:train.num_sentences], train.embeddings)
    origin = rest.manifest["planner_origin"]
    assert origin == {"lm_train": 4, "rest_of_train": 16} and planner.num_articles == 20
    # every piece of the training documents and every later document; never a test or validation document
    held_out = documents(rest["validation"]) | documents(rest["test"])
    assert not documents(planner) & held_out and len(documents(planner)) == 10
    assert documents(train) < documents(planner)
    # no LM window can come from it: it holds no tokens, and train-lm's data are the train split's tokens
    assert planner.num_tokens == 0 and list(planner.token_offsets) == [0] * 21
    # the codebook is fitted on the planner's sentences (40), not the LM's (8)
    fitted = {}
    import planlm.data.prepare as module

    real_fit = module.fit_codebook
    monkeypatch.setattr(module, "fit_codebook", lambda x, *a, **k: fitted.setdefault("rows", len(x)) and real_fit(x, *a, **k))
    prepare(str(rest.path.parent / "refit"), **{**pieces_config(with_rest[0])},
            planner_corpus=PlannerCorpusConfig(rest_of_train=True))
    assert fitted["rows"] == planner.num_sentences == 40


def test_train_planner_fits_on_the_planner_split_and_validates_on_validation(with_rest, tmp_path):
    _, _, rest = with_rest
    args = PlannerTrainArgs(batch_size=8, max_epochs=1, lr=1e-2)
    out = train_planner(str(rest.path), str(tmp_path / "planner"),
                        PlannerSettings(d_model=16, num_heads=2, dim_feedforward=32, horizon=2), args)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["train_split"] == PLANNER_SPLIT and summary["eval_split"] == "validation"
    assert summary["global_step"] == -(-rest[PLANNER_SPLIT].num_sentences // 8)  # one epoch over all 40 boundaries


def test_the_note_and_reuse_or_rebuild(with_rest, tmp_path, capsys):
    source, _, rest = with_rest
    # unchanged option: reused as it is
    capsys.readouterr()
    prepare(str(rest.path), **pieces_config(source), planner_corpus=PlannerCorpusConfig(rest_of_train=True))
    assert "reusing it" in capsys.readouterr().out
    # a planner set smaller than the LM's training set: one note line. Five documents of two pieces, every piece
    # kept: one each for test and validation, two for training (8 sentences), one more for the planner (4)
    few = tiny_jsonl(tmp_path / "five.jsonl", 5)
    out = prepare(str(tmp_path / "small"), **pieces_config(few, pieces_per_source=None),
                  planner_corpus=PlannerCorpusConfig(rest_of_train=True))
    note = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert len(note) == 1 and "the planner's extra documents hold 4 sentences (2 articles), fewer than the LM's 8" \
        in note[0]
    assert PreparedDataset(out).manifest["planner_origin"] == {"lm_train": 4, "rest_of_train": 2}
    before = read_manifest(out)["config_fingerprint"]
    # switched off: rebuilt, the planner's split goes
    prepare(str(out), **pieces_config(few, pieces_per_source=None))
    assert not (out / PLANNER_SPLIT).exists() and PreparedDataset(out).planner_split == "train"
    assert read_manifest(out)["config_fingerprint"] != before
