"""The split's token arrays are written an article chunk at a time (``planlm.data.artifacts.write_token_arrays``,
``TokenSpool``): byte for byte what tokenising the whole split and ``np.save``-ing whole arrays wrote, never into an
existing file, and never a short file under a final name."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest

from planlm.data.artifacts import (TOKEN_ARRAYS, PreparedDataset, TokenSpool, article_chunks, token_plan_sentence,
                                   write_split, write_token_arrays)
from planlm.data.prepare import _drop_stale, _tokenize
from planlm.data.resources import load_tokenizer
from planlm.data.spool import ArticleSpool
from planlm.data.tokens import tokenize_articles


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array, dtype=np.int64))
    return buffer.getvalue()


def _whole_split(tok, texts: list[str], spans: list[np.ndarray], sentence_offsets: np.ndarray,
                 actions: np.ndarray) -> dict[str, np.ndarray]:
    """The token arrays as planlm wrote them before streaming: the whole split tokenised, then derived at once."""
    ids, local = tokenize_articles(tok, texts, spans)
    token_offsets = np.concatenate([[0], np.cumsum([len(i) for i in ids], dtype=np.int64)]).astype(np.int64)
    token_sentence = np.concatenate([s + sentence_offsets[a] for a, s in enumerate(local)])
    plan = token_plan_sentence(token_sentence, token_offsets)
    return {"token_offsets": token_offsets, "input_ids": np.concatenate(ids), "token_sentence": token_sentence,
            "token_plan_sentence": plan, "token_actions": actions[plan]}


@pytest.mark.parametrize("chunk_tokens", [1, 7, 50, 1 << 18])
def test_streamed_tokens_are_the_whole_split_result_byte_for_byte(wiki_slice, tmp_path, monkeypatch, chunk_tokens):
    """Chunks of one token (every article alone), of 7 and 50 (articles cut across chunk edges are impossible: a
    chunk ends at an article's end) and planlm's own, with tokeniser batches of 3 articles."""
    monkeypatch.setattr("planlm.data.artifacts.CHUNK_TOKENS", chunk_tokens)
    tok = load_tokenizer("gpt2")
    data = PreparedDataset(wiki_slice)["train"]
    texts = [a["text"] for a in data.articles]
    spans = [np.asarray(data.sentence_spans[r.start:r.stop]) for r in map(data.sentence_range, range(len(texts)))]
    sentence_offsets, actions = np.asarray(data.sentence_offsets), np.asarray(data.actions)
    with ArticleSpool(tmp_path) as articles:  # the split's articles as prepare holds them: on disk
        articles += [({"id": str(i), "text": text}, s) for i, (text, s) in enumerate(zip(texts, spans))]
        token_offsets = _tokenize(tok, tmp_path, articles, sentence_offsets, actions, "tokenizing", False, batch=3)
    expected = _whole_split(tok, texts, spans, sentence_offsets, actions)
    if chunk_tokens == 1:  # the patch took: every article is a chunk
        assert len(list(article_chunks(token_offsets))) == len(texts)
    assert np.array_equal(token_offsets, expected["token_offsets"]) and token_offsets.dtype == np.int64
    for name in TOKEN_ARRAYS:
        written = (tmp_path / f"{name}.npy").read_bytes()
        assert written == _npy_bytes(expected[name]), name
        assert written == (data.path / f"{name}.npy").read_bytes(), name  # what the fixture's prepare wrote
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{n}.npy" for n in TOKEN_ARRAYS)  # no .tmp left


def test_in_memory_arrays_with_empty_articles_match_whole_array_derivation(tmp_path, monkeypatch):
    """``write_split``'s callers with in-memory tokens (synthetic data, ``planlm.data.texts``): articles without
    tokens first, in the middle and last, and other dtypes than int64, as ``np.save`` of the cast arrays wrote."""
    monkeypatch.setattr("planlm.data.artifacts.CHUNK_TOKENS", 4)
    lengths = [0, 3, 1, 0, 5, 2, 0]
    token_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    sentences_per_article = [1, 2, 1, 1, 3, 1, 1]
    sentence_offsets = np.concatenate([[0], np.cumsum(sentences_per_article)]).astype(np.int64)
    rng = np.random.default_rng(0)
    token_sentence = np.concatenate([np.sort(rng.integers(sentence_offsets[a], sentence_offsets[a + 1], n))
                                     for a, n in enumerate(lengths)]).astype(np.int32)
    actions = rng.integers(0, 5, int(sentence_offsets[-1]))
    input_ids = rng.integers(0, 50257, int(token_offsets[-1])).astype(np.float64)
    num_sentences = int(sentence_offsets[-1])
    write_split(tmp_path, [{"id": str(a), "text": "x"} for a in range(len(lengths))], {
        "sentence_offsets": sentence_offsets, "sentence_spans": np.zeros((num_sentences, 2)),
        "embeddings": np.zeros((num_sentences, 2)), "actions": actions, "token_offsets": token_offsets,
        "input_ids": input_ids, "token_sentence": token_sentence})
    plan = token_plan_sentence(token_sentence, token_offsets)
    expected = {"input_ids": input_ids, "token_sentence": token_sentence, "token_plan_sentence": plan,
                "token_actions": actions[plan]}
    for name, array in expected.items():
        assert (tmp_path / f"{name}.npy").read_bytes() == _npy_bytes(array), name


def test_no_existing_file_is_written_into_and_a_cut_write_leaves_no_file(tmp_path):
    """A codebook folder hard-links the token arrays: rewriting them must leave the linked files alone. A write cut
    off half way leaves neither the old file nor a short new one under the final name, and no temporary file."""
    token_offsets = np.array([0, 3, 5], np.int64)
    arrays = {"input_ids": np.arange(5), "token_sentence": np.array([0, 0, 1, 2, 2])}
    write_token_arrays(tmp_path, token_offsets, np.array([4, 5, 6]), lambda name, a, b: arrays[name][a:b])
    linked = tmp_path / "linked"
    linked.mkdir()
    for name in TOKEN_ARRAYS:
        os.link(tmp_path / f"{name}.npy", linked / f"{name}.npy")
    before = {name: (linked / f"{name}.npy").read_bytes() for name in TOKEN_ARRAYS}
    write_token_arrays(tmp_path, token_offsets, np.array([7, 8, 9]), lambda name, a, b: arrays[name][a:b] + (name == "input_ids"))
    assert {name: (linked / f"{name}.npy").read_bytes() for name in TOKEN_ARRAYS} == before
    assert np.load(tmp_path / "token_actions.npy").tolist() != np.load(linked / "token_actions.npy").tolist()

    def cut(name, start, stop):
        if start > 0:
            raise KeyboardInterrupt
        return arrays[name][start:stop]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("planlm.data.artifacts.CHUNK_TOKENS", 3)
        with pytest.raises(KeyboardInterrupt):
            write_token_arrays(tmp_path, token_offsets, np.array([4, 5, 6]), cut)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["linked"]
    assert {name: (linked / f"{name}.npy").read_bytes() for name in TOKEN_ARRAYS} == before


def test_the_spool_files_go_with_the_spool_and_prepare_drops_what_a_killed_build_left(tmp_path):
    with pytest.raises(RuntimeError):
        with TokenSpool(tmp_path / "train") as spool:  # no key: nothing to resume from, nothing kept
            spool.append([np.arange(3)], [np.zeros(3, np.int64)])
            raise RuntimeError("interrupted")
    assert list((tmp_path / "train").iterdir()) == []
    # a build killed outright leaves its temporary files: the next build drops the half-written arrays and keeps
    # the embeddings and the token spools, which it resumes from only under their own key
    kept = ["embeddings.npy", "input_ids.spool.tmp", "token_sentence.spool.tmp", "article_tokens.spool.tmp",
            "tokens.progress.json"]
    for name in [*kept, "token_actions.npy.tmp", "input_ids.npy"]:
        (tmp_path / "train" / name).write_bytes(b"half")
    _drop_stale(tmp_path)
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == sorted(kept)
    with TokenSpool(tmp_path / "train", key="another build") as spool:  # not its record: started afresh
        assert spool.done == 0
        spool.append([np.arange(2)], [np.zeros(2, np.int64)])
        offsets = spool.write(np.array([7]))
    np.testing.assert_array_equal(offsets, [0, 2])
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == sorted(
        ["embeddings.npy", *(f"{name}.npy" for name in TOKEN_ARRAYS)])


def spool_chunks(spool, chunks, start=0):
    for ids in chunks[start:]:
        spool.append(ids, [np.arange(len(a), dtype=np.int64) % 2 for a in ids])


def test_a_keyed_spool_continues_after_its_last_recorded_chunk_to_the_uninterrupted_arrays(tmp_path):
    rng = np.random.default_rng(0)
    chunks = [[rng.integers(0, 50, size=n) for n in sizes] for sizes in ([3, 4], [2], [5, 1, 2], [4])]
    actions = np.arange(10)  # (token sentences 0 and 1, looked one ahead)
    with TokenSpool(tmp_path / "whole", key="k") as spool:
        spool_chunks(spool, chunks)
        whole = spool.write(actions)
    split = tmp_path / "split"
    with pytest.raises(KeyboardInterrupt):
        with TokenSpool(split, key="k") as spool:
            spool_chunks(spool, chunks[:2])
            spool.files["input_ids"].write(b"partial chunk, never recorded")
            raise KeyboardInterrupt
    assert json.loads((split / TokenSpool.PROGRESS).read_text()) == {"key": "k", "articles": 3, "tokens": 9}
    with TokenSpool(split, key="k") as spool:
        assert (spool.done, spool.tokens) == (3, 9)
        spool_chunks(spool, chunks, start=2)
        resumed = spool.write(actions)
    np.testing.assert_array_equal(resumed, whole)
    for name in TOKEN_ARRAYS:
        assert (split / f"{name}.npy").read_bytes() == (tmp_path / "whole" / f"{name}.npy").read_bytes(), name
    assert sorted(p.name for p in split.iterdir()) == sorted(f"{name}.npy" for name in TOKEN_ARRAYS)
