"""Cost of the check of the training side against the held-out documents (``planlm.data.held_out``: near-copies
and verbatim runs of 50+ words, ``HeldOut.screen``, as ``prepare`` calls it) against prepare's sentence splitting
of the same documents, both measured in the same run.

The first ``--held_out`` records of a corpus JSONL are the held-out documents (the scale simulation holds out 200:
100 validation and 100 test); the next ``--check`` records are the training side that ``prepare`` compares with
them. The baseline is the work ``prepare`` does on every one of those documents anyway: its sentence splitter
(``prepare.splitter``), whose sentence spans the check uses to cut a verbatim passage. Prints the CPU seconds of
each, per 1,000 documents, and the check's cost as a ratio of the splitter's; CPU seconds (``time.process_time``),
so a busy machine inflates both about alike.

    python benchmarks/scale_sim.py --sizes 30000 --out_dir D      # writes D/n30000/corpus/corpus.jsonl
    python benchmarks/bench_held_out.py --corpus D/n30000/corpus/corpus.jsonl --check 30000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from planlm.data.held_out import HeldOut
from planlm.data.resources import split_sentences


def read_records(path: Path, count: int) -> list[dict]:
    records = []
    with open(path) as f:
        for line in f:
            if line.strip():
                records.append(json.loads(line))
                if len(records) == count:
                    break
    return records


def measure(records: list[dict], held_out: int, splitter: str) -> dict:
    """CPU seconds of indexing the held-out documents, of checking the rest, and of splitting the rest."""
    kept, checked = records[:held_out], records[held_out:]
    start = time.process_time()
    spans = split_sentences([record["text"] for record in checked], splitter)
    split = time.process_time()
    index = HeldOut()
    for record in kept:
        index.add("test", record)
    indexed = time.process_time()
    copies = cut = 0
    for record, record_spans in zip(checked, spans):
        found, passages = index.screen(record, record_spans)
        copies += found is not None
        cut += passages is not None
    compared = time.process_time()
    return {"held_out": len(kept), "checked": len(checked), "copies": copies, "cut": cut,
            "index_s": indexed - split, "compare_s": compared - indexed, "split_s": split - start,
            "largest_overlap": index.record()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="a corpus JSONL (id, text per line)")
    parser.add_argument("--held_out", type=int, default=200, help="held-out documents: the first records")
    parser.add_argument("--check", type=int, default=10000, help="training documents checked: the next records")
    parser.add_argument("--splitter", default="sentencizer", help="prepare's sentence splitter (the baseline)")
    args = parser.parse_args(argv)
    records = read_records(args.corpus, args.held_out + args.check)
    if len(records) <= args.held_out:
        raise SystemExit(f"{args.corpus}: {len(records)} records, no more than --held_out {args.held_out}; give a "
                         "larger corpus or a smaller --held_out")
    r = measure(records, args.held_out, args.splitter)
    check = r["index_s"] + r["compare_s"]
    per_k = 1000 / r["checked"]
    verbatim = r["largest_overlap"]["verbatim"]
    print(f"{r['checked']:,} documents checked against {r['held_out']} held out; {r['copies']} near-copies; "
          f"largest overlap below the limit {r['largest_overlap']['largest_overlap']:.1%}; {r['cut']} with a "
          f"verbatim run of {verbatim['min_words']}+ words (longest {verbatim['longest_run']})")
    print(f"held-out check: {check:.2f} CPU s (index {r['index_s']:.2f}, compare {r['compare_s']:.2f}), "
          f"{check * per_k:.3f} s per 1,000 documents")
    print(f"sentence splitting ({args.splitter}): {r['split_s']:.2f} CPU s, {r['split_s'] * per_k:.3f} s per 1,000")
    print(f"check / splitting: {check / r['split_s']:.3f}")


if __name__ == "__main__":
    main()
