"""How much verbatim text of the held-out documents reaches a prepared folder's training side?

Given a folder written by ``planlm prepare``, counts the training-side pieces (the LM's training split, the
planner's split ``planner_train`` when there is one, and the set the codebook is fitted on: the planner's split
when there is one, else the training split) that hold a verbatim run of at least ``--min_words`` words (50: the
exact-substring rule of Lee et al. 2022) of a *whole* test or validation document, and lists the longest runs.

The whole held-out documents are read again from the corpus that the folder's manifest names (every piece of
them, those that no split kept included); words are ``planlm.data.held_out.words`` (case folded, punctuation and
markers such as ``[1]`` dropped). The runs are found here by a plain dictionary of word 8-grams, independently of
the index that ``prepare`` uses, so that the count checks prepare's own check.

    python experiments/verbatim_leak.py runs/evidence-bigplanner/prepared [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from planlm.data.held_out import words

SHINGLE = 8


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def whole_documents(manifest: dict, wanted: set[str]) -> dict[str, str]:
    """{document id: whole text} of the corpus's documents named in ``wanted`` (the manifest's corpus section)."""
    from planlm.data.corpus import CorpusConfig, Skips, read_articles
    corpus = CorpusConfig(**manifest["config"]["corpus"])
    found = {}
    for article in read_articles(corpus, Skips()):
        if str(article["id"]) in wanted:
            found[str(article["id"])] = article["text"]
            if len(found) == len(wanted):
                break
    missing = wanted - set(found)
    if missing:
        raise SystemExit(f"{corpus.source}: the held-out documents {sorted(missing)[:3]} are not in the corpus the "
                         f"manifest names; run on the machine that prepared the folder")
    return found


class Runs:
    """Every word 8-gram of the held-out documents, by position: the longest runs a text shares with each."""

    def __init__(self, held_out: dict[str, tuple[str, str]]):  # {document: (split, text)}
        self.table: dict[tuple, list[tuple[str, int]]] = defaultdict(list)
        self.split = {name: split for name, (split, _) in held_out.items()}
        for name, (_, text) in held_out.items():
            w = words(text)
            for j in range(len(w) - SHINGLE + 1):
                self.table[tuple(w[j:j + SHINGLE])].append((name, j))

    def longest(self, text: str) -> list[tuple[int, str]]:
        """[(run length in words, held-out document)] of every maximal run of >= 8 words, longest first."""
        w = words(text)
        active: dict[tuple[str, int], int] = {}  # (document, offset j - i) -> start i of the run
        runs = []
        for i in range(len(w) - SHINGLE + 2):
            now = {}
            for name, j in (self.table.get(tuple(w[i:i + SHINGLE]), ()) if i <= len(w) - SHINGLE else ()):
                key = (name, j - i)
                now[key] = active.get(key, i)
            for (name, _), start in active.items():
                if (name, _) not in now:
                    runs.append((i - 1 - start + SHINGLE, name))
            active = now
        return sorted(runs, reverse=True)


def measure(folder: Path, min_words: int = 50, held_out_texts: dict[str, str] | None = None) -> dict:
    """The leak of a prepared folder: per training-side set, its pieces, those with a run of ``min_words``+ words
    of a whole held-out document, and the longest runs (every piece's longest)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    held: dict[str, str] = {}
    for split in ("test", "validation"):
        for article in read_jsonl(folder / split / "articles.jsonl"):
            held.setdefault(str(article.get("source", article["id"])), split)
    texts = held_out_texts if held_out_texts is not None else whole_documents(manifest, set(held))
    finder = Runs({name: (split, texts[name]) for name, split in held.items()})
    sets = {"lm_train": read_jsonl(folder / "train" / "articles.jsonl")}
    if (folder / "planner_train" / "articles.jsonl").is_file():
        sets["planner_train"] = read_jsonl(folder / "planner_train" / "articles.jsonl")
    sets["codebook"] = sets.get("planner_train", sets["lm_train"])
    longest: dict[str, tuple[int, str]] = {}
    for pieces in sets.values():
        for piece in pieces:
            if piece["id"] not in longest:
                runs = finder.longest(piece["text"])
                longest[piece["id"]] = runs[0] if runs else (0, "")
    table = {}
    for name, pieces in sets.items():
        leaking = [p["id"] for p in pieces if longest[p["id"]][0] >= min_words]
        table[name] = {"pieces": len(pieces), "with_run": len(leaking), "ids": leaking}
    every = {p["id"] for pieces in sets.values() for p in pieces}
    top = sorted(((longest[i][0], i, longest[i][1], finder.split.get(longest[i][1], "")) for i in every
                  if longest[i][0]), reverse=True)
    verbatim = (manifest.get("held_out_overlap") or {}).get("verbatim")
    return {"folder": str(folder), "min_words": min_words, "held_out_documents": len(held), "sets": table,
            "training_side_pieces": len(every), "with_run": sum(longest[i][0] >= min_words for i in every),
            "longest": top[:12], "prepare_dropped": verbatim, "skipped": manifest.get("skipped", {})}


def report(result: dict) -> str:
    lines = [f"{result['folder']}: training-side pieces with a verbatim run of >= {result['min_words']} words of one "
             f"of the {result['held_out_documents']} whole test / validation documents",
             "", "| set | pieces | with a run |", "|---|---|---|"]
    for name, row in result["sets"].items():
        lines.append(f"| {name} | {row['pieces']:,} | {row['with_run']} |")
    lines.append(f"| training side (distinct pieces) | {result['training_side_pieces']:,} | {result['with_run']} |")
    lines += ["", "longest runs (words, piece, held-out document, its split):"]
    lines += [f"  {n:>4}  {piece}  ~  {doc} ({split})" for n, piece, doc, split in result["longest"]]
    lines.append(f"prepare's count of what it dropped: {result['prepare_dropped']}; skipped: {result['skipped']}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a folder written by planlm prepare")
    parser.add_argument("--min_words", type=int, default=50)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result = measure(args.folder, args.min_words)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
