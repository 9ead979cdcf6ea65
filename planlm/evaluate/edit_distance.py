"""Edit distance between the action sequences of generated and true continuations (the paper's protocol).

At sentence starts of evaluation articles: the context is the <= 128-token window of the article
ending at the boundary; the planned LM samples 128 new tokens (temperature 1.0, re-planning at every
generated sentence end, ``planlm.evaluate.generator``); the generated text and the true continuation
(the next 128 true tokens of the article) are split into sentences with the corpus's splitter,
embedded with the corpus's encoder and assigned to their nearest centroid. The score is the
Levenshtein distance of the two action sequences (rapidfuzz), raw and divided by the reference
length, averaged over boundaries with a bootstrap confidence interval that resamples source documents
(every boundary of a document's pieces together), like every interval of the evaluation.
"""

from __future__ import annotations

import csv
import time
from dataclasses import asdict
from typing import Callable, Optional, Sequence

import numpy as np
from rapidfuzz.distance import Levenshtein

from planlm.args import Runtime
from planlm.console import open_bar
from planlm.data.actions import nearest_actions
from planlm.data.resources import split_sentences
from planlm.errors import PlanlmError
from planlm.evaluate.bootstrap import CONFIDENCE, bootstrap_mean
from planlm.evaluate.generate import build_generator, encoder_embed_fn
from planlm.evaluate.generator import GENERATION_VERSION, ProtocolSampling, SamplingConfig
from planlm.evaluate.loading import evaluation_inputs
from planlm.evaluate.metrics import EditDistanceMetrics, PathCounts
from planlm.jsonio import write_json
from planlm.plans.config import PlanSettings
from planlm.plans.policy import paths_summary
from planlm.stage import StageDir


def action_edit_distance(generated: Sequence[int], reference: Sequence[int]) -> tuple[int, float]:
    """Levenshtein distance of two action sequences, raw and divided by the reference length."""
    distance = Levenshtein.distance(list(generated), list(reference))
    return distance, distance / max(len(reference), 1)


def text_actions(texts: list[str], embed_fn: Callable[[list[str]], np.ndarray], codebook: np.ndarray,
                 sentence_splitter: str = "sentencizer") -> list[list[int]]:
    """The action sequence of each text: its sentences, embedded, each at its nearest centroid."""
    spans = split_sentences(texts, sentence_splitter)
    sentences = [text[a:b] for text, text_spans in zip(texts, spans) for a, b in text_spans]
    actions = nearest_actions(embed_fn(sentences), codebook) if sentences else np.zeros(0, np.int64)
    out, i = [], 0
    for text_spans in spans:
        out.append([int(a) for a in actions[i:i + len(text_spans)]])
        i += len(text_spans)
    return out


def select_boundaries(sentence_offsets: np.ndarray, num_articles: int, max_boundaries_per_article: Optional[int],
                      seed: int) -> list[tuple[int, int]]:
    """(article, article-local sentence) boundaries: every sentence start but the first of each article
    (it has no context), at most ``max_boundaries_per_article`` per article drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    chosen = []
    for article in range(num_articles):
        count = int(sentence_offsets[article + 1] - sentence_offsets[article])
        local = np.arange(1, count)
        if max_boundaries_per_article is not None and len(local) > max_boundaries_per_article:
            local = np.sort(rng.choice(local, size=max_boundaries_per_article, replace=False))
        chosen.extend((article, int(b)) for b in local)
    return chosen


FIELDS = ("article", "id", "boundary", "distance", "normalized", "generated_actions", "reference_actions",
          "generated_text", "reference_text")


def edit_distance(model_dir: str, prepared_dir: str, out_dir: str, split: str = "test",
                  max_articles: Optional[int] = 100, max_boundaries_per_article: Optional[int] = 2, seed: int = 0,
                  context_length: int = 128, sampling: ProtocolSampling = ProtocolSampling(),
                  plans: PlanSettings = PlanSettings(), bootstrap_samples: int = 1000,
                  runtime: Runtime = Runtime()) -> EditDistanceMetrics:
    """Edit distance between the action sequences of generated and true continuations at sentence starts.

    Writes ``per_boundary.csv``, ``metrics.json`` (mean distance and normalised distance with bootstrap
    CIs, wall time, generated tokens/s) and, last, ``manifest.json``; a complete folder is reused.

    Args:
        model_dir: Folder of a finished ``planlm train-lm``.
        prepared_dir: Prepared corpus (encoder, splitter, codebook).
        out_dir: Output folder.
        split: Split whose articles are continued.
        max_articles: Use the first N articles (None: all).
        max_boundaries_per_article: Sentence starts drawn per article (None: all).
        seed: Seed of the boundary subsampling and of generation.
        context_length: Context tokens before the boundary (at most).
        sampling: How tokens are drawn (the protocol: 128 tokens, temperature 1.0, over the whole vocabulary);
            max_new_tokens is also the length of the true continuation taken as the reference.
        plans: The plans (kind, num_paths, horizon, temperature, planner_dir); unset fields: the model's own.
        bootstrap_samples: Bootstrap resamples of the 95% confidence intervals.
        runtime: The device and precision of the LM, the adapter and the planner (runtime.device,
            runtime.precision).

    Returns:
        The metrics (``EditDistanceMetrics``; ``<out_dir>/metrics.json`` holds its ``to_dict()``).
    """
    if isinstance(sampling, SamplingConfig) or not isinstance(sampling, ProtocolSampling):
        raise PlanlmError(f"edit_distance: sampling is a ProtocolSampling (max_new_tokens, temperature, plan_guidance), "
                          f"got {type(sampling).__name__}: the edit distance's protocol draws from the whole vocabulary, "
                          f"with no top_k nor top_p")
    sampling = sampling.sampling()
    new_tokens = sampling.max_new_tokens
    _check_limits(context_length, max_articles, max_boundaries_per_article)
    generator, prepared, split_view = build_generator(model_dir, prepared_dir, split, plans, runtime, seed)
    embed_fn, codebook = generator.embed_fn or encoder_embed_fn(prepared), prepared.codebook.numpy()
    num_articles = split_view.num_articles if max_articles is None else min(max_articles, split_view.num_articles)
    plans = generator.plans  # resolved: the model's own for every unset field
    key = {**evaluation_inputs(model_dir, prepared_dir, plans.planner_dir), "split": split, "articles": num_articles,
           "max_boundaries_per_article": max_boundaries_per_article, "seed": seed, "context_length": context_length,
           "sampling": sampling.reuse_key(), "plan_spec": plans.cache_key(), "device_type": generator.device.type,
           "precision": generator.precision, "bootstrap_samples": bootstrap_samples, "confidence": CONFIDENCE,
           "generation_version": GENERATION_VERSION, "resampled": "source documents"}
    with StageDir(out_dir, key) as stage:
        if stage.reused:
            return EditDistanceMetrics.load(stage.path)
        boundaries = select_boundaries(split_view.sentence_offsets, num_articles, max_boundaries_per_article, seed)
        if not boundaries:
            raise PlanlmError(f"{split_view.path}: no sentence start with context in the first {num_articles} "
                              f"articles (every article has one sentence); raise --max_articles or use another --split")
        rows, generated_tokens, wall_time = _continue_boundaries(generator, split_view, boundaries, sampling,
                                                                 context_length, new_tokens, embed_fn, codebook)
        articles = split_view.articles
        sources = [str(articles[r["article"]].get("source", articles[r["article"]]["id"])) for r in rows]
        metrics = EditDistanceMetrics(
            **_distance_summary(rows, bootstrap_samples, CONFIDENCE, seed, sources), articles=num_articles,
            generated_tokens=generated_tokens, wall_time_s=wall_time,
            tokens_per_s=generated_tokens / max(wall_time, 1e-9), conditioning=str(plans.kind), K=plans.num_paths,
            T=plans.horizon, tau=plans.temperature, temperature=sampling.temperature, top_k=sampling.top_k,
            top_p=sampling.top_p, new_tokens=new_tokens, context_length=context_length, model_dir=str(model_dir),
            prepared_dir=str(prepared_dir), split=split, path_policy=asdict(plans.path_policy),
            paths=PathCounts(**paths_summary(np.asarray(generator.paths_sampled), plans.num_paths)))
        _write_outputs(stage, rows, metrics)
    print(f"{model_dir} on {split} ({len(rows)} boundaries; plans {plans.label()}): edit distance "
          f"{metrics.edit_distance:.3f} [{metrics.ci_low:.3f}, {metrics.ci_high:.3f}], normalised "
          f"{metrics.normalized:.3f} in {wall_time:.1f}s")
    return metrics


def _check_limits(context_length: int, max_articles: Optional[int], max_boundaries_per_article: Optional[int]) -> None:
    if context_length < 1:
        raise PlanlmError(f"--context_length {context_length} must be >= 1")
    if max_articles is not None and max_articles < 1:
        raise PlanlmError(f"--max_articles {max_articles} must be >= 1")
    if max_boundaries_per_article is not None and max_boundaries_per_article < 1:
        raise PlanlmError(f"--max_boundaries_per_article {max_boundaries_per_article} must be >= 1")


def _continue_boundaries(generator, split_view, boundaries: list[tuple[int, int]], sampling: SamplingConfig,
                         context_length: int, new_tokens: int, embed_fn: Callable[[list[str]], np.ndarray],
                         codebook: np.ndarray) -> tuple[list[dict], int, float]:
    """Generate at every boundary, in order (one sampling generator walks them) -> (rows of per_boundary.csv,
    generated tokens, wall time)."""
    rows, began, generated_tokens = [], time.perf_counter(), 0
    bar = open_bar("continuing boundaries", len(boundaries), "boundaries")
    for article, boundary in boundaries:
        prompt = generator.prompt_from_article(split_view, article, boundary, context_length)
        result = generator.generate(prompt, sampling)
        generated_tokens += len(result.token_ids)
        reference = _reference_text(generator.tokenizer, split_view, article, boundary, new_tokens)
        generated_actions, reference_actions = text_actions([result.text, reference], embed_fn, codebook,
                                                            generator.sentence_splitter)
        distance, normalized = action_edit_distance(generated_actions, reference_actions)
        rows.append({"article": article, "id": split_view.articles[article]["id"], "boundary": boundary,
                     "distance": distance, "normalized": normalized,
                     "generated_actions": " ".join(map(str, generated_actions)),
                     "reference_actions": " ".join(map(str, reference_actions)),
                     "generated_text": result.text, "reference_text": reference})
        bar.advance()
    bar.close()
    return rows, generated_tokens, time.perf_counter() - began


def _reference_text(tokenizer, split_view, article: int, boundary: int, new_tokens: int) -> str:
    """The true continuation: the next ``new_tokens`` tokens of the article from its sentence ``boundary``."""
    tokens = split_view.token_range(article)
    token_sentence = np.asarray(split_view.token_sentence[tokens.start:tokens.stop])
    begin = tokens.start + int(np.searchsorted(token_sentence, split_view.sentence_range(article).start + boundary))
    return tokenizer.decode([int(t) for t in split_view.input_ids[begin:min(begin + new_tokens, tokens.stop)]])


def _distance_summary(rows: list[dict], bootstrap_samples: int, confidence: float, seed: int,
                      sources: list[str]) -> dict:
    """Mean raw and normalised distance over the boundaries, each with its bootstrap interval over the source
    documents ``sources`` (one per row: the boundaries of one document are resampled together)."""
    raw = bootstrap_mean(np.array([r["distance"] for r in rows], float), bootstrap_samples, confidence, seed, sources)
    norm = bootstrap_mean(np.array([r["normalized"] for r in rows], float), bootstrap_samples, confidence, seed,
                          sources)
    return {"edit_distance": raw["mean"], "ci_low": raw["ci_low"], "ci_high": raw["ci_high"],
            "normalized": norm["mean"], "normalized_ci_low": norm["ci_low"], "normalized_ci_high": norm["ci_high"],
            "confidence": confidence, "boundaries": len(rows)}


def _write_outputs(stage: StageDir, rows: list[dict], metrics: EditDistanceMetrics) -> None:
    """per_boundary.csv, metrics.json and, last, the manifest."""
    with open(stage.path / "per_boundary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    write_json(stage.path / "metrics.json", metrics.to_dict())
    stage.finish(metrics=metrics.to_dict())
