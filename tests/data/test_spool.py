"""Articles spooled to disk (``planlm.data.spool``): what is read back is what was added, in the same order, and the
sentence strings of any run of sentences are those of the articles held in a list."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planlm.data.artifacts import article_record
from planlm.data.embed import texts_hash
from planlm.data.spool import ArticleSpool, JsonLines, SentenceTexts


ODD = " é\n\u2028"  # a non-ASCII letter, a newline and a line separator inside a sentence


def _pieces(num_articles: int, seed: int = 0) -> list[tuple[dict, np.ndarray]]:
    """Articles of 1 to 6 sentences (one of none) with their spans; some pieces of a document, some with odd text."""
    rng = np.random.default_rng(seed)
    pieces = []
    for a in range(num_articles):
        count = 0 if a == 3 else int(rng.integers(1, 7))
        sentences = [f"Sentence {s} of article {a}{ODD if s % 3 == 0 else ''}." for s in range(count)]
        text, spans, at = "", [], 0
        for sentence in sentences:
            text += "  " if text else ""
            spans.append((len(text), len(text) + len(sentence)))
            text += sentence
        article = {"id": f"d{a // 2}#{a % 2}" if a % 4 else f"a{a}", "title": "T\ud800" if a == 5 else f"T{a}",
                   "text": text or " "}
        if a % 4:
            article["source"] = f"d{a // 2}"
        pieces.append((article, np.asarray(spans, dtype=np.int64).reshape(-1, 2)))
    return pieces


def test_json_lines_read_back_by_index_and_in_runs(tmp_path, monkeypatch):
    values = [{"id": "a\ud800", "text": "line\nbreak \u2028 é"}, [1, 2.5, None], "x" * 300, {}]
    with JsonLines(tmp_path) as lines:
        for value in values:
            lines.append(value)
        assert len(lines) == 4 and [lines[i] for i in range(4)] == values and lines[-1] == {}
        with pytest.raises(IndexError):
            lines[4]
        monkeypatch.setattr("planlm.data.spool._READ_BYTES", 40)  # runs of one line, and of a few
        assert list(lines.read()) == values and list(lines.read(1, 3)) == values[1:3] and list(lines.read(2, 2)) == []
        lines.append("after a read")
        assert lines[4] == "after a read"
    assert list(tmp_path.iterdir()) == []  # an unnamed file: nothing left behind


def test_an_article_spool_reads_back_the_articles_and_spans_it_was_given(tmp_path):
    pieces = _pieces(23)
    with ArticleSpool(tmp_path) as spool:
        spool += pieces[:10]
        spool += pieces[10:]
        assert len(spool) == 23 and spool.num_sentences == sum(len(s) for _, s in pieces)
        assert list(spool.articles()) == [article_record(a) for a, _ in pieces]
        assert [json.dumps(r) for r in spool.articles(4, 9)] == [json.dumps(article_record(a)) for a, _ in pieces[4:9]]
        for got, (_, spans) in zip(spool.spans(2, 17), pieces[2:17]):
            np.testing.assert_array_equal(got, spans)
        assert spool.spans(5, 5) == []
        offsets = np.concatenate([[0], np.cumsum([len(s) for _, s in pieces])])
        np.testing.assert_array_equal(spool.sentence_offsets(), offsets)
        np.testing.assert_array_equal(spool.sentence_spans(), np.concatenate([s for _, s in pieces]))
        assert len(spool.sources) == len({a.get("source", a["id"]) for a, _ in pieces})
        joined = ArticleSpool(tmp_path)
        joined.extend_from(spool, block=4)
        assert list(joined.articles()) == list(spool.articles()) and joined.sources == spool.sources
        np.testing.assert_array_equal(joined.sentence_spans(), spool.sentence_spans())
        joined.close()
    with ArticleSpool(tmp_path) as empty:
        assert empty.sentence_spans().shape == (0, 2) and list(empty.sentence_offsets()) == [0]
        assert len(empty.sentence_texts()) == 0 and list(empty.sentence_texts()) == []
    assert list(tmp_path.iterdir()) == []


def test_sentence_texts_are_the_list_of_every_sentence_in_any_run(tmp_path):
    pieces = _pieces(40, seed=1)
    every = [a["text"][start:end] for a, spans in pieces for start, end in spans.tolist()]
    with ArticleSpool(tmp_path) as spool:
        spool += pieces
        texts = spool.sentence_texts()
        assert len(texts) == len(every) and list(texts) == every and texts_hash(texts) == texts_hash(every)
        for start in range(0, len(every) + 1, 3):  # runs that start and end inside articles and at their edges
            for size in (1, 2, 5, 11, len(every)):
                assert texts[start:start + size] == every[start:start + size], (start, size)
        assert texts[-1] == every[-1] and texts[7] == every[7] and texts[::2] == every[::2]
        assert list(SentenceTexts(spool, block=3)) == every  # read in blocks of 3 articles (1,024 in planlm)
