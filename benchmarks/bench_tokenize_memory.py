"""Peak memory of tokenising and writing one split: ``planlm.data.prepare._write_split`` (assign actions, tokenise,
write the arrays) on a paper-shaped synthetic corpus of ``--articles`` articles (``scale_sim_data.write_corpus``).

Sentences are cut by a regular expression instead of spaCy, and the embeddings are random (E = 4, 8 actions): the
split's sentence-sized arrays stay small, so what grows with the corpus is what the token path holds. The articles
reach it in an ``ArticleSpool`` on disk, as ``prepare`` holds them. Two modes, run in separate processes because
tracemalloc's bookkeeping inflates the RSS:

    python benchmarks/bench_tokenize_memory.py --articles 2000 --mode rss    # ru_maxrss, RSS before the call
    python benchmarks/bench_tokenize_memory.py --articles 2000 --mode trace  # tracemalloc peak during the call

Prints one JSON line: articles, tokens, seconds and the memory numbers (MiB).
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

_SENTENCE = re.compile(r"[^.!?\n]+(?:[.!?]+|$)", re.MULTILINE)


def _spans(text: str) -> np.ndarray:
    """(S, 2) character spans of the text's sentences (stripped of leading spaces)."""
    spans = []
    for match in _SENTENCE.finditer(text):
        start = match.start() + len(match.group()) - len(match.group().lstrip())
        if start < match.end():
            spans.append((start, match.end()))
    return np.asarray(spans or [(0, len(text))], dtype=np.int64).reshape(-1, 2)


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--articles", type=int, default=2000)
    parser.add_argument("--mode", choices=("rss", "trace"), default="rss")
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "bench_tokenize_memory"))
    args = parser.parse_args()

    from scale_sim_data import write_corpus

    from planlm.data.kmeans import ActionsConfig
    from planlm.data.prepare import _write_split
    from planlm.data.resources import load_tokenizer
    from planlm.data.spool import ArticleSpool

    work = Path(args.work)
    corpus = work / f"corpus_{args.articles}.jsonl"
    if not corpus.is_file():
        write_corpus(corpus, args.articles)
    with open(corpus) as f:
        articles = [json.loads(line) for line in f]
    spans = [_spans(a["text"]) for a in articles]
    sentence_offsets = np.concatenate([[0], np.cumsum([len(s) for s in spans])]).astype(np.int64)
    rng = np.random.default_rng(0)
    out = work / f"out_{args.articles}"
    (out / "train").mkdir(parents=True, exist_ok=True)
    (out / "train" / "embeddings.npy").unlink(missing_ok=True)  # prepare streams them there before
    np.save(out / "train" / "embeddings.npy", rng.standard_normal((int(sentence_offsets[-1]), 4), dtype=np.float32))
    embeddings = np.load(out / "train" / "embeddings.npy", mmap_mode="r")  # (N_sent, E)
    codebook = rng.standard_normal((8, 4), dtype=np.float32)  # (A, E)
    tok = load_tokenizer("gpt2")
    tok(["warm up"], add_special_tokens=False, return_offsets_mapping=True)
    spool = ArticleSpool(out)  # the split's articles as prepare holds them: on disk
    spool += zip(articles, spans)
    del articles, spans
    rss_before = _rss_mib()
    if args.mode == "trace":
        tracemalloc.start()
    started = time.time()
    counts = _write_split(out, "train", spool, sentence_offsets, embeddings, codebook, ActionsConfig(num_actions=8),
                          tok, {}, 128, False)
    seconds = time.time() - started
    record = {"articles": args.articles, "tokens": counts["tokens"], "sentences": counts["sentences"],
              "seconds": round(seconds, 1), "mode": args.mode}
    if args.mode == "trace":
        record["tracemalloc_peak_mib"] = round(tracemalloc.get_traced_memory()[1] / 2 ** 20, 1)
    else:
        record["rss_before_mib"] = round(rss_before, 1)
        record["max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        record["growth_mib"] = round(record["max_rss_mib"] - rss_before, 1)
    print(json.dumps(record))
    return record


if __name__ == "__main__":
    main()
