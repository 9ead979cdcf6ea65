"""Synthetic prepared corpora whose action sequences and wording follow known rules.

They let tests prove that the planner learns a rule and that the LM learns to use its plan, in
seconds, without a sentence encoder. The folder has exactly the layout ``planlm prepare`` writes
(see ``planlm.data.artifacts``), with sentence "embeddings" = the action's centroid + noise.

Rules for the action sequence of an article (a_0 is drawn at random):
- ``cycle``:  a_{i+1} = (a_i + 1) mod A       (fully predictable from the last sentence)
- ``skip``:   a_{i+1} = (a_i + a_{i-1}) mod A  (needs two sentences of context)
- ``random``: a_{i+1} uniform                   (unpredictable: only an oracle knows the plan)

Each action owns a few words; a sentence of action a is made only of a's words, so the text of a
sentence is determined by its action.

With ``pieces_per_document`` each source document is cut into pieces, as ``planlm prepare`` cuts long documents
(``planlm.data.pieces``): a document of n pieces (n drawn from the given range) is one action sequence whose
pieces have different numbers of sentences; piece j is the article ``<document id>#<j>`` with ``source`` = the
document's id, so every statistic that resamples source documents meets documents of unequal piece counts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from planlm.data.artifacts import SPLITS, write_split
from planlm.data.resources import load_tokenizer
from planlm.data.tokens import tokenize_articles
from planlm.files import file_sha256, save_safetensors
from planlm.stage import write_manifest

# Common English words that are single GPT-2 tokens with a leading space.
_WORDS = ("red blue green black white gold silver stone water fire river mountain city village king "
          "queen horse dog bird fish tree flower road bridge house tower ship train music song dance "
          "paper book letter school church market field garden island forest desert ocean winter "
          "summer spring night morning").split()


def _next_action(rule: str, history: list[int], num_actions: int, rng: np.random.Generator) -> int:
    if rule == "cycle":
        return (history[-1] + 1) % num_actions
    if rule == "skip":
        prev = history[-2] if len(history) > 1 else 0
        return (history[-1] + prev) % num_actions
    if rule == "random":
        return int(rng.integers(num_actions))
    raise ValueError(f"unknown rule {rule!r} (cycle, skip, random)")


def make_synthetic_prepared(out_dir: str | Path, *, num_actions: int = 8, rule: str = "cycle",
                            num_articles: dict[str, int] | None = None, min_sentences: int = 4,
                            max_sentences: int = 9, embedding_dim: int = 16, words_per_action: int = 3,
                            sentence_words: tuple[int, int] = (3, 6), noise: float = 0.05,
                            tokenizer: str = "gpt2", seed: int = 0,
                            pieces_per_document: tuple[int, int] | None = None) -> Path:
    """Write a complete prepared folder at ``out_dir`` and return its path.

    ``num_articles`` counts articles, or, with ``pieces_per_document`` (min, max), source documents, each cut into
    min..max pieces of distinct sentence counts in [min_sentences, max_sentences]."""
    num_articles = num_articles or {"train": 200, "validation": 20, "test": 20}
    if pieces_per_document is not None:
        low, high = pieces_per_document
        if not 1 <= low <= high or high > max_sentences - min_sentences + 1:
            raise ValueError(f"pieces_per_document {pieces_per_document}: 1 <= min <= max <= the "
                             f"{max_sentences - min_sentences + 1} distinct piece lengths of {min_sentences}..{max_sentences}")
    if num_actions * words_per_action > len(_WORDS):
        raise ValueError(f"at most {len(_WORDS) // words_per_action} actions with {words_per_action} words each")
    rng = np.random.default_rng(seed)
    centroids = rng.normal(size=(num_actions, embedding_dim)).astype(np.float32)
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    vocab = np.array(_WORDS[: num_actions * words_per_action]).reshape(num_actions, words_per_action)
    splits = {}
    for split in SPLITS:
        articles = []
        for a in range(num_articles.get(split, 0)):
            if pieces_per_document is None:
                lengths = [int(rng.integers(min_sentences, max_sentences + 1))]
            else:  # distinct lengths: no two pieces of a document alike
                count = int(rng.integers(pieces_per_document[0], pieces_per_document[1] + 1))
                lengths = rng.choice(np.arange(min_sentences, max_sentences + 1), size=count, replace=False).tolist()
            acts = [int(rng.integers(num_actions))]
            while len(acts) < sum(lengths):  # one sequence for the whole document: its pieces continue it
                acts.append(_next_action(rule, acts, num_actions, rng))
            sentences = [" ".join(rng.choice(vocab[act], size=int(rng.integers(*sentence_words, endpoint=True))))
                         .capitalize() + "." for act in acts]
            document = {"id": f"{split}-{a}", "title": f"Synthetic {split} {a}"}
            if pieces_per_document is None:
                articles.append({**document, "sentences": sentences, "actions": acts})
                continue
            starts = np.cumsum([0, *lengths]).tolist()
            articles += [{**document, "id": f"{document['id']}#{j}", "source": document["id"],
                          "sentences": sentences[first:last], "actions": acts[first:last]}
                         for j, (first, last) in enumerate(zip(starts[:-1], starts[1:]))]
        splits[split] = (articles, noisy_centroids(centroids, [a["actions"] for a in articles], noise, rng))
    config = {"source": "synthetic", "rule": rule, "num_actions": num_actions, "num_articles": num_articles,
              "embedding_dim": embedding_dim, "seed": seed, "tokenizer": tokenizer}
    if pieces_per_document is not None:
        config["pieces_per_document"] = list(pieces_per_document)
    return write_synthetic_prepared(out_dir, splits, centroids, tokenizer, config)


def noisy_centroids(centroids: np.ndarray, actions: list[list[int]], noise: float,
                    rng: np.random.Generator) -> np.ndarray:
    """(N_sent, E) sentence "embeddings": the centroid (A, E) of each sentence's action plus Gaussian noise."""
    flat = np.asarray([a for article in actions for a in article], dtype=np.int64)
    return centroids[flat] + noise * rng.normal(size=(len(flat), centroids.shape[1])).astype(np.float32)


def write_synthetic_prepared(out_dir: str | Path, splits: dict[str, tuple[list[dict], np.ndarray]],
                             centroids: np.ndarray, tokenizer: str, config: dict) -> Path:
    """Write a prepared folder from ``{split: (articles [{id, title, sentences, actions}], embeddings (N_sent, E))}``
    (an article may name its ``source`` document, as a piece does); an article's text is its sentences joined by
    one space; ``centroids`` (A, E) is the codebook."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    num_actions, embedding_dim = centroids.shape
    tok = load_tokenizer(tokenizer)
    counts = {}
    for split in SPLITS:
        articles, embeddings = splits.get(split, ([], np.zeros((0, embedding_dim), np.float32)))
        records, spans_all, actions_all = [], [], []
        for article in articles:
            text, spans = "", []
            for sentence in article["sentences"]:
                start = len(text) + (1 if text else 0)
                text = f"{text} {sentence}" if text else sentence
                spans.append((start, len(text)))
            records.append({"id": article["id"], "title": article["title"], "text": text,
                            "source": article.get("source", article["id"])})
            spans_all.append(np.asarray(spans, dtype=np.int64))
            actions_all.append(np.asarray(article["actions"], dtype=np.int64))
        ids, token_sentence = tokenize_articles(tok, [a["text"] for a in records], spans_all)
        sentence_offsets = np.concatenate([[0], np.cumsum([len(s) for s in spans_all])]).astype(np.int64)
        token_offsets = np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int64)
        actions = np.concatenate(actions_all) if actions_all else np.zeros(0, np.int64)
        write_split(out_dir / split, records, {
            "sentence_offsets": sentence_offsets,
            "sentence_spans": np.concatenate(spans_all) if spans_all else np.zeros((0, 2), np.int64),
            "embeddings": embeddings,
            "actions": actions,
            "token_offsets": token_offsets,
            "input_ids": np.concatenate(ids) if ids else np.zeros(0, np.int64),
            "token_sentence": (np.concatenate([s + o for s, o in zip(token_sentence, sentence_offsets[:-1])])
                               if ids else np.zeros(0, np.int64)),
        })
        counts[split] = {"articles": len(records), "sentences": int(len(actions)), "tokens": int(token_offsets[-1]),
                         "sources": len({r["source"] for r in records})}
    save_safetensors({"centroids": torch.from_numpy(centroids)}, out_dir / "codebook.safetensors")
    write_manifest(out_dir, config, num_actions=num_actions, embedding_dim=embedding_dim, tokenizer=tokenizer,
                   encoder="synthetic", splits=list(SPLITS), counts=counts,
                   hashes={"codebook.safetensors": file_sha256(out_dir / "codebook.safetensors")})
    return out_dir
