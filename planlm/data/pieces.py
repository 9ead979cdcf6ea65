"""Long documents cut into pieces of at most N sentences (``corpus.piece_sentences``).

The paper reads ~35-sentence Wikipedia articles through a 128-token window. Books, reports or speeches
are far longer than that; a piece of about 30 sentences keeps the regime (most of a piece lies beyond
the LM's window, inside the planner's view) at a size a batch of sentence contexts can hold.

Cuts fall at paragraph breaks (a blank line): whole paragraphs are packed into a piece while it holds at
most N sentences. A paragraph longer than N sentences (or a document without blank lines) is cut at
sentence boundaries into the fewest pieces of at most N, of equal size (so no 1-sentence remainder).
A piece keeps its document's id as ``source``; ``planlm.data.corpus`` draws the splits by source.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n")


def paragraph_of_sentences(text: str, spans: np.ndarray) -> np.ndarray:
    """(N_sent,) index of the paragraph holding each sentence's first character."""
    breaks = np.array([m.start() for m in _PARAGRAPH_BREAK.finditer(text)], dtype=np.int64)
    return np.searchsorted(breaks, spans[:, 0], side="right")


def piece_sentence_ranges(paragraph: np.ndarray, max_sentences: int) -> list[tuple[int, int]]:
    """[first, last) sentence ranges of the pieces, given each sentence's paragraph (N_sent,)."""
    starts = np.flatnonzero(np.diff(paragraph, prepend=-1))
    ends = np.append(starts[1:], len(paragraph))
    pieces: list[tuple[int, int]] = []
    first = last = 0  # the piece being packed: sentences [first, last)
    for start, end in zip(starts.tolist(), ends.tolist()):
        if end - start > max_sentences:  # a long paragraph: equal cuts at sentence boundaries
            if last > first:
                pieces.append((first, last))
            bounds = np.linspace(start, end, -(-(end - start) // max_sentences) + 1).round().astype(int)
            pieces += list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
            first = last = end
        elif end - first > max_sentences:
            pieces.append((first, last))
            first, last = start, end
        else:
            last = end
    if last > first:
        pieces.append((first, last))
    return pieces


def cut_into_pieces(article: dict, spans: np.ndarray, max_sentences: int | None,
                    max_pieces: int | None = None, seed: int = 0,
                    left_out: list | None = None) -> list[tuple[dict, np.ndarray]]:
    """The pieces of one document, each ``(article, spans)`` with spans relative to the piece's text.

    Every piece (a document kept whole too) carries ``source`` = the document's id; a cut document's pieces
    are ``<id>#<n>`` (n counts from 0 over all its pieces, also those ``max_pieces`` leaves out). With
    ``left_out``, the pieces that ``max_pieces`` leaves out are appended to it (the planner's extra documents)."""
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    if max_sentences is None or len(spans) <= max_sentences:
        return [({**article, "source": article.get("source", article["id"])}, spans)]
    ranges = list(enumerate(piece_sentence_ranges(paragraph_of_sentences(article["text"], spans), max_sentences)))
    kept = ranges
    if max_pieces is not None and len(ranges) > max_pieces:
        rng = np.random.default_rng([seed, zlib.crc32(str(article["id"]).encode())])  # stable across runs
        kept = [ranges[i] for i in sorted(rng.choice(len(ranges), size=max_pieces, replace=False))]
    if left_out is not None and len(kept) < len(ranges):
        left_out += _pieces(article, spans, [r for r in ranges if r not in kept])
    return _pieces(article, spans, kept)


def _pieces(article: dict, spans: np.ndarray, ranges: list[tuple[int, tuple[int, int]]]) -> list[tuple[dict, np.ndarray]]:
    pieces = []
    for number, (first, last) in ranges:
        begin, end = int(spans[first, 0]), int(spans[last - 1, 1])
        begin += len(article["text"][begin:end]) - len(article["text"][begin:end].lstrip())  # spaCy's sentence
        piece_spans = np.maximum(spans[first:last] - begin, 0)  # can open with the paragraph break before it
        piece = {**article, "id": f"{article['id']}#{number}", "source": article["id"],
                 "text": article["text"][begin:end]}
        pieces.append((piece, piece_spans))
    return pieces
