"""Where plans act: the evaluation's NLL per position in the sentence and per context fallen out of the window."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.evaluate.perplexity import evaluate, scoring_windows
from planlm.evaluate.positions import (BEYOND, CELLS, NUM_CELLS, PER_ARTICLE_POSITIONS, POSITIONS, read_positions,
                                       sentence_positions, target_cells)

from helpers import tiny_gpt2


def cell_counts(cells: np.ndarray) -> dict[tuple[str, str], int]:
    counts = np.bincount(cells[cells >= 0], minlength=NUM_CELLS)
    return {cell: int(n) for cell, n in zip(CELLS, counts) if n}


def test_a_constructed_article_falls_in_the_bins_it_should():
    # article 0: 40 tokens, sentences of 10, 25 and 5 tokens; article 1: 3 tokens, one sentence
    token_sentence = np.array([0] * 10 + [1] * 25 + [2] * 5 + [3] * 3)
    offsets = np.array([0, 40, 43])
    positions = sentence_positions(token_sentence, offsets)
    assert positions[:10].tolist() == list(range(10)) and positions[10] == 0 and positions[35] == 0
    assert positions[40:].tolist() == [0, 1, 2]  # a new article starts a sentence
    # a window of 16 at stride 1: article position p has max(0, p - 15) tokens fallen out of its window
    windows = scoring_windows(offsets, range(2), context_length=16, stride=1)
    cells = target_cells(token_sentence, offsets, windows, context_length=16)
    assert cells[0] == -1 and cells[40] == -1  # an article's first token is scored by no window
    position = {name: i for i, (name, _) in enumerate(POSITIONS)}
    beyond = {name: i for i, (name, _) in enumerate(BEYOND)}  # the columns of per_article_positions.csv: cells
    first_sentence = cells[1:10] // len(BEYOND)
    assert (first_sentence == position["early"]).sum() == 7 and (first_sentence == position["late"]).sum() == 2
    second = cells[10:35] // len(BEYOND)  # its 10 first tokens: 1 first, 7 early (8 in [0, 8)), then 17 late
    assert second.tolist() == [0] + [1] * 7 + [2] * 17
    fallen = cells[:40] % len(BEYOND)
    assert (fallen[1:16] == beyond["inside"]).all()  # the first window shows the whole article before its tokens
    assert (fallen[16:31] == beyond["near"]).all() and (fallen[31:40] == beyond["far"]).all()
    assert cell_counts(cells[40:]) == {("early", "inside"): 2}  # the short article: its tokens 2 and 3
    # non-overlapping windows of 16: the first window's tokens see their whole article, the next ones do not
    windows = scoring_windows(offsets, range(2), context_length=16, stride=16)
    cells = target_cells(token_sentence, offsets, windows, context_length=16)
    scored = np.flatnonzero(cells[:40] >= 0)
    assert (cells[scored[scored < 16]] % len(BEYOND) == beyond["inside"]).all()
    assert (cells[scored[scored >= 16]] % len(BEYOND) != beyond["inside"]).all()


def independent_token_nll(lm, ids: list[int], context_length: int) -> np.ndarray:
    """(len(ids),) the NLL of every token with stride-1 context, one forward per token (0 for the first)."""
    nll = np.zeros(len(ids))
    for t in range(1, len(ids)):
        context = torch.tensor(ids[max(0, t - context_length + 1):t])[None]
        with torch.no_grad():
            logits = lm(input_ids=context).logits[0, -1].double()
        nll[t] = float(torch.logsumexp(logits, -1) - logits[ids[t]])
    return nll


def test_the_cells_sum_to_the_totals_and_hold_each_tokens_own_nll(synthetic_cycle, tmp_path, tiny_lm):
    lm_dir = tmp_path / "lm"
    tiny_gpt2().save_pretrained(lm_dir)
    split = PreparedDataset(synthetic_cycle)["test"]
    for stride in (1, 5):
        out = tmp_path / f"eval{stride}"
        evaluate(str(lm_dir), str(synthetic_cycle), str(out), max_articles=3, context_length=16, stride=stride,
                 batch_size=4, bootstrap_samples=20)
        from planlm.evaluate.bootstrap import read_per_article

        totals, table = read_per_article(out), read_positions(out)
        assert (table["id"] == totals["id"]).all() and (table["tokens"].sum(1) == totals["tokens"]).all()
        assert table["nll"].sum(1) == pytest.approx(totals["nll_sum"], rel=1e-12)
        assert (table["tokens"][:, [c for c, (_, b) in enumerate(CELLS) if b != "inside"]].sum() > 0)
        if stride != 1:
            continue
        for article in range(3):  # each token's own NLL lands in the cell of its position and of its window
            tokens = split.token_range(article)
            nll = independent_token_nll(tiny_lm, [int(i) for i in split.input_ids[tokens.start:tokens.stop]], 16)
            windows = scoring_windows(split.token_offsets, range(article, article + 1), 16, 1)
            cells = target_cells(split.token_sentence, split.token_offsets, windows, 16)[tokens.start:tokens.stop]
            expected = np.bincount(cells[1:], weights=nll[1:], minlength=NUM_CELLS)
            assert table["nll"][article] == pytest.approx(expected, rel=1e-5, abs=1e-9)
            assert (table["tokens"][article] == np.bincount(cells[1:], minlength=NUM_CELLS)).all()


def test_an_evaluation_without_the_table_reads_as_none_and_a_foreign_one_is_refused(tmp_path):
    folder = tmp_path / "eval"
    folder.mkdir()
    assert read_positions(folder) is None  # evaluated before the table was written: per_article.csv alone
    (folder / PER_ARTICLE_POSITIONS).write_text("article,id,nll_sum.first,tokens.first\n0,a,1.0,2\n")
    with pytest.raises(PlanlmError, match="not the columns this planlm writes"):
        read_positions(folder)


def write_cells(folder, ids: list[str], nll_per_cell: np.ndarray, tokens: np.ndarray) -> None:
    """An evaluation folder of articles ``ids``: per_article.csv summing per_article_positions.csv (nll_per_cell,
    tokens (N_art, C): each article's NLL per token and scored tokens in every cell)."""
    import json

    from planlm.evaluate.bootstrap import write_per_article
    from planlm.evaluate.positions import write_positions

    folder.mkdir(parents=True)
    nll = nll_per_cell * tokens
    write_per_article(folder / "per_article.csv", [{"article": i, "id": article, "nll_sum": repr(float(n)),
                                                    "tokens": int(t)}
                                                   for i, (article, n, t) in enumerate(zip(ids, nll.sum(1),
                                                                                           tokens.sum(1)))])
    write_positions(folder / PER_ARTICLE_POSITIONS, ids, nll, tokens)
    (folder / "metrics.json").write_text(json.dumps({"ppl": 20.0, "context_length": 16}))


def pieces_run(tmp_path, name: str, gain_far: float, gain_inside: float, split_documents: bool = False):
    """Two seeds of A and B on 12 documents cut into 2-4 pieces of unequal size; B - A per token is a document's
    own gain (one draw per document, shared by its pieces) in the ``far`` cells and in the ``inside`` cells.
    ``split_documents``: the same numbers with every piece its own document."""
    rng = np.random.default_rng(1)
    pieces = [2, 3, 4, 2, 3, 2, 4, 3, 2, 3, 2, 4]
    ids = [f"doc{d}{'_' if split_documents else '#'}{j}" for d, n in enumerate(pieces) for j in range(n)]
    document = np.repeat(np.arange(len(pieces)), pieces)
    far = np.array([b == "far" for _, b in CELLS])
    inside = np.array([b == "inside" for _, b in CELLS])
    tokens = rng.integers(5, 40, (len(ids), NUM_CELLS))  # unequal pieces
    base = 3.0 + rng.normal(0, 0.1, tokens.shape)
    per_document = {"far": gain_far + rng.normal(0, 0.02, len(pieces)),
                    "inside": gain_inside + rng.normal(0, 0.05, len(pieces))}
    shift = np.outer(per_document["far"][document], far) + np.outer(per_document["inside"][document], inside)
    a, b = tmp_path / name / "a", tmp_path / name / "b"
    for seed in range(2):
        write_cells(a / f"seed{seed}", ids, base, tokens)
        write_cells(b / f"seed{seed}", ids, base + shift + 0.003 * seed, tokens)
    return a, b


def test_the_difference_between_two_bins_has_its_own_interval_over_whole_documents(tmp_path):
    from planlm.evaluate.positions import bin_difference, paired_positions

    # B gains 0.05 nats per token where a window's length has left the window, 0.02 where nothing has: each bin's
    # own interval can exclude 0 or not, and only the difference between them says whether the two bins differ.
    a, b = pieces_run(tmp_path, "pieces", gain_far=-0.05, gain_inside=-0.02)
    bins = paired_positions(a, b)["bins"]
    assert bins["far"]["ci_high"] < 0 and bins["far"]["documents"] == 12
    between = bin_difference(a, b, "far", "inside")
    assert between["documents"] == 12  # source documents, not the 34 pieces
    assert between["diff"] == pytest.approx(bins["far"]["diff"] - bins["inside"]["diff"], abs=1e-12)
    assert set(between["seed_diffs"]) == {0, 1}
    # Here far's interval excludes 0 and inside's does not, yet the difference between the two is not shown.
    assert bins["inside"]["ci_low"] < 0 < bins["inside"]["ci_high"]
    assert between["ci_low"] < between["diff"] < 0 < between["ci_high"]
    # The same bins with no gain anywhere: the difference's interval holds 0.
    a0, b0 = pieces_run(tmp_path, "level", gain_far=0.0, gain_inside=0.0)
    level = bin_difference(a0, b0, "far", "inside")
    assert level["ci_low"] < 0 < level["ci_high"]
    # A document's pieces move together: resampled as 34 documents, the interval would be too narrow.
    a1, b1 = pieces_run(tmp_path, "split", gain_far=-0.05, gain_inside=-0.02, split_documents=True)
    split = bin_difference(a1, b1, "far", "inside")
    assert split["documents"] == 34 and split["diff"] == pytest.approx(between["diff"], abs=1e-12)
    assert split["ci_high"] < 0  # pieces taken for documents: a difference "shown" that whole documents do not show
    assert split["ci_high"] - split["ci_low"] < 0.8 * (between["ci_high"] - between["ci_low"])
    with pytest.raises(PlanlmError, match="bin 'beyond': choose one of all, first"):
        bin_difference(a, b, "beyond", "inside")
