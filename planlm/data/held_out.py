"""Held-out documents and their near-copies: no text of a test or validation document may reach training.

A document is held out when any of its pieces went to the test or validation split; its whole text is indexed,
the pieces that ``corpus.pieces_per_source`` or a split's edge dropped included. Every document that the LM's
training split, the rest of the training side or a planner source brings (``planlm.data.planner_corpus``) is
compared with them by text, not only by id, because the same text can come under another id (the same Wikipedia
article from another dump, a corpus that holds a speech twice).

Texts are compared by their word 8-grams after a normalisation that a copy does not survive: case folded,
punctuation and line breaks dropped (a reflowed or re-punctuated copy keeps its 8-grams) and short bracketed
markers such as ``[1]`` or ``[Laughter]`` removed. The overlap of a training document D with a held-out document
H is the share of the shorter one's distinct 8-grams that the other holds, ``|D ∩ H| / min(|D|, |H|)``, so that
half of a held-out document copied, or a held-out document inside a longer one, counts as a full copy. At or
above ``NEAR_COPY_OVERLAP`` the pair is a copy; below it, unrelated documents share stock phrases (a few
percent on the shipped corpora). A pair must also share at least ``MIN_SHARED`` 8-grams, so that documents of a
couple of sentences ("Thank you. God bless America.") are not taken for copies of every document that ends so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from planlm.errors import PlanlmError

NEAR_COPY_OVERLAP = 0.5
"""The overlap at or above which a training document is a copy of a held-out one (share of the shorter one's
distinct word 8-grams found in the other)."""
SHINGLE_WORDS = 8
"""Words per shingle: long enough that unrelated texts rarely share one, short enough to survive light edits."""
MIN_SHARED = 20
"""A copy shares at least this many distinct 8-grams (a passage of about 27 words)."""

_MARKER = re.compile(r"\[[^\[\]\n]{0,40}\]")  # [1], [citation needed], [Laughter]
_WORD = re.compile(r"\w+")
# One random odd 64-bit multiplier per shingle position: the hash of an 8-gram is sum_j code_j * K_j mod 2^64.
_KEYS = np.random.default_rng(20240607).integers(1, 2 ** 63, size=SHINGLE_WORDS, dtype=np.uint64) * 2 + 1


def words(text: str) -> list[str]:
    """The text's words, case folded, markers and punctuation dropped."""
    return _WORD.findall(_MARKER.sub(" ", text).casefold())


@dataclass
class Overlap:
    """The largest overlap of one document with a held-out document."""

    overlap: float
    shared: int
    held_out: str = ""
    split: str = ""


class HeldOutIndex:
    """The distinct word 8-grams of every held-out document, searchable by a training document's."""

    def __init__(self):
        self._hashes: list[np.ndarray] = []
        self.documents: list[tuple[str, str]] = []  # (document id, split)
        self._sizes: list[int] = []
        self._sorted: np.ndarray | None = None
        self._owners: np.ndarray | None = None

    def add(self, document: str, split: str, text: str) -> None:
        """Index a held-out document's text (call once per document, with all of its text)."""
        shingles = _shingles(_word_codes(text))
        self._hashes.append(shingles)
        self._sizes.append(len(shingles))
        self.documents.append((document, split))
        self._sorted = None

    def _build(self) -> None:
        hashes = np.concatenate(self._hashes) if self._hashes else np.zeros(0, np.uint64)
        owners = np.repeat(np.arange(len(self._hashes), dtype=np.int64), self._sizes)
        order = np.argsort(hashes, kind="stable")
        self._sorted, self._owners = hashes[order], owners[order]
        self._size_array = np.asarray(self._sizes, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.documents)

    def overlap(self, text: str) -> Overlap:
        """The held-out document that ``text`` overlaps most, and by how much (0 when none shares MIN_SHARED)."""
        if self._sorted is None:
            self._build()
        shingles = _shingles(_word_codes(text))
        if len(shingles) == 0 or len(self._sorted) == 0:
            return Overlap(0.0, 0)
        left = np.searchsorted(self._sorted, shingles, side="left")
        right = np.searchsorted(self._sorted, shingles, side="right")
        counts = right - left
        total = int(counts.sum())
        if total == 0:
            return Overlap(0.0, 0)
        starts = np.repeat(left - np.cumsum(counts) + counts, counts)
        owners = self._owners[starts + np.arange(total)]
        documents, shared = np.unique(owners, return_counts=True)
        shares = shared / np.minimum(len(shingles), self._size_array[documents])
        shares[shared < MIN_SHARED] = 0.0
        best = int(np.argmax(shares))
        document, split = self.documents[documents[best]]
        return Overlap(float(shares[best]), int(shared[best]), document, split)


def _word_codes(text: str) -> np.ndarray:
    """(W,) a 64-bit code per word (Python's string hash: stable within the process that builds and searches an
    index, which is all an index needs)."""
    found = words(text)
    return np.fromiter(map(hash, found), dtype=np.int64, count=len(found)).view(np.uint64)


def _shingles(codes: np.ndarray) -> np.ndarray:
    """(N,) the distinct hashes of the word codes' 8-grams (a text shorter than 8 words: its one n-gram)."""
    if len(codes) == 0:
        return np.zeros(0, np.uint64)
    width = min(SHINGLE_WORDS, len(codes))
    hashes = np.zeros(len(codes) - width + 1, dtype=np.uint64)
    for j in range(width):  # uint64 arithmetic wraps: the hash is taken mod 2^64
        hashes += codes[j:len(codes) - width + 1 + j] * _KEYS[j]
    return np.unique(hashes)


class HeldOut:
    """The test and validation documents, by id and by text: a training document may share neither.

    ``add`` indexes a held-out document's whole text; ``near_copy`` and ``check`` compare a training document with
    them and keep the largest overlap seen below the limit, which ``prepare`` records in its manifest."""

    def __init__(self):
        self.ids: dict[str, str] = {}
        self.index = HeldOutIndex()
        self.largest = Overlap(0.0, 0)
        self.largest_document = ""
        self.checked = 0

    def add(self, split: str, document: dict) -> None:
        """Hold out ``document`` (a corpus record: its id and whole text, every piece of it)."""
        name = str(document.get("source", document["id"]))
        if name not in self.ids:
            self.ids[name] = split
            self.index.add(name, split, document["text"])

    def near_copy(self, article: dict) -> Overlap | None:
        """The held-out document that ``article`` is a near-copy of (overlap at or above the limit), else None."""
        self.checked += 1
        found = self.index.overlap(article["text"])
        if found.overlap >= NEAR_COPY_OVERLAP:
            return found
        if found.overlap > self.largest.overlap:
            self.largest, self.largest_document = found, str(article["id"])
        return None

    def check(self, article: dict, where: str, what: str, fix: str, by_text: bool = True) -> None:
        """One-line error when ``article`` (from ``where``; ``what`` names it, e.g. "the planner's document") is a
        held-out document by id (its source document's) or, with ``by_text``, a near-copy of one."""
        document = str(article.get("source", article["id"]))
        title = f" ({article['title']})" if article.get("title") else ""
        if document in self.ids:
            raise PlanlmError(f"{where}: {what} {document!r}{title} is also in the {self.ids[document]} split (the "
                              f"same document id); no document may lie in two splits: {fix}")
        if by_text and (found := self.near_copy(article)) is not None:
            raise PlanlmError(f"{where}: {what} {str(article['id'])!r}{title} is a near-copy of the {found.split} "
                              f"document {found.held_out!r} ({describe(found)}); no document may lie in two splits: "
                              f"{fix}")

    def record(self) -> dict:
        """The manifest's account of the check: the limit, the documents checked, the largest overlap below it."""
        return {"limit": NEAR_COPY_OVERLAP, "shingle_words": SHINGLE_WORDS, "held_out_documents": len(self.index),
                "checked": self.checked, "largest_overlap": round(self.largest.overlap, 4),
                "largest_pair": [self.largest_document, self.largest.held_out] if self.largest_document else None}


def describe(found: Overlap) -> str:
    """How much two documents share, for a message."""
    return (f"{found.overlap:.0%} of the shorter one's word {SHINGLE_WORDS}-grams, {found.shared} shared; the limit "
            f"is {NEAR_COPY_OVERLAP:.0%}")
