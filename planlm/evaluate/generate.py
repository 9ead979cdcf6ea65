"""The ``generate`` command: continue a prompt or a test article's prefix with a planned LM
(``planlm.evaluate.generator``) and show each generated sentence's plan with example sentences of its
actions; also the sentence embedders that generation and ``edit-distance`` use for generated text."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np

from planlm.args import Runtime
from planlm.data.actions import nearest_actions
from planlm.data.artifacts import PreparedDataset
from planlm.data.resources import load_tokenizer
from planlm.errors import PlanlmError
from planlm.evaluate.generator import EmbedFn, GenerationResult, PlannedGenerator, Prompt, SamplingConfig
from planlm.evaluate.loading import load_checked
from planlm.evaluate.outline import AfterOutline, Outline
from planlm.jsonio import write_json
from planlm.models.planner import Planner
from planlm.plans.config import PlanConfig, PlanSettings, evaluation_plans


def encoder_embed_fn(prepared: PreparedDataset) -> EmbedFn:
    """Embed sentences like ``planlm prepare`` did (same encoder, same normalisation); synthetic corpora,
    which have no encoder, get ``synthetic_embed_fn``."""
    if prepared.encoder_name == "synthetic":
        return synthetic_embed_fn(prepared)
    from planlm.data.resources import load_sentence_encoder

    encoder = load_sentence_encoder(prepared.encoder_name)
    normalize = bool(prepared.manifest.get("config", {}).get("embedding", {}).get("normalize", False))

    def embed(texts: list[str]) -> np.ndarray:
        return np.asarray(encoder.encode(list(texts), convert_to_numpy=True, normalize_embeddings=normalize,
                                         show_progress_bar=False), dtype=np.float32)

    return embed


def synthetic_embed_fn(prepared: PreparedDataset, split: str = "train") -> EmbedFn:
    """For synthetic corpora (wording determined by the action): each known word votes for the action
    whose train sentences use it; a sentence embeds as the mean centroid of its words' actions."""
    import re

    data = prepared.split(split)
    codebook = prepared.codebook.numpy()
    votes: dict[str, np.ndarray] = {}
    for sentence in range(data.num_sentences):
        for word in re.findall(r"[a-z]+", data.sentence_text(sentence).lower()):
            votes.setdefault(word, np.zeros(len(codebook)))[int(data.actions[sentence])] += 1
    word_action = {word: int(np.argmax(v)) for word, v in votes.items()}

    def embed(texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), codebook.shape[1]), dtype=np.float32)
        for i, text in enumerate(texts):
            actions = [word_action[w] for w in re.findall(r"[a-z]+", text.lower()) if w in word_action]
            if actions:
                out[i] = codebook[actions].mean(0)
        return out

    return embed


def action_examples(prepared: PreparedDataset, split: str = "train") -> Callable[[int], str]:
    """action -> the sentence of ``split`` nearest its centroid (among the sentences assigned to it)."""
    from planlm.data.actions import nearest_members

    cache: dict = {}

    def example(action: int) -> str:
        if not cache:
            data = prepared.split(split)
            nearest = nearest_members(data.embeddings, np.asarray(data.actions), prepared.codebook.numpy(), 1)
            cache.update({a: data.sentence_text(m[0][0]) if m else "" for a, m in nearest.items()})
        return cache.get(int(action), "")

    return example


def action_prior(prepared: PreparedDataset) -> np.ndarray:
    """(C,) how often each action labels a train sentence: the null plan of plan guidance (what the LM's plans say
    when they say nothing)."""
    return np.bincount(np.asarray(prepared.split("train").actions), minlength=prepared.num_actions).astype(np.float64)


def generate_text(model, tokenizer, prompt: str, *, plans: PlanConfig | None = None, planner=None,
                  embed_fn: EmbedFn | None = None, sampling: SamplingConfig | None = None, seed: int = 0,
                  device: str = "cpu", precision: str = "auto", outline: Outline | list | None = None,
                  after_outline: AfterOutline = "planner", action_prior: np.ndarray | None = None,
                  stop: list[str] | None = None, use_cache: bool = True) -> GenerationResult:
    """Python API: continue ``prompt`` with a PlannedLM (plans from ``planner`` when ``plans`` asks; default none).

    ``outline``: the action ids or plain-word sentences the generated sentences should follow (an ``Outline``,
    or its items with ``after_outline``); sentences need ``embed_fn`` (the corpus's encoder) and the model's
    codebook. Each generated sentence then records its ``requested`` action. ``action_prior``: the action
    frequencies of the null plan that ``sampling.plan_guidance`` contrasts with (``action_prior(prepared)``; None:
    uniform). ``stop``: end once the generated text holds one of these strings. ``use_cache`` False re-runs the
    window every step (the same tokens, slower)."""
    generator = PlannedGenerator(model, tokenizer, plans or PlanConfig(), planner=planner, embed_fn=embed_fn,
                                 device=device, seed=seed, precision=precision, action_prior=action_prior,
                                 use_cache=use_cache)
    if outline is not None and not isinstance(outline, Outline):
        outline = Outline(list(outline), after_outline)
    return generator.generate(generator.prompt_from_text(prompt), sampling, outline=outline, stop=stop)


def build_generator(model_dir: str, prepared_dir: str, split: str, plans: PlanSettings, runtime: Runtime, seed: int,
                    embed_fn: EmbedFn | None = None):
    """Load everything a command needs: (generator, prepared dataset, split view). ``plans`` (a generation command's
    settings, or a whole PlanConfig from Python) overrides the model's own plans field by field."""
    plans = PlanConfig.of(plans)
    if plans.plans_dir:
        raise PlanlmError("--plans.plans_dir: generation plans the text it writes, so it needs the planner; set "
                          "--plans.planner_dir instead (default: the model's)")
    prepared, split_view, model = load_checked(model_dir, prepared_dir, split)
    plans = evaluation_plans(plans, model, model_dir)
    plans.check_source()
    torch_device, precision = runtime.torch_device(), runtime.resolved_precision()
    planner = Planner.for_corpus(plans.planner_dir, prepared, torch_device) if plans.planner_dir else None
    if (Path(model_dir) / "planned_lm.json").is_file():
        tokenizer = model.load_tokenizer(model_dir)
    else:
        tokenizer = load_tokenizer(prepared.tokenizer_name)
    embed_fn = embed_fn or (encoder_embed_fn(prepared) if planner is not None else None)
    splitter = prepared.manifest.get("config", {}).get("sentences", {}).get("splitter", "sentencizer")
    generator = PlannedGenerator(model, tokenizer, plans, planner=planner, embed_fn=embed_fn, split=split_view,
                                 sentence_splitter=splitter, device=torch_device, seed=seed, precision=precision,
                                 action_prior=action_prior(prepared))
    return generator, prepared, split_view


def generate(model_dir: str, prepared_dir: str, prompt: Optional[str] = None, article: Optional[int] = None,
             boundary: int = 1, split: str = "test", sampling: SamplingConfig = SamplingConfig(),
             plans: PlanSettings = PlanSettings(), context_length: int = 128, seed: int = 0,
             out_file: Optional[str] = None, outline: Optional[list[Union[int, str]]] = None,
             after_outline: AfterOutline = "planner",
             runtime: Runtime = Runtime()) -> dict:
    """Generate text with a planned LM, re-planning at every generated sentence end, and show the plans.

    For each generated sentence it prints the sampled action paths and, for each action, the train
    sentence nearest its centroid. With --outline the plans are yours: each generated sentence's plan is the
    outline's next action (every path the outline, its steps past the outline masked), and it prints each
    sentence's requested and realised action (the nearest codebook entry of its embedding).

    Args:
        model_dir: Folder of a finished ``planlm train-lm``.
        prepared_dir: Prepared corpus (encoder, codebook, train sentences for the examples, test articles).
        prompt: Text to continue (or use --article).
        article: Continue this article of --split from its sentence --boundary (the true prefix).
        boundary: With --article: how many of its sentences form the prefix (generation starts the next one).
        split: Split of --article.
        sampling: How tokens are drawn (max_new_tokens, temperature, top_k, top_p; plan_guidance: > 1
            strengthens the plans' steer, e.g. an outline's, against the null plan of the train action frequencies).
        plans: The plans (kind: none, fixed, oracle (needs --article), planner_argmax, planner_sampled; num_paths,
            horizon, temperature, planner_dir); unset fields: the model's own.
        context_length: With --article: prefix tokens at most.
        seed: Seed of token and plan sampling.
        out_file: Also write the result as JSON here.
        outline: The plan, one item per generated sentence: action ids ("[12, 40, 3]") or sentences in plain words
            ('["We ask Congress for money.", "The army is ready."]'), each mapped to its nearest action with the
            corpus's encoder and codebook.
        after_outline: When the outline runs out: planner (the model's own plans take over) or stop.
        runtime: The device and precision of the LM, the adapter and the planner (runtime.device,
            runtime.precision).

    Returns:
        The result: prompt, text, sentences with their plans, planner_calls, rollbacks.
    """
    if (prompt is None) == (article is None):
        raise PlanlmError("give exactly one of --prompt TEXT or --article N (a test article's prefix)")
    plan = None if outline is None else Outline(list(outline), after_outline)  # one-line errors before loading
    generator, prepared, split_view = build_generator(model_dir, prepared_dir, split, plans, runtime, seed)
    if plan is not None and generator.embed_fn is None:  # outline sentences and the realised actions need it
        generator.embed_fn = encoder_embed_fn(prepared)
    start = _start(generator, split_view, prompt, article, boundary, context_length, plan is not None)
    result = generator.generate(start, sampling, outline=plan)
    _add_action_examples(result, prepared)
    if plan is not None:
        _add_realised_actions(result, generator.embed_fn, prepared)
    print(result.format())
    out = asdict(result)
    if out_file:
        write_json(out_file, out)
    return out



def _start(generator: PlannedGenerator, split_view, prompt: Optional[str], article: Optional[int], boundary: int,
           context_length: int, outlined: bool = False) -> Prompt:
    """The prompt of the command: a test article's prefix or free text (under an outline even for a kind that reads
    the future: it reads the outline)."""
    if article is not None:
        if not 0 <= article < split_view.num_articles:
            raise PlanlmError(f"--article {article}: {split_view.path} has articles 0..{split_view.num_articles - 1}")
        return generator.prompt_from_article(split_view, article, boundary, context_length)
    if generator.plans.plan_kind.reads_future and not outlined:
        raise PlanlmError(f"--plans.kind {generator.plans.kind} needs --article (the true future of a test article)")
    return generator.prompt_from_text(prompt)


def _add_action_examples(result: GenerationResult, prepared: PreparedDataset) -> None:
    """Each plan's actions, each with the train sentence nearest its centroid (``plan.actions``)."""
    examples = action_examples(prepared)
    for sentence in result.sentences:
        if sentence["plan"]:
            used = sorted({a for path, valid in zip(sentence["plan"]["action_paths"], sentence["plan"]["path_mask"])
                           for a, ok in zip(path, valid) if ok})
            sentence["plan"]["actions"] = {int(a): examples(a) for a in used}


def _add_realised_actions(result: GenerationResult, embed_fn: EmbedFn, prepared: PreparedDataset) -> None:
    """Each outlined sentence's realised action (its embedding's nearest codebook entry) and, for it and the
    requested one, a few words of the train sentence nearest that action's centroid."""
    outlined = [s for s in result.sentences if s.get("requested") is not None]
    if not outlined:
        return
    realised = nearest_actions(embed_fn([s["text"].strip() for s in outlined]), prepared.codebook.numpy())
    examples = action_examples(prepared)
    for sentence, action in zip(outlined, realised):
        sentence["realised"] = int(action)
        for which in ("requested", "realised"):
            sentence[f"{which}_example"] = few_words(examples(sentence[which]))


def few_words(text: str, words: int = 8) -> str:
    """The first ``words`` words of ``text`` (with "..." when there are more)."""
    parts = text.split()
    return " ".join(parts[:words]) + (" ..." if len(parts) > words else "")


__all__ = ["generate", "generate_text", "build_generator", "action_prior", "encoder_embed_fn", "synthetic_embed_fn", "action_examples"]
