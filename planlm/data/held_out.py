"""Held-out documents, their near-copies and their verbatim passages: no text of a test or validation document
may reach training.

A document is held out when any of its pieces went to the test or validation split; its whole text is indexed,
the pieces that ``corpus.pieces_per_source`` or a split's edge dropped included. Every piece of the training side
(the LM's training split, the rest of the training side that the planner and the codebook read,
``planlm.data.planner_corpus``) is compared with the whole text of every held-out document, not only by id,
because the same text can come under another id (the same Wikipedia article from another dump, a corpus that
holds a speech twice, a speech that repeats whole paragraphs of last year's).

Texts are compared by their words after a normalisation that a copy does not survive: case folded, punctuation
and line breaks dropped (a reflowed or re-punctuated copy keeps its words) and short bracketed markers such as
``[1]`` or ``[Laughter]`` removed wherever they stand, between any two words. Two checks, both on word 8-grams:

- **Verbatim passages.** A piece that shares a run of at least ``VERBATIM_WORDS`` (50) consecutive words with a
  held-out document (the exact-substring rule of Lee et al. 2022, 50 tokens) loses every sentence that holds a
  word of the run; the sentences it keeps are joined at a paragraph break. A run of 50 words is 43 consecutive
  8-grams found at consecutive positions of both texts, which is what ``HeldOutIndex.runs`` looks for. A piece
  that would keep less than ``KEEP_SHARE`` of its words, or fewer sentences than a piece needs, is dropped whole.
- **Near-copies.** The overlap of a piece D with a held-out document H is the share of the shorter one's
  distinct 8-grams that the other holds, ``|D ∩ H| / min(|D|, |H|)``, so that half of a held-out document
  copied, or a held-out document inside a longer one, counts as a full copy. At or above ``NEAR_COPY_OVERLAP``
  the piece is a copy, dropped whole even where no run reaches 50 words (a copy edited every few dozen words);
  below it, unrelated documents share stock phrases (a few percent on the shipped corpora). A pair must also
  share at least ``MIN_SHARED`` 8-grams, so that documents of a couple of sentences ("Thank you. God bless
  America.") are not taken for copies of every document that ends so.
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
VERBATIM_WORDS = 50
"""A verbatim run of this many consecutive words of a held-out document is dropped from the training side (the
exact-substring rule of Lee et al. 2022: 50 tokens)."""
RUN_SHINGLES = VERBATIM_WORDS - SHINGLE_WORDS + 1
"""A run of ``VERBATIM_WORDS`` words is this many consecutive 8-grams (43)."""
KEEP_SHARE = 0.5
"""A piece that would keep less than this share of its words once its verbatim passages are cut is dropped whole:
what is left is fragments around the copy."""

_MARKER = re.compile(r"\[[^\[\]\n]{0,40}\]")  # [1], [citation needed], [Laughter]
_WORD = re.compile(r"\w+")
# One random odd 64-bit multiplier per shingle position: the hash of an 8-gram is sum_j code_j * K_j mod 2^64.
_KEYS = np.random.default_rng(20240607).integers(1, 2 ** 63, size=SHINGLE_WORDS, dtype=np.uint64) * 2 + 1


def words(text: str) -> list[str]:
    """The text's words, case folded, markers and punctuation dropped."""
    return _WORD.findall(_MARKER.sub(" ", text).casefold())


def word_offsets(text: str) -> np.ndarray:
    """(W, 2) the [start, end) character offsets in ``text`` of the words of ``words(text)``, in order (a marker
    is blanked in place, so the offsets are the text's own)."""
    blanked = _MARKER.sub(lambda m: " " * len(m.group()), text)
    return np.array([m.span() for m in _WORD.finditer(blanked)], dtype=np.int64).reshape(-1, 2)


@dataclass
class Run:
    """A verbatim run shared with a held-out document: words [start, stop) of the compared text (``words``)."""

    start: int
    stop: int
    held_out: str
    split: str

    @property
    def length(self) -> int:
        return self.stop - self.start


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
        self._positional: list[np.ndarray] = []  # each document's 8-gram hashes in text order
        self.documents: list[tuple[str, str]] = []  # (document id, split)
        self._sizes: list[int] = []
        self._sorted: np.ndarray | None = None
        self._owners: np.ndarray | None = None

    def add(self, document: str, split: str, text: str) -> None:
        """Index a held-out document's text (call once per document, with all of its text)."""
        ordered = _shingle_hashes(_word_codes(text))
        shingles = np.unique(ordered)
        self._hashes.append(shingles)
        self._positional.append(ordered if len(ordered) >= RUN_SHINGLES else np.zeros(0, np.uint64))
        self._sizes.append(len(shingles))
        self.documents.append((document, split))
        self._sorted = None

    def _build(self) -> None:
        hashes = np.concatenate(self._hashes) if self._hashes else np.zeros(0, np.uint64)
        owners = np.repeat(np.arange(len(self._hashes), dtype=np.int64), self._sizes)
        order = np.argsort(hashes, kind="stable")
        self._sorted, self._owners = hashes[order], owners[order]
        self._size_array = np.asarray(self._sizes, dtype=np.int64)
        # every 8-gram at every position, sorted by hash: where a run of the compared text lies in which document
        positional = np.concatenate(self._positional) if self._positional else np.zeros(0, np.uint64)
        order = np.argsort(positional, kind="stable")
        counts = [len(p) for p in self._positional]
        self._run_sorted = positional[order]
        self._run_owners = np.repeat(np.arange(len(counts), dtype=np.int64), counts)[order]
        self._run_positions = (np.arange(len(positional), dtype=np.int64)
                               - np.repeat(np.cumsum(counts) - counts, counts))[order]

    def __len__(self) -> int:
        return len(self.documents)

    def overlap(self, text: str) -> Overlap:
        """The held-out document that ``text`` overlaps most, and by how much (0 when none shares MIN_SHARED)."""
        return self.compare(text)[0]

    def compare(self, text: str) -> tuple[Overlap, list[Run]]:
        """The largest overlap of ``text`` with a held-out document, and every verbatim run of at least
        ``VERBATIM_WORDS`` words that it shares with one (in words of ``words(text)``, by start)."""
        if self._sorted is None:
            self._build()
        ordered = _shingle_hashes(_word_codes(text))
        if len(ordered) == 0 or len(self._sorted) == 0:
            return Overlap(0.0, 0), []
        shingles, inverse = np.unique(ordered, return_inverse=True)
        left = np.searchsorted(self._sorted, shingles, side="left")
        right = np.searchsorted(self._sorted, shingles, side="right")
        counts = right - left
        total = int(counts.sum())
        if total == 0:
            return Overlap(0.0, 0), []
        starts = np.repeat(left - np.cumsum(counts) + counts, counts)
        owners = self._owners[starts + np.arange(total)]
        documents, shared = np.unique(owners, return_counts=True)
        shares = shared / np.minimum(len(shingles), self._size_array[documents])
        shares[shared < MIN_SHARED] = 0.0
        best = int(np.argmax(shares))
        document, split = self.documents[documents[best]]
        found = Overlap(float(shares[best]), int(shared[best]), document, split)
        return found, self._runs(ordered, counts[inverse] > 0)

    def _runs(self, ordered: np.ndarray, held: np.ndarray) -> list[Run]:
        """The runs of >= RUN_SHINGLES 8-grams of ``ordered`` (the compared text's, in order) found at consecutive
        positions of one held-out document; ``held``: which of them any held-out document holds. Only stretches of
        RUN_SHINGLES held 8-grams in a row are looked up by position, so a text that shares none costs nothing."""
        edges = np.flatnonzero(np.diff(np.concatenate([[False], held, [False]]).astype(np.int8)))
        stretches = [(a, b) for a, b in zip(edges[::2].tolist(), edges[1::2].tolist()) if b - a >= RUN_SHINGLES]
        if not stretches:
            return []
        positions = np.concatenate([np.arange(a, b) for a, b in stretches])
        left = np.searchsorted(self._run_sorted, ordered[positions], side="left")
        right = np.searchsorted(self._run_sorted, ordered[positions], side="right")
        counts = right - left
        found = np.repeat(left - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        at = np.repeat(positions, counts)  # (M,) a match: position `at` here, `held_at` in document `owner`
        owner, diagonal = self._run_owners[found], self._run_positions[found] - at
        order = np.lexsort((at, diagonal, owner))
        at, owner, diagonal = at[order], owner[order], diagonal[order]
        breaks = np.flatnonzero((np.diff(at) != 1) | (np.diff(owner) != 0) | (np.diff(diagonal) != 0)) + 1
        runs = []
        for first, last in zip(np.concatenate([[0], breaks]).tolist(), np.concatenate([breaks, [len(at)]]).tolist()):
            if last - first >= RUN_SHINGLES:
                document, split = self.documents[int(owner[first])]
                runs.append(Run(int(at[first]), int(at[last - 1]) + SHINGLE_WORDS, document, split))
        return sorted(runs, key=lambda r: (r.start, -r.length))


def _word_codes(text: str) -> np.ndarray:
    """(W,) a 64-bit code per word (Python's string hash: stable within the process that builds and searches an
    index, which is all an index needs)."""
    found = words(text)
    return np.fromiter(map(hash, found), dtype=np.int64, count=len(found)).view(np.uint64)


def _shingle_hashes(codes: np.ndarray) -> np.ndarray:
    """(W - 7,) the hash of the 8-gram at each word position, in order (a text shorter than 8 words: its one
    n-gram)."""
    if len(codes) == 0:
        return np.zeros(0, np.uint64)
    width = min(SHINGLE_WORDS, len(codes))
    hashes = np.zeros(len(codes) - width + 1, dtype=np.uint64)
    for j in range(width):  # uint64 arithmetic wraps: the hash is taken mod 2^64
        hashes += codes[j:len(codes) - width + 1 + j] * _KEYS[j]
    return hashes


@dataclass
class Cut:
    """A training piece's verbatim passages of held-out documents: what ``HeldOut.screen`` found and did."""

    piece: dict | None
    """The piece without them (its sentences that hold no word of a run), or None: dropped whole."""
    spans: np.ndarray | None
    """(S', 2) its sentence spans in the new text."""
    runs: list[Run]
    passages: int
    """Stretches of consecutive sentences cut out."""
    words: int
    """Words cut out (all of the piece's when it is dropped whole)."""


class HeldOut:
    """The test and validation documents, by id and by text: a training document may share neither.

    ``add`` indexes a held-out document's whole text; ``near_copy``, ``screen`` and ``check`` compare a training
    piece with them, keeping the largest overlap seen below the limit and the counts of the verbatim passages cut,
    which ``prepare`` records in its manifest."""

    def __init__(self):
        self.ids: dict[str, str] = {}
        self.index = HeldOutIndex()
        self.largest = Overlap(0.0, 0)
        self.largest_document = ""
        self.checked = 0
        self.verbatim = {"pieces_cut": 0, "passages": 0, "words": 0, "pieces_dropped": 0, "longest_run": 0,
                         "longest_pair": None}

    def add(self, split: str, document: dict) -> None:
        """Hold out ``document`` (a corpus record: its id and whole text, every piece of it)."""
        name = str(document.get("source", document["id"]))
        if name not in self.ids:
            self.ids[name] = split
            self.index.add(name, split, document["text"])

    def near_copy(self, article: dict) -> Overlap | None:
        """The held-out document that ``article`` is a near-copy of (overlap at or above the limit), else None."""
        return self._compare(article)[0]

    def _compare(self, article: dict) -> tuple[Overlap | None, list[Run]]:
        self.checked += 1
        found, runs = self.index.compare(article["text"])
        if found.overlap >= NEAR_COPY_OVERLAP:
            return found, runs
        if found.overlap > self.largest.overlap:
            self.largest, self.largest_document = found, str(article["id"])
        return None, runs

    def screen(self, article: dict, spans: np.ndarray, min_sentences: int = 1) -> tuple[Overlap | None, Cut | None]:
        """Compare a training piece (``spans``: its sentences' character spans) with the held-out documents:
        (the document it is a near-copy of, else None; its verbatim passages cut, else None when it has none).
        The piece is dropped whole (``Cut.piece`` None) when it would keep less than ``KEEP_SHARE`` of its words
        or fewer than ``min_sentences`` sentences; the counts go to ``verbatim`` (``record``)."""
        found, runs = self._compare(article)
        if found is not None or not runs:
            return found, None
        cut = cut_runs(article, spans, runs, min_sentences)
        longest = max(runs, key=lambda r: r.length)
        if longest.length > self.verbatim["longest_run"]:
            self.verbatim.update(longest_run=longest.length, longest_pair=[str(article["id"]), longest.held_out])
        if cut.piece is None:
            self.verbatim["pieces_dropped"] += 1
        else:
            self.verbatim["pieces_cut"] += 1
            self.verbatim["passages"] += cut.passages
        self.verbatim["words"] += cut.words
        return None, cut

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
        """The manifest's account of the checks: the limit, the documents checked, the largest overlap below it,
        and the verbatim passages cut (pieces cut, passages, words; pieces dropped whole, their words counted too;
        the longest run found)."""
        return {"limit": NEAR_COPY_OVERLAP, "shingle_words": SHINGLE_WORDS, "held_out_documents": len(self.index),
                "checked": self.checked, "largest_overlap": round(self.largest.overlap, 4),
                "largest_pair": [self.largest_document, self.largest.held_out] if self.largest_document else None,
                "verbatim": {"min_words": VERBATIM_WORDS, "keep_share": KEEP_SHARE, **self.verbatim}}


def cut_runs(article: dict, spans: np.ndarray, runs: list[Run], min_sentences: int = 1) -> Cut:
    """``article`` without every sentence that holds a word of one of ``runs`` (words of ``words(article["text"])``);
    the stretches of sentences it keeps are joined at a paragraph break. Dropped whole (``piece`` None) when less
    than ``KEEP_SHARE`` of its words or fewer than ``min_sentences`` sentences would be left."""
    text = article["text"]
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    offsets = word_offsets(text)
    total = len(offsets)
    if total != len(words(text)):  # case folding changed a word's bounds (a rare letter): no safe cut
        return Cut(None, None, runs, 1, total)
    cut = np.zeros(len(spans), dtype=bool)
    for run in runs:  # every sentence that a character of the run falls in
        begin, end = offsets[run.start, 0], offsets[run.stop - 1, 1]
        cut |= (spans[:, 1] > begin) & (spans[:, 0] < end)
    sentence_words = np.searchsorted(offsets[:, 0], spans[:, 1]) - np.searchsorted(offsets[:, 0], spans[:, 0])
    dropped = int(sentence_words[cut].sum())
    passages = int(np.count_nonzero(np.diff(np.concatenate([[0], cut.astype(np.int8)])) == 1))
    if (~cut).sum() < max(1, min_sentences) or total - dropped < KEEP_SHARE * total:
        return Cut(None, None, runs, passages, total)
    pieces, new_spans, at = [], [], 0
    kept = np.flatnonzero(~cut)
    for block in np.split(kept, np.flatnonzero(np.diff(kept) != 1) + 1):
        begin, end = int(spans[block[0], 0]), int(spans[block[-1], 1])
        if pieces:
            at += len(_JOIN)
        new_spans.append(spans[block] - begin + at)
        pieces.append(text[begin:end])
        at += end - begin
    return Cut({**article, "text": _JOIN.join(pieces)}, np.concatenate(new_spans), runs, passages, dropped)


_JOIN = "\n\n"  # a cut passage leaves a paragraph break


def describe(found: Overlap) -> str:
    """How much two documents share, for a message."""
    return (f"{found.overlap:.0%} of the shorter one's word {SHINGLE_WORDS}-grams, {found.shared} shared; the limit "
            f"is {NEAR_COPY_OVERLAP:.0%}")
