"""Peak memory of ``planlm prepare`` at two corpus sizes, and its growth per 1,000 articles.

Each size runs in a child process of its own (so that its peak is its own): ``planlm.data.prepare.prepare`` on a
paper-shaped JSONL corpus of N + 2 x ``--heldout`` articles (``scale_sim_data.write_corpus``: about 35 sentences
of real prose per article), with the product's spaCy splitting, GPT-2 tokens and faiss k-means, and the fast
hashing stand-in for the sentence encoder (``scale_sim_data.install_hashing_encoder``). The embeddings are narrow
(``--embedding_dim 32``) and the k-means fit sample small (``--fit_sample 20000``), so that what grows with the
corpus is what prepare holds of the articles themselves, not the embeddings or the capped fit copy.

For each size it records the peak RSS (``ru_maxrss``), the peak of the anonymous memory (``RssAnon`` of
/proc/self/status sampled every 20 ms: RSS less the pages of memory-mapped files, which the kernel can drop), and
the anonymous memory when the embedding of the first split starts (what the drawn articles hold) and when the last
files are hashed. It prints one JSON line per size and the growth per 1,000 articles between the two sizes:

    python benchmarks/bench_prepare_memory.py --sizes 2000 8000 --work /tmp/bench_prepare_memory

It measures whichever planlm is imported: put a checkout first on PYTHONPATH to measure that one.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _anon_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class AnonPeak:
    """The peak of RssAnon, sampled in a thread."""

    def __init__(self, every_s: float = 0.02):
        self.every_s, self.peak, self.done = every_s, _anon_mib(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(self.every_s):
            self.peak = max(self.peak, _anon_mib())

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        return max(self.peak, _anon_mib())


def _mark_on_entry(module, name: str, marks: dict, label: str) -> None:
    """Record the anonymous memory when ``module.name`` is first called."""
    function = getattr(module, name)

    def wrapped(*args, **kwargs):
        marks.setdefault(label, round(_anon_mib(), 1))
        return function(*args, **kwargs)

    setattr(module, name, wrapped)


def measure(args) -> dict:
    """One size, in this process."""
    from scale_sim_data import install_hashing_encoder, write_corpus

    import planlm.data.prepare as prepare_module
    from planlm.data.corpus import CorpusConfig
    from planlm.data.embed import EmbedConfig
    from planlm.data.kmeans import ActionsConfig

    work = Path(args.work)
    total = args.articles + 2 * args.heldout + max(10, args.articles // 50)  # a margin for the skips
    corpus = work / f"corpus_{total}.jsonl"
    if not corpus.is_file():
        write_corpus(corpus, total, seed=0)
    install_hashing_encoder(args.embedding_dim)
    marks: dict = {}
    _mark_on_entry(prepare_module, "_embed_split", marks, "anon_at_embedding_mib")
    _mark_on_entry(prepare_module, "_save_codebook_and_hash", marks, "anon_at_hashing_mib")
    out = work / f"prepared_{args.articles}"
    shutil.rmtree(out, ignore_errors=True)
    baseline = _anon_mib()
    peak = AnonPeak()
    started = time.time()
    prepare_module.prepare(
        out_dir=str(out),
        corpus=CorpusConfig(source=str(corpus), num_train=args.articles, num_validation=args.heldout,
                            num_test=args.heldout, piece_sentences=None, seed=0),
        embedding=EmbedConfig(encoder=f"hashing-{args.embedding_dim}", batch_size=256, device="cpu"),
        actions=ActionsConfig(num_actions=args.num_actions, fit_sample=args.fit_sample, seed=0),
        tokenizer="gpt2")
    seconds = time.time() - started
    record = {"articles": args.articles, "seconds": round(seconds, 1),
              "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
              "peak_anon_mib": round(peak.stop(), 1), "anon_before_mib": round(baseline, 1), **marks}
    shutil.rmtree(out, ignore_errors=True)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 8000], help="training articles")
    parser.add_argument("--articles", type=int, help=argparse.SUPPRESS)  # one size, in a child
    parser.add_argument("--heldout", type=int, default=50, help="validation and test articles each")
    parser.add_argument("--embedding_dim", type=int, default=32)
    parser.add_argument("--num_actions", type=int, default=16)
    parser.add_argument("--fit_sample", type=int, default=20_000)
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "bench_prepare_memory"))
    args = parser.parse_args()
    if args.articles is not None:
        print(json.dumps(measure(args)), flush=True)
        return
    Path(args.work).mkdir(parents=True, exist_ok=True)
    records = []
    for size in args.sizes:
        command = [sys.executable, __file__, "--articles", str(size), "--heldout", str(args.heldout),
                   "--embedding_dim", str(args.embedding_dim), "--num_actions", str(args.num_actions),
                   "--fit_sample", str(args.fit_sample), "--work", args.work]
        child = subprocess.run(command, check=True, capture_output=True, text=True)
        records.append(json.loads(child.stdout.strip().splitlines()[-1]))
        print(json.dumps(records[-1]), flush=True)
    if len(records) >= 2:
        small, large = records[0], records[-1]
        per_1000 = 1000 / (large["articles"] - small["articles"])
        growth = {key: round((large[key] - small[key]) * per_1000, 1)
                  for key in ("max_rss_mib", "peak_anon_mib", "anon_at_embedding_mib", "anon_at_hashing_mib")
                  if key in small and key in large}
        print(json.dumps({"growth_mib_per_1000_articles": growth, "from": small["articles"],
                          "to": large["articles"]}))


if __name__ == "__main__":
    main()
