"""benchmarks/bench_held_out.py: the held-out check's cost against sentence splitting, on a tiny corpus with one
known copy and one known verbatim passage."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_held_out", ROOT / "benchmarks" / "bench_held_out.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _text(seed: int) -> str:
    return " ".join(f"Sentence {seed} number {i} tells of word{seed * 100 + i} and more words after it." for i in range(12))


def test_the_benchmark_counts_a_copy_and_prints_the_ratio(tmp_path, capsys):
    records = [{"id": f"d{i}", "text": _text(i)} for i in range(6)]
    records.append({"id": "copy", "text": _text(1).upper() + " [1]"})  # a held-out document under another id
    quote = " ".join(_text(0).split()[10:70])  # 60 words of a held-out document inside a longer one
    records.append({"id": "quote", "text": f"{_text(7)} {_text(8)} {_text(9)} Once: {quote}. {_text(10)}"})
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    r = bench.measure(bench.read_records(corpus, 100), held_out=2, splitter="sentencizer")
    assert (r["held_out"], r["checked"], r["copies"], r["cut"]) == (2, 6, 1, 1)
    assert r["largest_overlap"]["verbatim"]["longest_run"] == 60
    bench.main(["--corpus", str(corpus), "--held_out", "2"])
    out = capsys.readouterr().out
    assert "6 documents checked against 2 held out; 1 near-copies" in out and "1 with a verbatim run of 50+ words" \
        in out and "check / splitting: " in out
    with pytest.raises(SystemExit, match="8 records, no more than --held_out 8"):
        bench.main(["--corpus", str(corpus), "--held_out", "8"])
