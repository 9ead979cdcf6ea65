"""Corpus sources, seeded drawing and bad-record handling (planlm.data.corpus), on tiny hand-written files."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from planlm.data.corpus import CorpusConfig, Skips, read_articles, resolve_kind
from planlm.data.prepare import SentencesConfig, take_articles
from planlm.errors import PlanlmError

ARTICLES = [
    {"id": f"a{i}", "title": f"Title {i}", "text": f"Article {i} starts here. It has a second sentence. And a third one {i}."}
    for i in range(12)
]


def write_jsonl(path, rows, extra_lines: list[bytes] = ()):
    with open(path, "wb") as f:
        for row in rows:
            f.write((json.dumps(row) + "\n").encode())
        for line in extra_lines:
            f.write(line + b"\n")
    return path


@pytest.fixture
def bad_jsonl(tmp_path):
    """6 good articles and one of each bad record kind."""
    return write_jsonl(tmp_path / "bad.jsonl", ARTICLES[:6], [
        b'{"id": "broken", "text": "no closing brace"',          # malformed JSON (line 7)
        b'{"id": "latin1", "text": "caf\xe9 au lait."}',          # undecodable bytes (line 8)
        b'{"id": "empty", "text": ""}',                          # empty (line 9)
        b'{"id": "blank", "text": "   \\n\\t "}',                # whitespace only (line 10)
        json.dumps(ARTICLES[0]).encode(),                        # duplicate id a0 (line 11)
        b'{"id": "notext", "body": "the text is elsewhere."}',   # missing text column (line 12)
        b'{"id": "surrogate", "text": "bad \\ud800 escape."}',   # lone surrogate (line 13)
        b'["a", "list"]',                                        # not an object (line 14)
    ])


def ids(config: CorpusConfig, skips: Skips | None = None) -> list[str]:
    return [a["id"] for a in read_articles(config, skips if skips is not None else Skips())]


def test_jsonl_bad_records_are_counted_skips(bad_jsonl, capsys):
    skips = Skips()
    got = ids(CorpusConfig(source=str(bad_jsonl)), skips)
    assert sorted(got) == sorted(a["id"] for a in ARTICLES[:6])
    assert dict(skips) == {"malformed_json": 1, "undecodable": 2, "empty_text": 2, "duplicate_id": 1,
                           "missing_text": 1, "malformed_record": 1}
    err = capsys.readouterr().err
    assert f"{bad_jsonl} line 7" in err and "line 8 (byte" in err  # each skip names file and record


@pytest.mark.parametrize("line, reason", [(7, "malformed json"), (8, "undecodable"), (9, "empty text")])
def test_jsonl_bad_records_error_mode_names_file_and_line(tmp_path, bad_jsonl, line, reason):
    lines = bad_jsonl.read_bytes().splitlines()
    path = tmp_path / "one_bad.jsonl"
    path.write_bytes(b"\n".join(lines[:6] + [lines[line - 1]]) + b"\n")
    with pytest.raises(PlanlmError) as e:
        ids(CorpusConfig(source=str(path), on_bad_record="error"))
    message = str(e.value)
    assert f"{path} line 7" in message and reason in message and "on_bad_record skip" in message
    assert "\n" not in message


def test_duplicate_id_error_mode(tmp_path):
    path = write_jsonl(tmp_path / "dup.jsonl", ARTICLES[:3] + [ARTICLES[1]])
    with pytest.raises(PlanlmError, match="id 'a1'.*duplicate id.*unique"):
        ids(CorpusConfig(source=str(path), on_bad_record="error"))


def test_seeded_order_is_reproducible_and_uses_all(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", ARTICLES)
    first = ids(CorpusConfig(source=str(path), seed=3))
    assert first == ids(CorpusConfig(source=str(path), seed=3))
    assert first != ids(CorpusConfig(source=str(path), seed=4))
    assert sorted(first) == sorted(a["id"] for a in ARTICLES)


def test_parquet_and_missing_column(tmp_path):
    table = pa.table({"id": [a["id"] for a in ARTICLES], "text": [a["text"] for a in ARTICLES],
                      "title": [a["title"] for a in ARTICLES]})
    pq.write_table(table, tmp_path / "c.parquet")
    arts = list(read_articles(CorpusConfig(source=str(tmp_path / "c.parquet")), Skips()))
    assert {a["id"]: a["text"] for a in arts} == {a["id"]: a["text"] for a in ARTICLES}
    assert {a["title"] for a in arts} == {a["title"] for a in ARTICLES}
    with pytest.raises(PlanlmError, match="no column 'body'.*text_column"):
        ids(CorpusConfig(source=str(tmp_path / "c.parquet"), text_column="body"))


def test_a_column_no_record_has_is_an_error_but_a_record_without_it_a_skip(tmp_path):
    import datasets

    no_ids = [{"text": a["text"], "title": a["title"]} for a in ARTICLES[:3]]
    path = write_jsonl(tmp_path / "c.jsonl", [{"body": "Elsewhere."}, *no_ids])
    skips = Skips()  # the first record lacks the text column, the others have it: one bad record
    assert sorted(ids(CorpusConfig(source=str(path)), skips)) == ["c.jsonl:2", "c.jsonl:3", "c.jsonl:4"]
    assert skips == {"missing_text": 1}  # and the default id column falls back to positions
    with pytest.raises(PlanlmError) as e:
        ids(CorpusConfig(source=str(path), text_column="content"))
    assert str(e.value) == (f"{path}: no column 'content' in its records (they have: body, text, title); "
                            f"set --corpus.text_column to one of them")
    with pytest.raises(PlanlmError, match="no column 'doc_id' in its records .*set --corpus.id_column"):
        ids(CorpusConfig(source=str(path), id_column="doc_id"))
    datasets.Dataset.from_list(no_ids).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(PlanlmError, match="saved: no column 'body' in its records \\(they have: text, title\\)"):
        ids(CorpusConfig(source=str(tmp_path / "saved"), text_column="body"))


def test_plain_text_articles_are_separated_by_blank_lines(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "one.txt").write_text("First article. Two sentences.\n\n  \nSecond article\nspans lines.\n")
    (folder / "two.txt").write_text("Third article here. Yes.")
    (folder / "bad.txt").write_bytes(b"Not \xff utf-8.")
    skips = Skips()
    arts = {a["id"]: a["text"] for a in read_articles(CorpusConfig(source=str(folder)), skips)}
    assert arts == {"one.txt:1": "First article. Two sentences.", "one.txt:4": "Second article\nspans lines.",
                    "two.txt:1": "Third article here. Yes."}
    assert skips == {"undecodable": 1}


def test_huggingface_streamed_json_and_save_to_disk(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr("planlm.data.corpus.SHUFFLE_BUFFER", 4)
    path = write_jsonl(tmp_path / "hf.jsonl", ARTICLES)
    config = CorpusConfig(source="json", hf_data_files=str(path), seed=1)
    assert resolve_kind(config) == "huggingface"
    streamed = ids(config)
    assert sorted(streamed) == sorted(a["id"] for a in ARTICLES) and streamed == ids(config)
    datasets.Dataset.from_list(ARTICLES).save_to_disk(str(tmp_path / "saved"))
    saved = CorpusConfig(source=str(tmp_path / "saved"))
    assert resolve_kind(saved) == "huggingface"
    assert sorted(ids(saved)) == sorted(a["id"] for a in ARTICLES)


def test_streamed_shards_are_interleaved(tmp_path, monkeypatch):
    monkeypatch.setattr("planlm.data.corpus.SHUFFLE_BUFFER", 1)
    folder = tmp_path / "shards"
    folder.mkdir()
    for shard in range(3):
        write_jsonl(folder / f"part{shard}.jsonl", [{"id": f"s{shard}-{i}", "text": f"Shard {shard}. Row {i}."}
                                                     for i in range(20)])
    config = CorpusConfig(source="json", hf_data_files=str(folder / "*.jsonl"))
    first = ids(config)[:6]
    assert len({i.split("-")[0] for i in first}) == 3  # every shard contributes from the start
    everything = ids(config)
    assert sorted(everything) == sorted(f"s{shard}-{i}" for shard in range(3) for i in range(20))


def test_unknown_sources_are_one_line_errors(tmp_path):
    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "b.parquet").write_text("x")
    with pytest.raises(PlanlmError, match="mixed or unknown file types"):
        resolve_kind(CorpusConfig(source=str(tmp_path)))
    with pytest.raises(PlanlmError, match="no .jsonl/.parquet/.txt files"):
        resolve_kind(CorpusConfig(source=str(tmp_path / "missing" / "*.jsonl")))
    with pytest.raises(PlanlmError, match="could not open Hugging Face dataset"):
        ids(CorpusConfig(source="no-such-owner/no-such-dataset"))
    with pytest.raises(PlanlmError, match="--corpus.num_test"):
        CorpusConfig(num_test=-1)


def test_take_articles_splits_and_counts_one_sentence_articles(tmp_path):
    rows = ARTICLES + [{"id": "short", "text": "Only one sentence here."}]
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    skips = Skips()
    drawn = take_articles(CorpusConfig(source=str(path), num_validation=2, num_test=3), SentencesConfig(), skips,
                          progress=False)
    assert {s: len(a) for s, (a, _) in drawn.items()} == {"test": 3, "validation": 2, "train": 7}
    assert skips == {"too_few_sentences": 1}
    articles, spans = drawn["train"]
    for art, article_spans in zip(articles, spans):
        assert [art["text"][s:e] for s, e in article_spans][1] == "It has a second sentence."
    every = [a["id"] for split in ("test", "validation", "train") for a in drawn[split][0]]
    assert sorted(every) == sorted(a["id"] for a in ARTICLES)  # disjoint and complete
    # capped training split: the evaluation splits stay the same articles
    capped = take_articles(CorpusConfig(source=str(path), num_train=2, num_validation=2, num_test=3),
                           SentencesConfig(), Skips(), progress=False)
    assert [a["id"] for a in capped["test"][0]] == [a["id"] for a in drawn["test"][0]]
    assert len(capped["train"][0]) == 2
    with pytest.raises(PlanlmError, match="only 12 usable articles.*--corpus.num_test"):
        take_articles(CorpusConfig(source=str(path), num_validation=6, num_test=6), SentencesConfig(), Skips(),
                      progress=False)


PINNED_DRAWS = {  # read_articles' order before the corpus went through a spool on disk
    "jsonl": ["a1", "a4", "a2", "a3", "a5", "a0"],
    "parquet": ["a2", "a0", "a9", "a10", "a11", "a7", "a5", "a6", "a3", "a4", "a8", "a1"],
    "text": ["one.txt:9", "two.txt:3", "two.txt:11", "one.txt:1", "one.txt:3", "one.txt:7", "two.txt:7", "two.txt:5",
             "one.txt:5", "two.txt:1", "two.txt:9", "two.txt:13"],
}


def _permuted(valid_ids: list[str], seed: int) -> list[str]:
    """The draw's definition: the valid, de-duplicated articles in file order, in the seed's permutation."""
    return [valid_ids[i] for i in np.random.default_rng(seed).permutation(len(valid_ids))]


def test_the_draw_is_the_seeded_permutation_of_the_valid_articles_in_file_order(tmp_path, bad_jsonl):
    """Pinned for each kind of finite source (a changed draw would change every split), with the records whole."""
    skips = Skips()
    drawn = list(read_articles(CorpusConfig(source=str(bad_jsonl), seed=5), skips))
    assert [a["id"] for a in drawn] == _permuted([a["id"] for a in ARTICLES[:6]], 5) == PINNED_DRAWS["jsonl"]
    assert drawn == [{"id": a["id"], "title": a["title"], "text": a["text"]}
                     for a in sorted(ARTICLES[:6], key=lambda a: PINNED_DRAWS["jsonl"].index(a["id"]))]
    assert sum(skips.values()) == 8
    for part, rows in enumerate((ARTICLES[:7], ARTICLES[5:])):  # a5 and a6 twice: the second ones dropped
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"part{part}.parquet")
    assert ids(CorpusConfig(source=str(tmp_path / "*.parquet"), seed=2)) == _permuted(
        [a["id"] for a in ARTICLES], 2) == PINNED_DRAWS["parquet"]
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "one.txt").write_text("\n\n".join(a["text"] for a in ARTICLES[:5]) + "\n")
    (folder / "two.txt").write_text("\r\n\n".join(a["text"] for a in ARTICLES[5:]))
    text_ids = [f"one.txt:{1 + 2 * i}" for i in range(5)] + [f"two.txt:{1 + 2 * i}" for i in range(7)]
    assert ids(CorpusConfig(source=str(folder), seed=7)) == _permuted(text_ids, 7) == PINNED_DRAWS["text"]



@pytest.mark.parametrize("content", [b"ok\n\xff bad\n", b"ok line\nends \xc3\n", b"fine\n\nends in \xe2\x82",
                                     b"\xf0\x9f\x98\x80 ok \xc3\xa9\n\n x \xed\xa0\x80 surrogate", b"\xff"])
def test_an_undecodable_text_file_is_one_skip_naming_the_byte_of_its_whole_decoding(tmp_path, content):
    (tmp_path / "good.txt").write_text("Good article. Two sentences.")
    (tmp_path / "bad.txt").write_bytes(b"A good first article.\n\n" + content)
    skips = Skips()
    assert ids(CorpusConfig(source=str(tmp_path)), skips) == ["good.txt:1"] and skips == {"undecodable": 1}
    try:
        (b"A good first article.\n\n" + content).decode("utf-8")
    except UnicodeDecodeError as e:
        byte = e.start
    with pytest.raises(PlanlmError, match=rf"bad.txt \(byte {byte}\): undecodable"):
        ids(CorpusConfig(source=str(tmp_path), on_bad_record="error"))
