"""Where plans act: each evaluated article's NLL broken down by where its scored tokens sit.

A plan tells the LM about the next sentence, so what it adds should show in the first tokens of a sentence, and
in tokens whose context the LM's window no longer shows. Every scored token (each token of an article but its
first is scored exactly once, by one window of ``planlm.evaluate.perplexity.scoring_windows``) falls in one cell
of two breakdowns:

- ``POSITIONS``, its position in its sentence (``token_sentence`` of the prepared split): the sentence's first
  token, its tokens 2-8, its tokens 9 on. The position that predicts a sentence's first token is the first to
  carry that sentence's plan (the alignment of ``planlm.data.artifacts``), and a sentence's first words are the
  least predictable from the sentence so far.
- ``BEYOND``, how much of its article before it the scoring window does not show (window start - article start,
  in tokens): none (the whole article before it is in the window), fewer than a window's length, a window's
  length or more. Only where context has fallen out of the window can a plan made from the whole article so far
  carry something the LM does not see (at stride 1 the last two bins hold the tokens at article position
  >= ``context_length``: ``planlm.data.windows.beyond_window_share``).

The cells are joint (3 x 3): a breakdown's bin is the sum of its cells over the other breakdown. The evaluation
accumulates them beside the totals in the same pass (one ``scatter_add`` per batch of windows), without touching
the totals; ``per_article_positions.csv`` holds each article's NLL sum and scored tokens per cell
(``write_positions`` / ``read_positions``), next to ``per_article.csv``. ``paired_positions`` pairs two
evaluations (and their seeds) bin by bin: the difference in mean NLL per token, with the seed-noise interval of
``planlm.evaluate.bootstrap.seeded_interval`` over the same document resamples as every paired interval;
``bin_difference`` gives the difference between two bins, with its own interval.

Letters: N_art articles, N_tok tokens, W windows, C cells, S seeds, R resamples.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Optional

import numpy as np

from planlm.errors import PlanlmError

PER_ARTICLE_POSITIONS = "per_article_positions.csv"

POSITIONS = (("first", "token 1"), ("early", "tokens 2-8"), ("late", "tokens 9+"))
"""Bins of a token's position in its sentence, [0, 1), [1, 8), [8, inf) counted from 0: (name, column)."""
POSITION_EDGES = (0, 1, 8)
BEYOND = (("inside", "none out"), ("near", "< W out"), ("far", ">= W out"))
"""Bins of how many tokens of its article before a token its scoring window does not show, 0, [1, W), [W, inf) for a
window of W tokens: (name, column)."""

CELLS = tuple((p[0], b[0]) for p in POSITIONS for b in BEYOND)
"""The joint cells, position-major: cell = position bin * len(BEYOND) + beyond bin."""
NUM_CELLS = len(CELLS)
NLL_COLUMNS = tuple(f"nll_sum.{p}.{b}" for p, b in CELLS)
TOKEN_COLUMNS = tuple(f"tokens.{p}.{b}" for p, b in CELLS)
FIELDS = ("article", "id", *(c for pair in zip(NLL_COLUMNS, TOKEN_COLUMNS) for c in pair))

BINS = (("all", "all tokens", None), *((p, column, ("position", i)) for i, (p, column) in enumerate(POSITIONS)),
        *((b, column, ("beyond", i)) for i, (b, column) in enumerate(BEYOND)))
"""The bins the report shows, (name, column, cells): every scored token, then each breakdown's bins (a sum of
cells: ``bin_cells``)."""


def sentence_positions(token_sentence: np.ndarray, token_offsets: np.ndarray) -> np.ndarray:
    """(N,) each token's position in its sentence, from 0, for the first N = len(token_sentence) tokens of a split.

    A sentence starts where ``token_sentence`` changes and at every article start."""
    token_sentence = np.asarray(token_sentence, dtype=np.int64)
    count = len(token_sentence)
    starts = np.zeros(count, dtype=bool)
    if count:
        starts[0] = True
        starts[1:] = token_sentence[1:] != token_sentence[:-1]
        article_starts = np.asarray(token_offsets, dtype=np.int64)
        starts[article_starts[article_starts < count]] = True
    index = np.arange(count, dtype=np.int64)
    return index - np.maximum.accumulate(np.where(starts, index, 0))


def position_bin(positions: np.ndarray) -> np.ndarray:
    """(N,) the ``POSITIONS`` bin of each position in a sentence (from 0)."""
    return np.searchsorted(np.asarray(POSITION_EDGES[1:]), positions, side="right")


def beyond_bin(fallen_out: np.ndarray, context_length: int) -> np.ndarray:
    """(N,) the ``BEYOND`` bin of each count of article tokens the window does not show."""
    fallen_out = np.asarray(fallen_out)
    return (fallen_out >= 1).astype(np.int64) + (fallen_out >= context_length)


def scored_targets(windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The scored tokens of every window, window by window: (targets (N_scored,), their window (N_scored,))."""
    counts = windows[:, 3] - windows[:, 2]  # (W,)
    window = np.repeat(np.arange(len(windows)), counts)
    targets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return targets + windows[window, 2], window


def target_cells(token_sentence: np.ndarray, token_offsets: np.ndarray, windows: np.ndarray,
                 context_length: int) -> np.ndarray:
    """(N_tok,) the cell of each token as the target of the window that scores it (-1: scored by none).

    token_sentence (N_tok,) split-global sentence of each token; token_offsets (N_art + 1,); windows (W, 4) rows
    (article, start, first, end) of ``scoring_windows``, which score every token at most once."""
    num_tokens = len(token_sentence)
    cells = np.full(num_tokens, -1, dtype=np.int64)
    targets, window = scored_targets(windows)
    if not len(targets):
        return cells
    end = int(targets.max()) + 1  # the sentence positions of the evaluated articles only
    positions = sentence_positions(np.asarray(token_sentence[:end]), token_offsets)[targets]
    fallen_out = (windows[:, 1] - np.asarray(token_offsets, dtype=np.int64)[windows[:, 0]])[window]
    cells[targets] = position_bin(positions) * len(BEYOND) + beyond_bin(fallen_out, context_length)
    return cells


def cell_token_counts(cells: np.ndarray, token_offsets: np.ndarray, num_articles: int) -> np.ndarray:
    """(N_art, C) scored tokens of each article in each cell (``cells``: ``target_cells``)."""
    offsets = np.asarray(token_offsets, dtype=np.int64)
    scored = np.flatnonzero(cells[:int(offsets[num_articles])] >= 0)
    article = np.searchsorted(offsets, scored, side="right") - 1
    counts = np.bincount(article * NUM_CELLS + cells[scored], minlength=num_articles * NUM_CELLS)
    return counts.reshape(num_articles, NUM_CELLS)


def write_positions(path: str | Path, ids: list[str], nll: np.ndarray, tokens: np.ndarray) -> None:
    """per_article_positions.csv: one row per article, its NLL sum and scored tokens per cell (nll, tokens
    (N_art, C)); the NLL as ``repr`` of the float, as per_article.csv."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for article, article_id in enumerate(ids):
            row = {"article": article, "id": article_id}
            row.update({c: repr(float(v)) for c, v in zip(NLL_COLUMNS, nll[article])})
            row.update({c: int(v) for c, v in zip(TOKEN_COLUMNS, tokens[article])})
            writer.writerow(row)


def read_positions(eval_dir: str | Path) -> Optional[dict[str, np.ndarray]]:
    """The position table of an evaluation folder: {id (N_art,), nll (N_art, C), tokens (N_art, C)}; None for a
    folder evaluated before it was written (its per_article.csv alone). One line for a file that is not one."""
    from planlm.stage.integrity import fix_for, reading, stage_manifest

    path = Path(eval_dir) / PER_ARTICLE_POSITIONS
    stage_manifest(eval_dir)  # the cheap check of a finished evaluation folder: one line per damaged file
    if not path.is_file():
        return None
    with reading(path, fix_for(eval_dir)), open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows, columns = list(reader), reader.fieldnames or []
    if tuple(columns) != FIELDS:
        raise PlanlmError(f"{path}: not the columns this planlm writes ({len(columns)} columns from {columns[:3]}, "
                          f"not {len(FIELDS)} from {list(FIELDS[:3])}); remove the folder and rerun `planlm evaluate`")
    try:
        nll = [[float(r[c]) for c in NLL_COLUMNS] for r in rows]
        tokens = [[int(r[c]) for c in TOKEN_COLUMNS] for r in rows]
    except (TypeError, ValueError) as e:
        raise PlanlmError(f"{path}: malformed row ({e}); rerun `planlm evaluate`") from e
    return {"id": np.array([r["id"] for r in rows], dtype=object),
            "nll": np.array(nll, dtype=np.float64).reshape(-1, NUM_CELLS),
            "tokens": np.array(tokens, dtype=np.int64).reshape(-1, NUM_CELLS)}


def bin_cells(kind: Optional[tuple[str, int]]) -> np.ndarray:
    """(C,) bool: the cells of a bin of ``BINS`` (its last field; None: every cell)."""
    if kind is None:
        return np.ones(NUM_CELLS, dtype=bool)
    breakdown, index = kind
    grid = np.zeros((len(POSITIONS), len(BEYOND)), dtype=bool)
    if breakdown == "position":
        grid[index] = True
    else:
        grid[:, index] = True
    return grid.reshape(-1)


def _seed_dirs(eval_dir: Path, seeds: list) -> list[Path]:
    return [eval_dir if seed is None else eval_dir / f"seed{seed}" for seed in seeds]


def _paired_cells(dir_a: Path, dir_b: Path) -> dict:
    """Two evaluations paired as ``planlm compare`` pairs them (``evaluation_arrays``: the seeds both have, the same
    articles and scored tokens), after checking that both scored the same tokens in every cell: {seeds, folders,
    nll_a, nll_b (S, N_art), tokens (N_art,), sources (N_art,), cells_a, cells_b (S, N_art, C), cell_tokens
    (N_art, C)}; or {seeds, missing: [folders evaluated before the position table]}."""
    from planlm.evaluate.bootstrap import evaluation_arrays, read_per_article

    (nll_a, nll_b), tokens, sources, seeds = evaluation_arrays([dir_a, dir_b])
    folders = _seed_dirs(dir_a, seeds) + _seed_dirs(dir_b, seeds)
    tables = [read_positions(f) for f in folders]
    missing = [str(f) for f, t in zip(folders, tables) if t is None]
    if missing:
        return {"seeds": seeds, "missing": missing}
    reference = tables[0]
    ids = read_per_article(dir_a if seeds == [None] else dir_a / f"seed{seeds[0]}")["id"]
    for folder, table in zip(folders, tables):
        if len(table["id"]) != len(ids) or not (table["id"] == ids).all():
            raise PlanlmError(f"{folder / PER_ARTICLE_POSITIONS}: not the articles of "
                              f"{folders[0] / 'per_article.csv'}; rerun its evaluation")
        if not (table["tokens"] == reference["tokens"]).all() or not (table["tokens"].sum(1) == tokens).all():
            raise PlanlmError(f"{folder / PER_ARTICLE_POSITIONS}: other scored tokens per cell than "
                              f"{folders[0] / PER_ARTICLE_POSITIONS} (or than its per_article.csv); evaluate both "
                              f"with the same --stride and --context_length")
    num_seeds = len(seeds)
    return {"seeds": seeds, "folders": folders, "nll_a": nll_a, "nll_b": nll_b, "tokens": tokens, "sources": sources,
            "cells_a": np.stack([t["nll"] for t in tables[:num_seeds]]),  # (S, N_art, C)
            "cells_b": np.stack([t["nll"] for t in tables[num_seeds:]]), "cell_tokens": reference["tokens"]}


def _bin_sums(paired: dict, kind: Optional[tuple[str, int]]) -> tuple[np.ndarray, np.ndarray]:
    """A bin's NLL_B - NLL_A sums (S, N_art) and scored tokens (N_art,) per article (``kind``: a ``BINS`` field;
    None: every token, read from per_article.csv's totals)."""
    if kind is None:
        return paired["nll_b"] - paired["nll_a"], paired["tokens"].astype(np.float64)
    chosen = bin_cells(kind)
    return ((paired["cells_b"][..., chosen] - paired["cells_a"][..., chosen]).sum(-1),
            paired["cell_tokens"][:, chosen].sum(1).astype(np.float64))


def paired_positions(dir_a: str | Path, dir_b: str | Path, num_samples: int = 1000, confidence: float = 0.95,
                     seed: int = 0) -> dict:
    """B - A in mean NLL per token (nats), bin by bin (``BINS``), over the same articles and seeds.

    Pairs as ``planlm compare`` does (``evaluation_arrays``: the seeds both have, the same articles and scored
    tokens), and checks that both scored the same tokens in every cell. Each bin's difference is the mean over
    seeds of (NLL_B - NLL_A) / tokens of the bin, with the interval of ``seeded_interval`` (t_{S-1} times the seed
    spread in quadrature with t_{G-1} times the standard deviation over document resamples shared by every
    seed; over documents alone with one seed). A bin's sample is the articles with tokens in it, and G the number
    of their documents: a bin of one document has no interval (None). The bin ``all`` is read from
    per_article.csv's totals. One bin's interval excluding 0 and another's not is no difference between the two
    bins: ``bin_difference`` tests that.

    Returns {seeds, documents, context_length, bins: {name: {diff, ci_low, ci_high, seed_diffs, tokens, share,
    documents}}}; with a folder evaluated before the position table existed, {seeds, missing: [its folders]}
    instead."""
    from planlm.evaluate.bootstrap import seeded_interval

    paired = _paired_cells(Path(dir_a), Path(dir_b))
    if "missing" in paired:
        return paired
    seeds, tokens, sources = paired["seeds"], paired["tokens"], paired["sources"]
    num_seeds = len(seeds)
    bins, documents = {}, None
    for name, _, kind in BINS:
        diff, count = _bin_sums(paired, kind)  # (S, N_art), (N_art,)
        share = float(count.sum() / tokens.sum()) if tokens.sum() else 0.0
        held = count > 0  # the articles with tokens in the bin, and their documents: the bin's own sample
        bins[name] = {"diff": None, "ci_low": None, "ci_high": None, "seed_diffs": None, "tokens": int(count.sum()),
                      "share": share, "documents": len(set(sources[held]))}
        if not held.any():
            continue
        diff, count = diff[:, held], count[held]

        def statistic(weights: np.ndarray, s: int, diff=diff, count=count) -> np.ndarray:
            return (weights @ diff[s]) / (weights @ count)  # (R,) nats per token of seed s on each resample

        interval = seeded_interval(statistic, num_seeds, len(count), num_samples, confidence, seed,
                                   clusters=sources[held])
        bins[name].update(diff=interval["mean"], seed_diffs=dict(zip(seeds, interval["seeds"])) if seeds != [None]
                          else None)
        if bins[name]["documents"] > 1:  # one document has no spread over documents to estimate
            bins[name].update(ci_low=interval["ci_low"], ci_high=interval["ci_high"])
        if kind is None:
            documents = bins[name]["documents"]
    return {"seeds": seeds, "documents": documents, "context_length": _context_length(paired["folders"][0]),
            "bins": bins}


def bin_difference(dir_a: str | Path, dir_b: str | Path, first: str, second: str, num_samples: int = 1000,
                   confidence: float = 0.95, seed: int = 0) -> dict:
    """Whether B - A differs between two bins of ``BINS`` (by name, e.g. ``far`` and ``inside``): the bin
    ``first``'s B - A minus the bin ``second``'s, in nats per token, paired over the same articles and seeds.

    Both bins are measured on every resample of the same draw of source documents (per_article.csv's ``source``,
    so the pieces of one document move together), seed by seed, and the interval is ``seeded_interval``'s, as each
    bin's own in ``paired_positions``; resamples that draw no token of one of the bins are dropped. Returns {first,
    second, diff, ci_low, ci_high, seed_diffs, documents} (no interval with one document), or {seeds, missing}
    as ``paired_positions``."""
    from planlm.evaluate.bootstrap import seeded_interval

    kinds = {name: kind for name, _, kind in BINS}
    for name in (first, second):
        if name not in kinds:
            raise PlanlmError(f"bin {name!r}: choose one of {', '.join(kinds)}")
    paired = _paired_cells(Path(dir_a), Path(dir_b))
    if "missing" in paired:
        return paired
    seeds, sources = paired["seeds"], paired["sources"]
    (diff_1, count_1), (diff_2, count_2) = _bin_sums(paired, kinds[first]), _bin_sums(paired, kinds[second])
    held = (count_1 > 0) | (count_2 > 0)  # the articles with tokens in either bin
    out = {"first": first, "second": second, "diff": None, "ci_low": None, "ci_high": None, "seed_diffs": None,
           "documents": len(set(sources[held]))}
    if not (count_1 > 0).any() or not (count_2 > 0).any():
        return out
    diff_1, count_1, diff_2, count_2 = diff_1[:, held], count_1[held], diff_2[:, held], count_2[held]

    def statistic(weights: np.ndarray, s: int) -> np.ndarray:
        return (weights @ diff_1[s]) / (weights @ count_1) - (weights @ diff_2[s]) / (weights @ count_2)  # (R,)

    interval = seeded_interval(statistic, len(seeds), int(held.sum()), num_samples, confidence, seed,
                               clusters=sources[held])
    out.update(diff=interval["mean"], seed_diffs=dict(zip(seeds, interval["seeds"])) if seeds != [None] else None)
    if out["documents"] > 1:
        out.update(ci_low=interval["ci_low"], ci_high=interval["ci_high"])
    return out


def _context_length(eval_dir: Path) -> Optional[int]:
    """The window length an evaluation folder was scored with (None when its metrics.json does not say)."""
    import json

    try:
        return json.loads((eval_dir / "metrics.json").read_text()).get("context_length")
    except (OSError, ValueError, AttributeError):
        return None
