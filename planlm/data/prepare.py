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
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from planlm.data.kmeans import ActionsConfig, assign_actions, fit_codebook, inertia
from planlm.data.artifacts import ARRAYS, SPLITS, write_split
from planlm.data.corpus import CorpusConfig, Skips, local_files, read_articles, resolve_kind
from planlm.data.embed import EmbedConfig, embed_sentences
from planlm.data.resources import DEFAULT_TOKENIZER, load_tokenizer, offline_corpus_path, split_sentences
from planlm.data.tokens import tokenize_articles
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


def take_articles(corpus: CorpusConfig, sentences: SentencesConfig, skips: Skips,
                  progress: bool = True) -> dict[str, tuple[list[dict], list[np.ndarray]]]:
    """Draw the usable articles and their sentence spans, split into test, validation, train."""
    wanted = corpus.wanted
    taken: list[tuple[dict, np.ndarray]] = []
    bar = tqdm(total=wanted, desc="splitting sentences", unit="art", disable=not progress, dynamic_ncols=True)
    batch: list[dict] = []

    def flush() -> bool:
        spans_per_article = split_sentences([a["text"] for a in batch], sentences.splitter, sentences.batch_size)
        for art, spans in zip(batch, spans_per_article):
            if len(spans) < corpus.min_sentences:
                skips["too_few_sentences"] += 1
                continue
            taken.append((art, np.asarray(spans, dtype=np.int64).reshape(-1, 2)))
            bar.update(1)
            if wanted is not None and len(taken) >= wanted:
                return True
        batch.clear()
        return False

    finished = False
    for art in read_articles(corpus, skips):
        batch.append(art)
        if len(batch) >= sentences.batch_size and (finished := flush()):
            break
    if not finished and batch:
        flush()
    bar.close()
    if len(taken) <= corpus.num_test + corpus.num_validation:
        raise PlanlmError(f"{corpus.source}: only {len(taken)} usable articles (with >= {corpus.min_sentences} "
                          f"sentences) but {corpus.num_test} test + {corpus.num_validation} validation requested "
                          f"and at least one training article needed; lower --corpus.num_test / "
                          f"--corpus.num_validation or give a bigger corpus")
    bounds = {"test": (0, corpus.num_test),
              "validation": (corpus.num_test, corpus.num_test + corpus.num_validation),
              "train": (corpus.num_test + corpus.num_validation, len(taken))}
    return {split: ([a for a, _ in taken[lo:hi]], [s for _, s in taken[lo:hi]])
            for split, (lo, hi) in bounds.items()}


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
            progress: bool = True) -> Path:
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
            ``smollm2-135m`` work offline).
        progress: Show progress bars.

    Returns:
        The prepared folder.
    """
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
    tok = load_tokenizer(tokenizer)
    layout = {split: _embed_split(out, split, *drawn[split], embedding, progress) for split in SPLITS}
    codebook = fit_codebook(layout["train"][1], actions, progress=progress)  # (A, E)
    counts, kmeans = {}, {"backend": actions.backend, "init": actions.init}
    for split in SPLITS:
        counts[split] = _write_split(out, split, *drawn[split], *layout[split], codebook, actions, tok, kmeans,
                                     progress)
    hashes = _save_codebook_and_hash(out, codebook)
    wall_time = time.time() - started
    short = {}
    if corpus.num_train is not None and counts["train"]["articles"] < corpus.num_train:
        short["train_articles_missing"] = corpus.num_train - counts["train"]["articles"]
    write_manifest(out, config, num_actions=actions.num_actions, embedding_dim=int(codebook.shape[1]),
                   tokenizer=tokenizer, encoder=embedding.encoder, splits=list(SPLITS), counts=counts,
                   skipped=dict(skips), short=short, kmeans=kmeans, hashes=hashes, wall_time_s=round(wall_time, 1))
    _summary(out, counts, skips, short, kmeans, wall_time)
    return out


def _drop_stale(out: Path) -> None:
    """Drop the results of another config; keep the embeddings, to resume from."""
    for split in SPLITS:
        for name in ARRAYS:
            if name != "embeddings":
                (out / split / f"{name}.npy").unlink(missing_ok=True)
    (out / "codebook.safetensors").unlink(missing_ok=True)
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
                 progress: bool) -> dict:
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
    return {"articles": len(articles), "sentences": int(len(split_actions)), "tokens": int(tokens["token_offsets"][-1])}


def _save_codebook_and_hash(out: Path, codebook: np.ndarray) -> dict[str, str]:
    """Write codebook.safetensors; the sha256 of it and of every split file."""
    import torch
    from safetensors.torch import save_file

    save_file({"centroids": torch.from_numpy(codebook)}, str(out / "codebook.safetensors"))
    hashes = {"codebook.safetensors": file_sha256(out / "codebook.safetensors")}
    for split in SPLITS:
        for name in ("articles.jsonl", *(f"{a}.npy" for a in ARRAYS)):
            hashes[f"{split}/{name}"] = file_sha256(out / split / name)
    return hashes


def _summary(out: Path, counts: dict, skips: Skips, short: dict, kmeans: dict, wall_time: float) -> None:
    lines = [f"planlm prepare: wrote {out} in {wall_time:.0f} s"]
    for split, c in counts.items():
        lines.append(f"  {split:<10} {c['articles']:>8,} articles {c['sentences']:>10,} sentences {c['tokens']:>12,} tokens")
    lines.append("  skipped    " + (", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(skips.items()))
                                    if skips else "nothing"))
    if short:
        lines.append(f"  note       the corpus ran out: {short['train_articles_missing']:,} training articles fewer "
                     f"than --corpus.num_train")
    lines.append(f"  k-means    {kmeans['backend']}, inertia per sentence {kmeans['inertia_per_sentence']:.4g}, "
                 f"{kmeans['empty_clusters']} empty clusters")
    print("\n".join(lines), file=sys.stdout)
