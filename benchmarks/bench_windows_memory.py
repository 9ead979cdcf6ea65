"""Memory of train-lm's windows and of one epoch's order, per window: ``article_windows`` and ``EpochShuffle``.

A split of ``--articles`` articles of paper-shaped lengths (log-normal, mean ``--mean_tokens`` GPT-2 tokens; only the
token offsets exist, which is all the two read), cut into 128-token windows with stride 127. tracemalloc measures
what ``article_windows`` returns (held for the whole training), its peak while it cuts them, and the peak while the
sampler starts an epoch (its order is held until the epoch ends):

    python benchmarks/bench_windows_memory.py --articles 100000

Prints one JSON line. It measures whichever planlm is imported: put a checkout first on PYTHONPATH to measure that
one.
"""

from __future__ import annotations

import argparse
import json
import tracemalloc
from types import SimpleNamespace

import numpy as np


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--articles", type=int, default=100_000)
    parser.add_argument("--mean_tokens", type=float, default=1050.0)
    args = parser.parse_args()

    from planlm.data.windows import article_windows
    from planlm.train.resume import EpochShuffle

    sigma = 0.95
    lengths = np.random.default_rng(0).lognormal(np.log(args.mean_tokens) - sigma ** 2 / 2, sigma, args.articles)
    offsets = np.concatenate([[0], np.cumsum(np.rint(lengths).astype(np.int64))])
    split = SimpleNamespace(token_offsets=offsets, num_articles=args.articles)

    tracemalloc.start()
    windows = article_windows(split, 128, 127)
    held, build_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    epoch = iter(EpochShuffle(windows, seed=0, batch_size=32))
    next(epoch)
    order_peak = tracemalloc.get_traced_memory()[1] - held
    tracemalloc.stop()
    per_window = {"windows_held": held, "windows_build_peak": build_peak, "epoch_order": order_peak}
    record = {"articles": args.articles, "windows": len(windows),
              "bytes_per_window": {name: round(value / len(windows), 1) for name, value in per_window.items()}}
    print(json.dumps(record))
    return record


if __name__ == "__main__":
    main()
