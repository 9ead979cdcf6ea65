"""Article batches for the article-level planner encoder: rows cover every boundary once with the paper's
context, and the loss and plans of article batches equal the per-boundary computation."""

from __future__ import annotations

import numpy as np
import torch

from planlm.data.artifacts import PreparedDataset
from planlm.plans.config import PlanConfig
from planlm.plans.contexts import IGNORE_INDEX, article_contexts, article_rows, boundary_contexts, boundary_targets
from planlm.plans.draws import draw_plans
from planlm.train.boundaries import ArticleCollate, BoundaryCollate
from planlm.train.planner_module import LightningPlanner
from tests.helpers import greedy_path, tiny_planner


def test_article_rows_cover_every_boundary_once_with_the_boundary_context(synthetic_cycle):
    split = PreparedDataset(synthetic_cycle)["validation"]
    max_sentences = 3  # shorter than most articles: later boundaries get rows of their own
    context_embeds, context_mask, sentences = article_contexts(split, article_rows(split, max_sentences))
    supervised = sentences >= 0
    assert sorted(sentences[supervised].tolist()) == list(range(split.num_sentences))
    rows, bounds = np.nonzero(supervised)
    expected, expected_mask = boundary_contexts(split, sentences[supervised], max_sentences)
    for b, (row, bound) in enumerate(zip(rows, bounds)):
        assert context_mask[row, :bound].all() and int(expected_mask[b].sum()) == bound
        torch.testing.assert_close(context_embeds[row, :bound], expected[b, :bound])


def test_article_batches_give_the_loss_of_boundary_batches(synthetic_cycle):
    prepared = PreparedDataset(synthetic_cycle)
    split = prepared["validation"]
    planner = tiny_planner(prepared, dynamics="causal", encoder="article", horizon=3, max_sentences=4)
    module = LightningPlanner(planner)
    article = ArticleCollate(split.path, 3, 4)
    article_batch = article(list(range(len(article.rows))))
    boundary_batch = BoundaryCollate(split.path, 3, 4)(list(range(split.num_sentences)))
    with torch.no_grad():
        article_loss = module.model_step(article_batch)[0]
        boundary_loss = module.model_step(boundary_batch)[0]
    torch.testing.assert_close(article_loss, boundary_loss, rtol=0, atol=1e-5)
    targets = article_batch["target_actions"]
    supervised = article_batch["sentences"] >= 0
    assert torch.equal(targets[supervised], boundary_targets(split, article_batch["sentences"][supervised].numpy(), 3))
    assert (targets[~supervised] == IGNORE_INDEX).all()


def test_article_plans_are_the_per_boundary_greedy_paths(synthetic_cycle):
    prepared = PreparedDataset(synthetic_cycle)
    split = prepared["validation"]
    planner = tiny_planner(prepared, dynamics="causal", encoder="article", horizon=3, max_sentences=4)
    sentences = np.arange(1, split.num_sentences, 2)
    sampled = PlanConfig(kind="planner_sampled", num_paths=4, horizon=3).resolve()
    greedy = draw_plans(planner, split, PlanConfig(kind="planner_argmax", num_paths=4, horizon=3).resolve(), sentences,
                        batch_size=8).paths
    paths = draw_plans(planner, split, sampled, sentences, batch_size=8).paths
    context_embeds, context_mask = boundary_contexts(split, sentences, 4)
    assert np.array_equal(greedy, greedy_path(planner, context_embeds, context_mask, 3).numpy())
    assert paths.shape == (len(sentences), 4, 3) and paths.min() >= 0 and paths.max() < prepared.num_actions
    again = draw_plans(planner, split, sampled, sentences, batch_size=8).paths
    assert np.array_equal(paths, again)  # seeded


def test_evaluate_planner_reads_an_article_planner_as_its_article_batches(synthetic_cycle):
    from planlm.train.planner_metrics import evaluate_planner

    prepared = PreparedDataset(synthetic_cycle)
    split = prepared["validation"]
    planner = tiny_planner(prepared, dynamics="causal", encoder="article", horizon=3)
    metrics = evaluate_planner(planner, split, horizon=3)  # per boundary, the causal context
    collate = ArticleCollate(split.path, 3, planner.config.max_sentences)
    batch = collate(list(range(len(collate.rows))))
    with torch.no_grad():
        logits = planner.article_forward(batch["context_embeds"], batch["context_mask"], batch["target_actions"])
    targets = batch["target_actions"]
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 2), targets.flatten().clamp(min=0), reduction="none")
    valid = (targets != IGNORE_INDEX).flatten(0, 1)  # (R*J, T)
    per_step = (nll.view(valid.shape) * valid).sum(0) / valid.sum(0)
    np.testing.assert_allclose(metrics["planner_teacher_forced"]["nll"], per_step.numpy(), atol=1e-5)
