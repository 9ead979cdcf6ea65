"""The prepared-corpus format: what ``planlm prepare`` writes and every later stage reads.

Layout of a prepared folder (all arrays are ``.npy`` files that load memory-mapped)::

    manifest.json               written last: config, versions, counts, hashes (see planlm.stage)
    codebook.safetensors        {"centroids": (A, E) float32}, the abstract writing actions
    <split>/                    train, validation, test (and planner_train: the planner's training set, with
                                prepare.planner_corpus: the train articles plus more, without tokens)
        articles.jsonl          one {"id", "title", "text"} per article, in order (+ "source": the document
                                a piece was cut from, with corpus.piece_sentences)
        sentence_offsets.npy    (N_art + 1,) int64   article a owns sentences [o[a], o[a+1])
        sentence_spans.npy      (N_sent, 2) int64    character [start, end) of each sentence in its article
        embeddings.npy          (N_sent, E) float32  sentence-encoder embedding of each sentence
        actions.npy             (N_sent,) int64      action (cluster id) of each sentence
        token_offsets.npy       (N_art + 1,) int64   article a owns tokens [o[a], o[a+1])
        input_ids.npy           (N_tok,) int64       LM tokens of each whole article
        token_sentence.npy      (N_tok,) int64       split-global index of the sentence holding the token
        token_plan_sentence.npy (N_tok,) int64       sentence whose action/plan conditions the token
        token_actions.npy       (N_tok,) int64       actions[token_plan_sentence]

Alignment convention (the one of the predecessor's public code, Cornille et al.): every token carries the action of its own sentence, except the
last token of a sentence, which carries the next sentence's action, so that the position that
predicts the first token of sentence i is already conditioned on action i. The last token of an
article keeps its own sentence. Sentence indices are split-global; sentence ``s`` of article ``a``
is boundary ``s``: its plan is computed from sentences ``o[a] .. s-1`` (the true text before it).

Letters: A actions, E embedding width, N_art articles, N_sent sentences, N_tok tokens.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from planlm.errors import PlanlmError
from planlm.jsonio import read_record, write_json
from planlm.stage.integrity import load_npy, load_safetensors, reading, stage_manifest

SPLITS = ("train", "validation", "test")
_FIX = "rebuild the prepared corpus: rerun `planlm prepare --out_dir {path}` or the `planlm run` that made it"
ARRAYS = ("sentence_offsets", "sentence_spans", "embeddings", "actions", "token_offsets", "input_ids",
          "token_sentence", "token_plan_sentence", "token_actions")
TOKEN_ARRAYS = ("input_ids", "token_sentence", "token_plan_sentence", "token_actions")
"""The (N_tok,) arrays: written an article chunk at a time (``write_token_arrays``), never held whole."""
CHUNK_TOKENS = 1 << 18
"""About how many tokens the token arrays are written in at a time (an article longer than that is one chunk): the
memory that writing them holds is a few int64 arrays of this length, whatever the size of the split."""


def token_plan_sentence(token_sentence: np.ndarray, token_offsets: np.ndarray) -> np.ndarray:
    """Apply the alignment convention: the last token of a sentence carries the next sentence.

    token_sentence (N_tok,) split-global sentence of each token; token_offsets (N_art + 1,).
    """
    plan = token_sentence.copy()
    if len(plan) < 2:
        return plan
    last_of_sentence = token_sentence[1:] != token_sentence[:-1]  # token t ends its sentence
    # ... unless t is also the last token of its article (the next token is another article's).
    article_last = np.zeros(len(plan), dtype=bool)
    ends = token_offsets[1:] - 1
    article_last[ends[ends >= 0]] = True
    move = np.flatnonzero(last_of_sentence & ~article_last[:-1])
    plan[move] = token_sentence[move + 1]
    return plan


def article_chunks(token_offsets: np.ndarray, chunk_tokens: int | None = None) -> Iterator[tuple[int, int]]:
    """[first, end) ranges of whole articles of at most ``chunk_tokens`` (``CHUNK_TOKENS``) tokens each (or one
    longer article)."""
    chunk_tokens = CHUNK_TOKENS if chunk_tokens is None else chunk_tokens
    num_articles = len(token_offsets) - 1
    first = 0
    while first < num_articles:
        end = int(np.searchsorted(token_offsets, token_offsets[first] + chunk_tokens, side="right")) - 1
        end = min(max(end, first + 1), num_articles)
        yield first, end
        first = end


class NpyStream:
    """Writes the 1-D int64 ``.npy`` file ``path`` of ``length`` values chunk by chunk, byte for byte what ``np.save``
    writes. The old file is unlinked first (never written into: a ``planlm codebook`` folder may hard-link it) and the
    new one is written as ``<name>.tmp`` in the same folder, renamed into place only once complete, so an interrupted
    write leaves no short file under the final name (and stage records skip ``.tmp`` files)."""

    def __init__(self, path: Path, length: int):
        self.path, self.length, self.written = Path(path), int(length), 0
        self.part = self.path.with_name(self.path.name + ".tmp")

    def __enter__(self) -> NpyStream:
        self.path.unlink(missing_ok=True)
        self.part.unlink(missing_ok=True)
        self.file = open(self.part, "wb")
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.int64)), "fortran_order": False,
                  "shape": (self.length,)}
        np.lib.format.write_array_header_1_0(self.file, header)  # np.save's: version 1.0 fits any 1-D shape
        return self

    def write(self, chunk: np.ndarray) -> None:
        chunk = np.ascontiguousarray(chunk, dtype=np.int64)
        self.file.write(chunk.data)
        self.written += len(chunk)

    def __exit__(self, kind, error, traceback) -> None:
        self.file.close()
        if kind is None and self.written != self.length:
            self.part.unlink(missing_ok=True)
            raise PlanlmError(f"{self.path}: {self.written} values written, {self.length} expected (a bug)")
        if kind is None:
            os.replace(self.part, self.path)
        else:
            self.part.unlink(missing_ok=True)


def write_token_arrays(split_dir: str | Path, token_offsets: np.ndarray, actions: np.ndarray,
                       read: Callable[[str, int, int], np.ndarray]) -> None:
    """Write a split's ``TOKEN_ARRAYS`` an article chunk at a time (``article_chunks``): ``input_ids`` and
    ``token_sentence`` as ``read(name, start, end)`` gives their tokens [start, end), ``token_plan_sentence`` and
    ``token_actions`` derived from them. Deriving chunk by chunk is exact: the alignment convention looks one token
    ahead only within an article, and every chunk ends at an article's end."""
    split_dir = Path(split_dir)
    num_tokens = int(token_offsets[-1])
    actions = np.asarray(actions)
    with ExitStack() as stack:
        out = {name: stack.enter_context(NpyStream(split_dir / f"{name}.npy", num_tokens)) for name in TOKEN_ARRAYS}
        for first, end in article_chunks(token_offsets):
            start, stop = int(token_offsets[first]), int(token_offsets[end])
            sentence = read("token_sentence", start, stop)
            plan = token_plan_sentence(sentence, np.asarray(token_offsets[first:end + 1]) - start)
            out["input_ids"].write(read("input_ids", start, stop))
            out["token_sentence"].write(sentence)
            out["token_plan_sentence"].write(plan)
            out["token_actions"].write(actions[plan])


class TokenSpool:
    """A split's tokens as a tokeniser makes them, a chunk of articles at a time: ``append`` adds each article's
    ``input_ids`` and split-global ``token_sentence`` to raw int64 files in the split folder (``*.spool.tmp``, with
    the tokens per article), and ``write`` turns those into the split's ``TOKEN_ARRAYS`` (``write_token_arrays``)
    and returns ``token_offsets`` (N_art + 1,). Only one chunk is ever in memory::

        with TokenSpool(split_dir, key) as spool:
            for chunk in ...[spool.done:]:  # the articles an interrupted build with the same key spooled are kept
                spool.append(input_ids, token_sentence)  # lists of (L,) arrays, one per article
            token_offsets = spool.write(actions)

    With a ``key`` (what the tokens depend on: the tokeniser, the articles), each chunk is recorded in
    ``tokens.progress.json`` once its tokens are on disk, and a spool that an interrupted build left under the
    same key is continued from its last recorded chunk (``done``: the articles it holds); a spool under another
    key, or none, is started afresh. Leaving the ``with`` after ``write`` removes the raw files; an error leaves
    them to resume from, while the split's arrays are never written."""

    SPOOLED = ("input_ids", "token_sentence", "article_tokens")
    PROGRESS = "tokens.progress.json"

    def __init__(self, split_dir: str | Path, key: str | None = None):
        self.split_dir = Path(split_dir)
        self.key = key
        self.paths = {name: self.split_dir / f"{name}.spool.tmp" for name in self.SPOOLED}
        self.progress = self.split_dir / self.PROGRESS
        self.done = 0  # articles spooled
        self.tokens = 0  # tokens spooled

    def __enter__(self) -> TokenSpool:
        self.split_dir.mkdir(parents=True, exist_ok=True)
        record = self._record()
        if record:  # continue an interrupted build: drop whatever was written after its last recorded chunk
            self.done, self.tokens = int(record["articles"]), int(record["tokens"])
            sizes = {"input_ids": self.tokens, "token_sentence": self.tokens, "article_tokens": self.done}
            for name, path in self.paths.items():
                os.truncate(path, sizes[name] * np.dtype(np.int64).itemsize)
        else:
            self.progress.unlink(missing_ok=True)
            for path in self.paths.values():
                path.unlink(missing_ok=True)
        self.files = {name: open(path, "ab") for name, path in self.paths.items()}
        self.written = False
        return self

    def _record(self) -> dict:
        """The progress record of a spool this one can continue, or {}."""
        if self.key is None:
            return {}
        record = read_record(self.progress)
        if record.get("key") != self.key or not all(isinstance(record.get(n), int) for n in ("articles", "tokens")):
            return {}
        need = {"input_ids": record["tokens"], "token_sentence": record["tokens"], "article_tokens": record["articles"]}
        for name, path in self.paths.items():  # every recorded value must still be there
            if not path.is_file() or path.stat().st_size < need[name] * np.dtype(np.int64).itemsize:
                return {}
        return record

    def append(self, input_ids: list[np.ndarray], token_sentence: list[np.ndarray]) -> None:
        for ids, sentence in zip(input_ids, token_sentence, strict=True):
            if len(ids) != len(sentence):
                raise PlanlmError(f"{len(ids)} tokens but {len(sentence)} token sentences in an article (a bug)")
            self.files["input_ids"].write(np.ascontiguousarray(ids, dtype=np.int64).data)
            self.files["token_sentence"].write(np.ascontiguousarray(sentence, dtype=np.int64).data)
        lengths = np.array([len(ids) for ids in input_ids], dtype=np.int64)
        self.files["article_tokens"].write(lengths.data)
        self.done += len(lengths)
        self.tokens += int(lengths.sum())
        if self.key is not None:  # the chunk's tokens reach the file system before the record that counts them
            for file in self.files.values():
                file.flush()
            write_json(self.progress, {"key": self.key, "articles": self.done, "tokens": self.tokens})

    def write(self, actions: np.ndarray) -> np.ndarray:
        """Write the token arrays (``actions`` (N_sent,): the split's, for ``token_actions``); token_offsets."""
        for file in self.files.values():
            file.close()
        lengths = np.fromfile(self.paths["article_tokens"], dtype=np.int64)
        token_offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
        itemsize = np.dtype(np.int64).itemsize
        write_token_arrays(self.split_dir, token_offsets, actions, lambda name, start, stop: np.fromfile(
            self.paths[name], dtype=np.int64, count=stop - start, offset=start * itemsize))
        self.written = True
        return token_offsets

    def __exit__(self, kind, error, traceback) -> None:
        for file in self.files.values():
            file.close()
        if self.written or self.key is None:
            self.progress.unlink(missing_ok=True)
            for path in self.paths.values():
                path.unlink(missing_ok=True)


@dataclass
class PreparedSplit:
    """Read-only, memory-mapped view of one split of a prepared folder."""

    path: Path

    def __post_init__(self):
        self.path = Path(self.path)
        missing = [n for n in ARRAYS if not (self.path / f"{n}.npy").is_file()]
        if missing or not (self.path / "articles.jsonl").is_file():
            raise PlanlmError(f"{self.path}: incomplete prepared split (missing {missing or ['articles.jsonl']}); "
                              f"rerun `planlm prepare`")

    def _array(self, name: str) -> np.ndarray:
        return load_npy(self.path / f"{name}.npy", fix=_FIX.format(path=self.path.parent))

    def __getattr__(self, name: str) -> np.ndarray:
        if name in ARRAYS:
            arr = self._array(name)
            self.__dict__[name] = arr
            return arr
        raise AttributeError(name)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def num_articles(self) -> int:
        return len(self.sentence_offsets) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.actions)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @cached_property
    def articles(self) -> list[dict]:
        path = self.path / "articles.jsonl"
        with reading(path, fix=_FIX.format(path=self.path.parent)), open(path) as f:
            return [json.loads(line) for line in f]

    @cached_property
    def sentence_article(self) -> np.ndarray:
        """(N_sent,) article index of every sentence."""
        counts = np.diff(self.sentence_offsets)
        return np.repeat(np.arange(self.num_articles), counts)

    def sentence_range(self, article: int) -> range:
        return range(int(self.sentence_offsets[article]), int(self.sentence_offsets[article + 1]))

    def token_range(self, article: int) -> range:
        return range(int(self.token_offsets[article]), int(self.token_offsets[article + 1]))

    def sentence_text(self, sentence: int) -> str:
        article = int(self.sentence_article[sentence])
        start, end = self.sentence_spans[sentence]
        return self.articles[article]["text"][start:end]

    def head(self, num_articles: int) -> "PreparedSplit":
        """The first ``num_articles`` articles of this split, as a split (memory-mapped slices, nothing copied):
        a planner trained on a part of its set, with the same codebook (a scaling study)."""
        if not 1 <= num_articles <= self.num_articles:
            raise PlanlmError(f"{self.path}: {num_articles} articles asked of a split of {self.num_articles}; "
                              f"ask for 1 to {self.num_articles}")
        return HeadSplit(self.path, num_articles)


_SENTENCE_ARRAYS = ("sentence_spans", "embeddings", "actions")


@dataclass
class HeadSplit(PreparedSplit):
    """The first ``num_head`` articles of a split (``PreparedSplit.head``): article offsets cut after them,
    sentence and token arrays cut at their ends (sentence indices stay split-global: they are the same)."""

    num_head: int = 0

    def _array(self, name: str) -> np.ndarray:
        array = super()._array(name)
        if name in ("sentence_offsets", "token_offsets"):
            return array[:self.num_head + 1]
        ends = self.sentence_offsets if name in _SENTENCE_ARRAYS else self.token_offsets
        return array[:int(ends[-1])]

    @cached_property
    def articles(self) -> list[dict]:
        return PreparedSplit.articles.func(self)[:self.num_head]


class PreparedDataset:
    """A prepared folder: manifest, codebook and splits. ``PreparedDataset(path)`` checks completeness."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        manifest = stage_manifest(self.path)  # one-line error for a damaged file
        if manifest is None:
            raise PlanlmError(f"{self.path}: not a complete prepared corpus (manifest.json missing: "
                              f"`planlm prepare` never finished there); run `planlm prepare --out_dir {self.path}`")
        self.manifest = manifest

    @property
    def num_actions(self) -> int:
        return int(self.manifest["num_actions"])

    @property
    def embedding_dim(self) -> int:
        return int(self.manifest["embedding_dim"])

    @property
    def tokenizer_name(self) -> str:
        return self.manifest["tokenizer"]

    @property
    def encoder_name(self) -> str:
        return self.manifest["encoder"]

    @property
    def sentence_splitter(self) -> str:
        """The spaCy splitter the corpus was split with (``planlm prepare --sentences.splitter``)."""
        sentences = self.manifest.get("config", {}).get("sentences")  # a synthetic corpus may record other things here
        return sentences.get("splitter", "sentencizer") if isinstance(sentences, dict) else "sentencizer"

    @property
    def planner_split(self) -> str:
        """The split the planner and the codebook were fitted on: ``planner_train`` when prepare gave the planner
        more documents than the LM (``prepare.planner_corpus``), else ``train``."""
        return self.manifest.get("planner_split") or "train"

    @property
    def codebook_hash(self) -> str:
        return self.manifest["hashes"]["codebook.safetensors"]

    @cached_property
    def codebook(self):
        """(A, E) float32 torch tensor of centroids."""
        path = self.path / "codebook.safetensors"
        tensors = load_safetensors(path, fix=_FIX.format(path=self.path))
        if "centroids" not in tensors:
            raise PlanlmError(f"{path}: no 'centroids' tensor (has {sorted(tensors)}); {_FIX.format(path=self.path)}")
        return tensors["centroids"]

    def split(self, name: str) -> PreparedSplit:
        if name not in self.manifest.get("splits", SPLITS) and name != self.manifest.get("planner_split"):
            raise PlanlmError(f"{self.path}: no split {name!r} (has {list(self.manifest.get('splits', []))})")
        return PreparedSplit(self.path / name)

    def __getitem__(self, name: str) -> PreparedSplit:
        return self.split(name)


def article_record(article: dict) -> dict:
    """An article's line of ``articles.jsonl``: id, title and text, and ``source`` where it is not the id."""
    source = {"source": article["source"]} if article.get("source", article["id"]) != article["id"] else {}
    return {"id": article["id"], "title": article.get("title", ""), "text": article["text"], **source}


def write_split(split_dir: str | Path, articles: Iterable[dict], arrays: dict[str, np.ndarray]) -> None:
    """Write one split. ``articles`` are read once, in order (a list, or a run read back from an
    ``ArticleSpool``). ``arrays`` holds every name in ARRAYS except the derived token ones and
    those already written to ``split_dir`` (e.g. embeddings streamed to disk with ``open_memmap``, or the
    token arrays streamed by ``TokenSpool``). In-memory ``input_ids`` and ``token_sentence`` are written with
    the derived arrays by ``write_token_arrays``."""
    split_dir = Path(split_dir)
    split_dir.mkdir(parents=True, exist_ok=True)
    if "input_ids" in arrays or "token_sentence" in arrays:
        write_token_arrays(split_dir, np.asarray(arrays["token_offsets"]), arrays["actions"],
                           lambda name, start, stop: np.asarray(arrays[name])[start:stop])
    missing = [name for name in ARRAYS if name not in arrays and not (split_dir / f"{name}.npy").is_file()]
    if missing:
        raise PlanlmError(f"{split_dir}: write_split got neither arrays nor files for {missing} (a bug)")
    (split_dir / "articles.jsonl").unlink(missing_ok=True)  # a new file, never written into: it may be a hard link
    with open(split_dir / "articles.jsonl", "w") as f:
        for art in articles:
            f.write(json.dumps(article_record(art)) + "\n")
    for name in ARRAYS:
        if name in TOKEN_ARRAYS or name not in arrays:  # written above, or already on disk
            continue
        dtype = np.float32 if name == "embeddings" else np.int64
        (split_dir / f"{name}.npy").unlink(missing_ok=True)
        np.save(split_dir / f"{name}.npy", np.ascontiguousarray(arrays[name], dtype=dtype))
