"""Long documents: the sotu source, pieces of at most N sentences (planlm.data.pieces) and splits drawn by
source (planlm.data.prepare.take_articles), on tiny hand-written documents."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from planlm.data.corpus import CorpusConfig, Skips, read_articles, resolve_kind, strip_stage_notes
from planlm.data.pieces import cut_into_pieces, piece_sentence_ranges
from planlm.data.prepare import SentencesConfig, take_articles
from planlm.data.resources import sotu_speeches_dir, split_sentences
from planlm.errors import PlanlmError


def document(doc: int, paragraphs: list[int]) -> str:
    """Paragraphs (blank-line separated) of the given numbers of sentences, each sentence naming its place."""
    return "\n\n".join(" ".join(f"Doc {doc} paragraph {p} sentence {s} ends here." for s in range(n))
                       for p, n in enumerate(paragraphs))


def pieces_of(text: str, max_sentences: int, **kwargs) -> list[tuple[dict, np.ndarray]]:
    spans = np.asarray(split_sentences([text])[0])
    return cut_into_pieces({"id": "d", "title": "D", "text": text}, spans, max_sentences, **kwargs)


def test_paragraphs_are_packed_and_long_paragraphs_cut_evenly():
    paragraph = np.array([0, 0, 1, 1, 1, 2, 3, 3, 3, 3, 3, 3, 3, 4])  # paragraph of each sentence
    assert piece_sentence_ranges(paragraph, 4) == [(0, 2), (2, 6), (6, 10), (10, 13), (13, 14)]
    # no paragraph breaks at all: the fewest equal pieces, not 4 + 4 + 2
    assert piece_sentence_ranges(np.zeros(10, int), 4) == [(0, 3), (3, 7), (7, 10)]
    assert piece_sentence_ranges(np.zeros(4, int), 4) == [(0, 4)]


def test_pieces_keep_their_source_and_their_sentences():
    text = document(0, [2, 3, 1, 7])
    pieces = pieces_of(text, 4)
    assert [p["id"] for p, _ in pieces] == ["d#0", "d#1", "d#2", "d#3"]
    assert all(p["source"] == "d" and p["title"] == "D" for p, _ in pieces)
    sentences = [p["text"][s:e].strip() for p, spans in pieces for s, e in spans]
    assert sentences == [text[s:e].strip() for s, e in split_sentences([text])[0]]  # each once, in order
    assert [len(spans) for _, spans in pieces] == [2, 4, 4, 3]  # 2 | 3 + 1 | 7 cut as 4 + 3
    assert pieces[1][0]["text"].startswith("Doc 0 paragraph 1 sentence 0") and "\n\n" in pieces[1][0]["text"]
    # a document within the limit stays whole, with itself as its source
    (whole, spans), = pieces_of(text, 13)
    assert whole["id"] == whole["source"] == "d" and whole["text"] == text and len(spans) == 13
    # at most 2 pieces per source: a seeded choice, in document order, numbered as among all pieces
    chosen = [p["id"] for p, _ in pieces_of(text, 4, max_pieces=2, seed=0)]
    assert len(chosen) == 2 and chosen == sorted(chosen) and chosen == [p["id"] for p, _ in
                                                                        pieces_of(text, 4, max_pieces=2, seed=0)]
    assert {tuple(p["id"] for p, _ in pieces_of(text, 4, max_pieces=2, seed=s)) for s in range(8)} != {tuple(chosen)}


def test_splits_are_drawn_by_source(tmp_path):
    rows = [{"id": f"doc{d}", "text": document(d, [3, 3, 3, 3])} for d in range(10)]  # 12 sentences: 2 pieces of 6
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    skips = Skips()
    config = CorpusConfig(source=str(path), piece_sentences=6, num_test=3, num_validation=4, num_train=9)
    drawn = take_articles(config, SentencesConfig(), skips, progress=False)
    assert {split: len(articles) for split, (articles, _) in drawn.items()} == {"test": 3, "validation": 4,
                                                                                "train": 9}
    sources = {split: {a["source"] for a in articles} for split, (articles, _) in drawn.items()}
    assert not (sources["test"] & sources["validation"] or sources["test"] & sources["train"]
                or sources["validation"] & sources["train"])  # no document in two splits
    assert all(a["id"].startswith(a["source"] + "#") for articles, _ in drawn.values() for a in articles)
    # 2 pieces a document: test takes 2 documents (one piece of the second dropped), validation 2, train 5 (one
    # piece of the fifth dropped)
    assert skips == {"pieces_at_split_edge": 2}
    assert all(len(spans) == 6 for _, split_spans in drawn.values() for spans in split_spans)
    # pieces of one sentence are too short, like articles of one sentence
    one = tmp_path / "one.jsonl"
    one.write_text("".join(json.dumps({"id": f"x{d}", "text": document(d, [4, 1])}) + "\n" for d in range(6)))
    skips = Skips()
    drawn = take_articles(CorpusConfig(source=str(one), piece_sentences=4, num_test=1, num_validation=1),
                          SentencesConfig(), skips, progress=False)
    assert skips == {"too_few_sentences": 6} and len(drawn["train"][0]) == 4


def test_piece_length_below_two_is_a_one_line_error():
    for bad in (1, 0):
        with pytest.raises(PlanlmError, match=r"--corpus.piece_sentences must be >= 2") as error:
            CorpusConfig(piece_sentences=bad)
        assert "\n" not in str(error.value)
    with pytest.raises(PlanlmError, match="--corpus.pieces_per_source"):
        CorpusConfig(piece_sentences=30, pieces_per_source=0)
    assert CorpusConfig(piece_sentences=None).pieces_per_source is None  # whole documents: one piece each


def test_the_default_corpus_is_the_demos_long_documents():
    """The defaults are the demo's pieces of the State of the Union addresses (configs/demo.yaml), where plans can
    help; the Wikipedia lead sections stay available by name."""
    import yaml

    demo = yaml.safe_load((Path(__file__).parents[2] / "configs" / "demo.yaml").read_text())["prepare"]["corpus"]
    assert {name: getattr(CorpusConfig(), name) for name in demo} == demo
    assert resolve_kind(CorpusConfig()) == "sotu"
    assert resolve_kind(CorpusConfig(source="wiki-offline")) == "wiki-offline"


def test_stage_notes_are_dropped_and_insertions_kept():
    text = ("Good evening. If I were smart, I'd go home now. [Laughter]\n\n[Applause]\n\n"
            "But Ukraine [applause] can stop Putin. [At this point, the President turned to the audience.]\n\n"
            "Governor Branstad [Iowa] said [we're; White House correction] ready [see APP Note]. [Inaudible]")
    assert strip_stage_notes(text) == ("Good evening. If I were smart, I'd go home now.\n\n"
                                       "But Ukraine can stop Putin.\n\n"
                                       "Governor Branstad [Iowa] said we're ready .")


def test_sotu_source_reads_speeches_without_importing_the_package(tmp_path, monkeypatch):
    assert resolve_kind(CorpusConfig(source="sotu")) == "sotu"
    real = sotu_speeches_dir()
    folder = tmp_path / "data" / "speeches"
    folder.mkdir(parents=True)
    for name in ("1790-Washington-1.txt", "2024-Biden-1.txt", "2026-Trump-1.txt"):
        shutil.copyfile(real / name, folder / name)
    shutil.copyfile(real.parent / "metadata.csv", folder.parent / "metadata.csv")
    monkeypatch.setattr("planlm.data.corpus.sotu_speeches_dir", lambda: folder)
    speeches = {a["id"]: a for a in read_articles(CorpusConfig(source="sotu"), Skips())}
    assert sorted(speeches) == ["1790-Washington-1", "2024-Biden-1", "2026-Trump-1"]
    assert speeches["1790-Washington-1"]["title"] == "George Washington, 1790-01-08"
    biden = speeches["2024-Biden-1"]["text"]
    assert "[Laughter]" in (real / "2024-Biden-1.txt").read_text()
    assert "[Laughter]" not in biden and "[applause]" not in biden and "\n\n" in biden
    assert biden.startswith("The President. Your bedtime reading.")  # the opening stage note is gone
    # cut into pieces, every piece keeps its speech, and no speech lies in two splits
    drawn = take_articles(CorpusConfig(source="sotu", piece_sentences=30, num_test=1, num_validation=1),
                          SentencesConfig(), Skips(), progress=False)
    sources = [{a["source"] for a in drawn[split][0]} for split in ("test", "validation", "train")]
    assert sum(len(s) for s in sources) == len(set().union(*sources)) <= 3
    assert all(len(spans) <= 30 for split in drawn.values() for spans in split[1])
    with pytest.raises(PlanlmError, match=r"only \d+ usable articles from 3 documents"):
        take_articles(CorpusConfig(source="sotu", piece_sentences=30, num_test=40, num_validation=2),
                      SentencesConfig(), Skips(), progress=False)
