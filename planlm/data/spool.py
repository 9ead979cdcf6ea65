"""Articles on disk while ``planlm prepare`` works on them, so that its memory does not grow with the corpus.

Two spools, both unnamed temporary files in the prepared folder (they vanish when closed, or when the process dies,
so an interrupted run leaves nothing behind and the stage never records them):

- ``JsonLines``: JSON values, one a line, read back by index. A finite corpus goes through one before its shuffle
  (``planlm.data.corpus.read_articles``): the articles are read once in file order (skips and de-duplication as
  before), and the seeded permutation then reads them back one at a time.
- ``ArticleSpool``: a split's drawn articles (or pieces) in draw order, each as the line ``articles.jsonl`` will
  hold, and their sentence spans as raw int64 pairs. ``draw_articles`` fills it as it would a list
  (``spool += pieces``); the stages after it read back a run of articles at a time, and the encoder the sentence
  strings of one chunk at a time (``SentenceTexts``), cut from their articles' text.

What stays in memory is 8 bytes per value or article (their byte offsets), 8 per article for its sentence count,
and the ids of the split's documents (for its ``sources`` count).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from planlm.data.artifacts import article_record

_READ_BYTES = 1 << 22
"""About how many bytes of lines one read of a run takes (a longer line is read whole)."""
_SPAN_BYTES = 2 * np.dtype(np.int64).itemsize


class JsonLines:
    """JSON values appended to an unnamed temporary file in ``folder`` (the system's temporary folder when None), read
    back by index (``lines[i]``) or as a run (``lines.read(start, stop)``); ``len`` counts them."""

    def __init__(self, folder: str | Path | None = None):
        self.file = tempfile.TemporaryFile(dir=folder)
        self.offsets = array("q", [0])  # line i is bytes [offsets[i], offsets[i + 1])
        self._flushed = True

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def append(self, value: Any) -> None:
        line = json.dumps(value).encode("ascii") + b"\n"  # ensure_ascii: lone surrogates survive as escapes
        self.file.write(line)
        self.offsets.append(self.offsets[-1] + len(line))
        self._flushed = False

    def _pread(self, start: int, stop: int) -> bytes:
        if not self._flushed:
            self.file.flush()
            self._flushed = True
        return os.pread(self.file.fileno(), stop - start, start)

    def __getitem__(self, index: int) -> Any:
        index = range(len(self))[index]
        return json.loads(self._pread(self.offsets[index], self.offsets[index + 1]))

    def read(self, start: int = 0, stop: int | None = None) -> Iterator[Any]:
        """Values ``start`` .. ``stop - 1`` in order, read in blocks of about ``_READ_BYTES``."""
        stop = len(self) if stop is None else stop
        while start < stop:
            end = start + 1
            while end < stop and self.offsets[end + 1] - self.offsets[start] <= _READ_BYTES:
                end += 1
            block = self._pread(self.offsets[start], self.offsets[end])
            yield from map(json.loads, block.split(b"\n")[:-1])
            start = end

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> JsonLines:
        return self

    def __exit__(self, *error) -> None:
        self.close()


class ArticleSpool:
    """A split's articles with their sentence spans, in the order they are added: ``spool += [(article, spans), ...]``
    (a list of pieces, as ``draw_articles`` adds them to a list), read back in runs (``articles``, ``spans``)."""

    def __init__(self, folder: str | Path | None = None):
        self.lines = JsonLines(folder)
        self.spans_file = tempfile.TemporaryFile(dir=folder)
        self.counts = array("q")  # sentences per article
        self.num_sentences = 0
        self.sources: set[str] = set()  # the documents the articles come from
        self._offsets: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.lines)

    def __iadd__(self, pieces: Iterable[tuple[dict, np.ndarray]]) -> ArticleSpool:
        for article, spans in pieces:
            self.append(article, spans)
        return self

    def append(self, article: dict, spans: np.ndarray) -> None:
        spans = np.ascontiguousarray(spans, dtype=np.int64).reshape(-1, 2)  # (S, 2)
        self.lines.append(article_record(article))
        self.spans_file.write(spans.data)
        self.counts.append(len(spans))
        self.num_sentences += len(spans)
        self._offsets = None
        self.sources.add(article.get("source", article["id"]))

    def sentence_offsets(self) -> np.ndarray:
        """(N_art + 1,) article a owns sentences [o[a], o[a+1])."""
        if self._offsets is None:
            counts = np.array(self.counts, dtype=np.int64)  # a copy: the array may grow again
            self._offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        return self._offsets

    def articles(self, start: int = 0, stop: int | None = None) -> Iterator[dict]:
        """Articles ``start`` .. ``stop - 1`` as ``articles.jsonl`` records (``source`` only where it is not the id)."""
        return self.lines.read(start, stop)

    def spans(self, start: int = 0, stop: int | None = None) -> list[np.ndarray]:
        """The (S, 2) sentence spans of articles ``start`` .. ``stop - 1``, one array each."""
        stop = len(self) if stop is None else stop
        if start >= stop:
            return []
        offsets = self.sentence_offsets()[start:stop + 1]
        flat = self._span_rows(int(offsets[0]), int(offsets[-1]))  # (S_run, 2)
        return np.split(flat, offsets[1:-1] - offsets[0])

    def _span_rows(self, first: int, last: int) -> np.ndarray:
        self.spans_file.flush()
        raw = os.pread(self.spans_file.fileno(), (last - first) * _SPAN_BYTES, first * _SPAN_BYTES)
        return np.frombuffer(raw, dtype=np.int64).reshape(-1, 2)

    def sentence_spans(self) -> np.ndarray:
        """(N_sent, 2) every span, memory-mapped from the spool."""
        if not self.num_sentences:
            return np.zeros((0, 2), np.int64)
        self.spans_file.flush()
        return np.memmap(self.spans_file, dtype=np.int64, mode="r", shape=(self.num_sentences, 2))

    def sentence_texts(self) -> SentenceTexts:
        return SentenceTexts(self)

    def digest(self, block: int = 1024) -> str:
        """sha256 of the articles' texts and sentence spans, in order: what tokenising reads (its resume key)."""
        hashed = hashlib.sha256()
        for start in range(0, len(self), block):
            stop = min(start + block, len(self))
            for record, spans in zip(self.articles(start, stop), self.spans(start, stop)):
                hashed.update(record["text"].encode("utf-8", "surrogatepass"))
                hashed.update(b"\0")
                hashed.update(np.ascontiguousarray(spans, dtype=np.int64).tobytes())
        return hashed.hexdigest()

    def extend_from(self, other: ArticleSpool, block: int = 1024) -> None:
        """Append every article of ``other`` with its spans, ``block`` articles at a time."""
        for start in range(0, len(other), block):
            stop = min(start + block, len(other))
            for record, spans in zip(other.articles(start, stop), other.spans(start, stop)):
                self.append(record, spans)

    def close(self) -> None:
        self.lines.close()
        self.spans_file.close()

    def __enter__(self) -> ArticleSpool:
        return self

    def __exit__(self, *error) -> None:
        self.close()


class SentenceTexts(Sequence):
    """The sentences of a spool's articles as strings, in order, cut from their article's text only when read:
    ``len``, iteration, and a slice (one chunk of the encoder) are what ``planlm.data.embed.embed_sentences`` asks
    of its texts."""

    def __init__(self, spool: ArticleSpool, block: int = 1024):
        self.spool, self.block = spool, block
        self.offsets = spool.sentence_offsets()  # (N_art + 1,)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _cut(self, first: int, last: int) -> list[str]:
        """The sentences of articles ``first`` .. ``last - 1``."""
        return [record["text"][start:end] for record, spans in zip(self.spool.articles(first, last),
                                                                   self.spool.spans(first, last))
                for start, end in spans.tolist()]

    def __iter__(self) -> Iterator[str]:
        for first in range(0, len(self.spool), self.block):
            yield from self._cut(first, min(first + self.block, len(self.spool)))

    def __getitem__(self, index):
        if not isinstance(index, slice):
            index = range(len(self))[index]
            return self[index:index + 1][0]
        start, stop, step = index.indices(len(self))
        if start >= stop:
            return []
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1  # the article holding sentence start
        last = int(np.searchsorted(self.offsets, stop, side="left"))  # articles [first, last) hold [start, stop)
        base = int(self.offsets[first])
        return self._cut(first, last)[start - base:stop - base:step]
