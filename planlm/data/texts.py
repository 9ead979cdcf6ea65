"""Free texts as a prepared corpus: the documents of an outside evaluation (lm-evaluation-harness) in the folder
format of ``planlm.data.artifacts``, processed like the corpus a model was trained on.

``prepare_texts`` splits the texts with that corpus's sentence splitter, embeds the sentences with its encoder
(``embed_fn``, e.g. ``planlm.evaluate.generate.encoder_embed_fn``), gives each sentence the nearest action of its
codebook and tokenizes whole texts, then writes one split and a manifest that names the corpus's codebook.
Every plan source (``planlm.plans.sources``) then reads the texts as it reads a prepared split: their plans are
made exactly as ``planlm evaluate`` makes them. Without ``embed_fn`` (plans that read no sentence: fixed) the
embeddings and actions are zeros.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from planlm.data.artifacts import PreparedDataset, write_split
from planlm.data.kmeans import assign_actions
from planlm.data.resources import split_sentences
from planlm.data.tokens import tokenize_articles
from planlm.stage import write_manifest

Spans = Sequence[tuple[int, int]]


def sentence_spans(texts: Sequence[str], splitter: str) -> list[list[tuple[int, int]]]:
    """The splitter's sentences of each text; a text without one (empty, blank) is one sentence."""
    return [spans or [(0, len(text))] for text, spans in zip(texts, split_sentences(list(texts), splitter))]


def prepare_texts(out_dir: str | Path, texts: Sequence[str], like: PreparedDataset, tokenizer, *,
                  spans: Optional[Sequence[Spans]] = None, embed_fn: Optional[Callable] = None,
                  split: str = "texts") -> PreparedDataset:
    """Write ``texts`` as split ``split`` of a prepared folder at ``out_dir`` with the codebook of ``like``.

    ``spans`` (per text, (start, end) characters; default: ``like``'s splitter) lets a caller choose the
    sentences, e.g. those of an lm-eval context. Sentence texts are embedded once each, however often they recur."""
    out = Path(out_dir)
    spans = [list(s) for s in spans] if spans is not None else sentence_spans(texts, like.sentence_splitter)
    sentence_texts = [text[a:b] for text, text_spans in zip(texts, spans) for a, b in text_spans]
    embeddings, actions = _embed_and_assign(sentence_texts, like, embed_fn)
    ids, token_sentence = tokenize_articles(tokenizer, list(texts), [np.asarray(s, np.int64) for s in spans])
    sentence_offsets = np.concatenate([[0], np.cumsum([len(s) for s in spans])]).astype(np.int64)
    token_offsets = np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int64)
    empty = np.zeros(0, np.int64)
    token_sentence = [s + o for s, o in zip(token_sentence, sentence_offsets[:-1])]  # split-global
    write_split(out / split, [{"id": str(i), "text": text} for i, text in enumerate(texts)], {
        "sentence_offsets": sentence_offsets,
        "sentence_spans": np.asarray([s for text_spans in spans for s in text_spans], np.int64).reshape(-1, 2),
        "embeddings": embeddings, "actions": actions, "token_offsets": token_offsets,
        "input_ids": np.concatenate(ids) if ids else empty,
        "token_sentence": np.concatenate(token_sentence) if ids else empty,
    })
    config = {"like": str(like.path), "texts": len(texts), "sentences": {"splitter": like.sentence_splitter},
              "embedding": like.manifest.get("config", {}).get("embedding", {})}
    write_manifest(out, config, num_actions=like.num_actions, embedding_dim=like.embedding_dim,
                   tokenizer=like.tokenizer_name, encoder=like.encoder_name, splits=[split],
                   hashes={"codebook.safetensors": like.codebook_hash})
    return PreparedDataset(out)


def _embed_and_assign(sentence_texts: list[str], like: PreparedDataset, embed_fn) -> tuple[np.ndarray, np.ndarray]:
    """(N, E) embeddings (each distinct text encoded once) and (N,) nearest actions; zeros without ``embed_fn``."""
    if embed_fn is None or not sentence_texts:
        return (np.zeros((len(sentence_texts), like.embedding_dim), np.float32),
                np.zeros(len(sentence_texts), np.int64))
    unique, inverse = np.unique(np.asarray(sentence_texts, dtype=object), return_inverse=True)
    embeddings = np.asarray(embed_fn([str(t) for t in unique]), dtype=np.float32)[inverse]  # (N, E)
    actions = assign_actions(embeddings, like.codebook.numpy(), use_gpu=False, progress=False)
    return embeddings, actions


__all__ = ["prepare_texts", "sentence_spans"]
