"""How much verbatim text of the held-out documents reaches a prepared folder's training side?

Given a folder written by ``planlm prepare``, counts the training-side pieces (the LM's training split, the
planner's split ``planner_train`` when there is one, and the set the codebook is fitted on: the planner's split
when there is one, else the training split) that hold a verbatim run of at least ``--min_words`` words (50: the
exact-substring rule of Lee et al. 2022) of a *whole* test or validation document, and lists the longest runs.

The whole held-out documents are read again from the corpus that the folder's manifest names (every piece of
them, those that no split kept included); words are ``planlm.data.held_out.words`` (case folded, punctuation and
markers such as ``[1]`` dropped). The runs are found here by a plain dictionary of word 8-grams, independently of
the index that ``prepare`` uses, so that the count checks prepare's own check.

With ``--draw CONFIG`` it measures prepare's draw for a run config's ``prepare`` section instead of a folder: the
articles that ``prepare`` would write to the training split and the planner's split (the same function,
``planlm.data.prepare.take_articles``, with the held-out check on), without embedding them: seconds, not the
half hour that embedding the larger planner's 58,000 sentences takes on a small CPU.

    python experiments/verbatim_leak.py runs/evidence-bigplanner/prepared [--json out.json]
    python experiments/verbatim_leak.py --draw configs/evidence-bigplanner.yaml
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


def whole_documents(section: dict, wanted: set[str]) -> dict[str, str]:
    """{document id: whole text} of the corpus's documents named in ``wanted`` (``section``: a corpus config)."""
    from planlm.data.corpus import CorpusConfig, Skips, read_articles
    corpus = CorpusConfig(**section)
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


def leak(held: dict[str, tuple[str, str]], sets: dict[str, list[dict]], min_words: int = 50) -> dict:
    """Per training-side set ({name: its pieces}), its pieces, those with a run of ``min_words``+ words of a
    whole held-out document (``held``: {document: (split, text)}), and the longest runs (every piece's longest)."""
    finder = Runs(held)
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
    return {"min_words": min_words, "held_out_documents": len(held), "sets": table,
            "training_side_pieces": len(every), "with_run": sum(longest[i][0] >= min_words for i in every),
            "longest": top[:12]}


def measure(folder: Path, min_words: int = 50, held_out_texts: dict[str, str] | None = None) -> dict:
    """The leak of a prepared folder (``leak``), with prepare's own count of what it dropped (its manifest)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    held: dict[str, str] = {}
    for split in ("test", "validation"):
        for article in read_jsonl(folder / split / "articles.jsonl"):
            held.setdefault(str(article.get("source", article["id"])), split)
    texts = held_out_texts if held_out_texts is not None else whole_documents(manifest["config"]["corpus"], set(held))
    sets = {"lm_train": read_jsonl(folder / "train" / "articles.jsonl")}
    if (folder / "planner_train" / "articles.jsonl").is_file():
        sets["planner_train"] = read_jsonl(folder / "planner_train" / "articles.jsonl")
    sets["codebook"] = sets.get("planner_train", sets["lm_train"])
    result = leak({name: (split, texts[name]) for name, split in held.items()}, sets, min_words)
    verbatim = (manifest.get("held_out_overlap") or {}).get("verbatim")
    return {"folder": str(folder), **result, "prepare_dropped": verbatim, "skipped": manifest.get("skipped", {})}


def measure_draw(config: Path, min_words: int = 50) -> dict:
    """The leak of prepare's draw for a run config's ``prepare`` section (``leak``): the training split and, with
    ``planner_corpus.rest_of_train``, the planner's split (the training split, then the rest of the training side),
    as ``prepare`` draws them with the held-out check on."""
    import yaml
    from planlm.data.corpus import CorpusConfig, Skips
    from planlm.data.held_out import HeldOut
    from planlm.data.prepare import SentencesConfig, take_articles
    section = yaml.safe_load(config.read_text())["prepare"]
    corpus = CorpusConfig(**section["corpus"])
    with_rest = bool((section.get("planner_corpus") or {}).get("rest_of_train"))
    held_out, skips, rest = HeldOut(), Skips(), [] if with_rest else None
    drawn = take_articles(corpus, SentencesConfig(), skips, progress=False, rest=rest, held_out=held_out)
    texts = whole_documents(section["corpus"], set(held_out.ids))
    sets = {"lm_train": drawn["train"][0]}
    if with_rest:
        sets["planner_train"] = sets["lm_train"] + [piece for piece, _ in rest]
    sets["codebook"] = sets.get("planner_train", sets["lm_train"])
    result = leak({name: (split, texts[name]) for name, split in held_out.ids.items()}, sets, min_words)
    return {"folder": f"prepare's draw of {config}", **result,
            "prepare_dropped": held_out.record().get("verbatim"), "skipped": dict(skips)}


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
    parser.add_argument("folder", type=Path, nargs="?", help="a folder written by planlm prepare")
    parser.add_argument("--draw", type=Path, default=None, help="a run config: measure prepare's draw instead")
    parser.add_argument("--min_words", type=int, default=50)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    if (args.folder is None) == (args.draw is None):
        parser.error("give a prepared folder or --draw CONFIG (one of them)")
    result = measure_draw(args.draw, args.min_words) if args.draw else measure(args.folder, args.min_words)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
