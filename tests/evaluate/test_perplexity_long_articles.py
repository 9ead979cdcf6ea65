"""Conditioned perplexity on articles longer than the context window (against the planned LM's own forward,
token by token), and the plan-vector table beyond one chunk of 256 sentences (against the adapter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import read_csv, tiny_planned_lm
from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.evaluate.perplexity import evaluate, plan_vector_table
from planlm.plans.config import PlanConfig
from planlm.plans.sources import OraclePlans
from planlm.testing.synthetic import make_synthetic_prepared


@pytest.fixture(scope="module")
def long_articles(tmp_path_factory):
    """Test articles of 30-35 sentences (about 170 tokens each)."""
    return make_synthetic_prepared(tmp_path_factory.mktemp("long"), rule="random", min_sentences=30,
                                   max_sentences=35, num_articles={"train": 2, "validation": 1, "test": 2}, seed=4)


def reference_nll(model, split, article: int, context_length: int) -> float:
    """Every token but the article's first, scored after up to context_length - 1 tokens of the article, each
    input token conditioned on the oracle plan of its token_plan_sentence (the adapter runs inside the forward).
    Windows of the same length share a forward pass."""
    source = OraclePlans(split, model.config.plans["num_paths"], model.config.plans["horizon"])
    tokens = split.token_range(article)
    ids, plan_sentence = np.asarray(split.input_ids), np.asarray(split.token_plan_sentence)
    windows: dict[int, list[tuple[int, int]]] = {}
    for target in range(tokens.start + 1, tokens.stop):
        start = max(tokens.start, target - context_length + 1)
        windows.setdefault(target - start, []).append((start, target))
    total = 0.0
    for length, group in windows.items():
        rows = np.stack([np.arange(start, target) for start, target in group])  # (B, L) token positions
        sentences, plan_index = np.unique(plan_sentence[rows], return_inverse=True)
        action_paths, path_mask, _ = source(sentences)
        with torch.no_grad():
            logits = model(input_ids=torch.from_numpy(ids[rows]), action_paths=action_paths, path_mask=path_mask,
                           plan_index=torch.from_numpy(plan_index.reshape(rows.shape)), logits_to_keep=1).logits
        log_probs = logits[:, -1].double().log_softmax(-1)  # (B, V)
        targets = torch.from_numpy(ids[[target for _, target in group]].astype(np.int64))
        total -= float(log_probs.gather(1, targets[:, None]).sum())
    return total


def test_conditioned_perplexity_of_articles_longer_than_the_context(long_articles, tmp_path):
    prepared = PreparedDataset(long_articles)
    split = prepared["test"]
    model = tiny_planned_lm(prepared, adapter="multipath")
    model.save_pretrained(tmp_path / "model")
    context_length = 24
    assert len(split.token_range(0)) > 6 * context_length
    evaluate(str(tmp_path / "model"), str(long_articles), str(tmp_path / "eval"), plans=PlanConfig(kind="oracle"), stride=1,
             context_length=context_length, max_articles=1, batch_size=64, bootstrap_samples=10,
             runtime=Runtime(device="cpu", precision="fp32"))
    rows = read_csv(tmp_path / "eval" / "per_article.csv")
    assert float(rows[0]["nll_sum"]) == pytest.approx(reference_nll(model, split, 0, context_length), rel=1e-6)
    # The plans matter: the same windows unconditioned give another NLL.
    evaluate(str(tmp_path / "model"), str(long_articles), str(tmp_path / "none"), plans=PlanConfig(kind="none"), stride=1,
             context_length=context_length, max_articles=1, batch_size=64, bootstrap_samples=10,
             runtime=Runtime(device="cpu"))
    assert float(read_csv(tmp_path / "none" / "per_article.csv")[0]["nll_sum"]) != pytest.approx(
        float(rows[0]["nll_sum"]), rel=1e-3)


def test_plan_vector_table_beyond_one_chunk_of_256_sentences(synthetic_random):
    prepared = PreparedDataset(synthetic_random)
    split = prepared["train"]
    model = tiny_planned_lm(prepared, adapter="multipath")
    source = OraclePlans(split, 2, 3)
    sentences = np.arange(split.num_sentences)[::-1][:300].copy()  # 300 sentences, not in order
    assert split.num_sentences > 300
    table = plan_vector_table(model, source, sentences, split.num_sentences, device="cpu", precision="fp32")
    assert table.shape == (split.num_sentences, 32)
    for sentence in (sentences[0], sentences[255], sentences[256], sentences[-1]):  # both sides of the chunk edge
        paths, mask, _ = source(np.array([sentence]))
        with torch.no_grad():
            torch.testing.assert_close(table[sentence], model.plan_vectors(paths, mask)[0], rtol=1e-5, atol=1e-6)
    unused = np.setdiff1d(np.arange(split.num_sentences), sentences)
    assert len(unused) and table[torch.from_numpy(unused)].abs().max() == 0
    # Plans differ between sentences, so a row landing in the wrong place would show.
    assert not torch.allclose(table[sentences[255]], table[sentences[256]])
