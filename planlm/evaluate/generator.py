"""Planned generation: sample text from a planned LM, re-planning whenever a sentence ends.

``PlannedGenerator`` keeps one document: complete sentences (their embeddings are the planner's
context), the open sentence being written, the token ids and, for every position, the plan whose
vector conditions that input token. The planner is called

- once for the prompt: one plan per prompt sentence, from the sentences before it (for a test
  article's prefix: the true sentences and their prepared embeddings);
- again whenever the sentence splitter (the prepared corpus's, ``split_sentences``) sees one more
  complete sentence in the open text (the number of sentences grows), with the generated sentences
  embedded by the corpus's encoder (or an injected ``embed_fn``).

Alignment (``planlm.data.artifacts``, as in training): the last token of a sentence already carries the next
sentence's plan, because it is the position that predicts the next sentence's first token. The
splitter can only see that a sentence ended once the next one has started, so on re-planning the
generator *rolls back*: it drops the tokens of the new sentence, crops the KV cache to before the
previous sentence's last token, feeds that token again with the new plan and samples on. Nothing
already kept changes its conditioning silently: the only position whose plan changes is re-run.
A rollback happens at most once per position (a later re-plan for the same spot only conditions the
following tokens), so generation always progresses. The splitter can also take a sentence end back
("red." + "." reads as one sentence "red.."): the next tokens then return to the open sentence's
plan, and the positions already fed with the later plan keep it and are listed in
``GenerationResult.unaligned_positions`` (``token_plan_sentence`` records every position's plan).

An outline (``planlm.evaluate.outline``) replaces the plans of the sentences it covers: each is the oracle
kind's plan over the document the outline describes (the actions before it, then the outline's), every path the
outline; the other boundaries keep the generator's own plans (a kind that reads the future, oracle, reads it from
that document everywhere). With ``max_sentences`` (or an outline that ends in ``stop``) generation ends once that
many sentences are written: the tokens of the next one are dropped.

Plan guidance (``SamplingConfig.plan_guidance`` w != 1; docs/method.md) runs the LM on two rows, the plans and the
null plan (``null_vector``: the action prior in expectation), and draws each token from
l_null + w (l_plan - l_null); the KV cache holds both rows, and a rollback crops both.

With ``use_cache`` (the default) the KV cache is extended token by token; without it,
every step re-runs the whole window (the reference the cache is tested against). When the sequence
outgrows the LM's position limit, the window slides by one token per step, so that every token is predicted
from the last ``max_positions`` tokens, all the LM can read; past the limit each step
re-runs the whole window, since the positions of the kept tokens move.

Letters: K paths, T horizon, E sentence-embedding width, D LM width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch

from planlm.data.actions import nearest_actions
from planlm.data.artifacts import PreparedSplit
from planlm.data.resources import split_sentences
from planlm.device import autocast
from planlm.errors import PlanlmError
from planlm.evaluate.outline import Outline, OutlineDocument
from planlm.models.planned_lm import output_cache
from planlm.plans.config import PlanConfig
from planlm.plans.contexts import Boundaries
from planlm.plans.registry import make_plans

EmbedFn = Callable[[list[str]], np.ndarray]
# Part of every edit-distance folder's reuse key: raised when the same inputs generate other text, so that a
# finished folder from older code is rebuilt. 2: the window slides by one token at the position limit (was by half).
GENERATION_VERSION = 2


@dataclass
class ProtocolSampling:
    """How tokens are drawn when a metric fixes the protocol: plain sampling over the whole vocabulary (the edit
    distance's protocol has no top_k nor top_p)."""

    max_new_tokens: int = 128
    """Tokens to generate."""
    temperature: float = 1.0
    """Softmax temperature of the LM (0 = greedy)."""
    plan_guidance: float = 1.0
    """Plan guidance w (beyond the paper: classifier-free guidance with the plan as the condition). Each token is
    drawn from l_null + w (l_plan - l_null), where l_null are the LM's logits under the null plan (every step the
    action prior, in expectation: a plan that tells nothing). 1: the LM as trained; > 1 strengthens what the plan
    changes (an outline's steer); 0: the null plan alone. Doubles the LM's batch; needs a model that reads plans."""

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise PlanlmError(f"--sampling.max_new_tokens {self.max_new_tokens} must be >= 1")
        if self.temperature < 0:
            raise PlanlmError(f"--sampling.temperature {self.temperature} must be >= 0 (0 = greedy)")
        self.plan_guidance = float(self.plan_guidance)  # `--plan_guidance 3` and plan_guidance=3.0: one reuse key
        if self.plan_guidance < 0:
            raise PlanlmError(f"--sampling.plan_guidance {self.plan_guidance} must be >= 0 (1 = off)")

    def sampling(self) -> "SamplingConfig":
        """These settings as the generator takes them (no top_k nor top_p)."""
        return SamplingConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                              plan_guidance=self.plan_guidance)


@dataclass
class SamplingConfig(ProtocolSampling):
    """How tokens are drawn: the protocol's settings, and optionally the most likely tokens only."""

    top_k: Optional[int] = None
    """Keep only the k most likely tokens (None: off)."""
    top_p: Optional[float] = None
    """Nucleus sampling: keep the smallest set of tokens with this much probability (None: off)."""

    def __post_init__(self):
        super().__post_init__()
        if self.top_k is not None and self.top_k < 1:
            raise PlanlmError(f"--sampling.top_k {self.top_k} must be >= 1")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise PlanlmError(f"--sampling.top_p {self.top_p} must be in (0, 1]")

    def sampling(self) -> "SamplingConfig":
        return self

    @property
    def guided(self) -> bool:
        return self.plan_guidance != 1

    def reuse_key(self) -> dict:
        """These settings as a stage's reuse key holds them: plan_guidance only when set (older keys lack it)."""
        key = asdict(self)
        if not self.guided:
            del key["plan_guidance"]
        return key


@dataclass
class PlanRecord:
    """One planner call for one boundary of the document."""

    sentence: int
    """Index (in the document) of the sentence this plan is for."""
    context_sentences: int
    """How many complete sentences the planner saw."""
    action_paths: list
    """(K, T) sampled action ids (plans in expectation: the most likely action of each step)."""
    path_mask: list
    """(K, T) which steps are valid."""


@dataclass
class Prompt:
    """What generation starts from: tokens, complete sentences and the plans of the prompt's tokens."""

    input_ids: list[int]
    text_before_open: str
    """Prompt text of the complete sentences (shown, not re-split)."""
    open_text: str
    """Text of the prompt's open (unfinished) sentence; "" at a sentence boundary."""
    context_embeds: np.ndarray
    """(S, E) embeddings of the complete sentences of the document (the planner's context)."""
    token_sentence: list[int]
    """Document sentence whose plan conditions each prompt token."""
    sentence_contexts: dict
    """document sentence -> (S_j, E) planner context for the plans of the prompt's tokens."""
    oracle_sentences: Optional[list[int]] = None
    """Split-global sentence of each document sentence (article prefixes; for oracle plans)."""


@dataclass
class GenerationResult:
    prompt: str
    text: str
    """The generated continuation."""
    sentences: list = field(default_factory=list)
    """Generated sentences with their plan: {text, complete, plan: {action_paths, actions: {id: nearest sentence}}}."""
    planner_calls: int = 0
    rollbacks: int = 0
    lm_calls: int = 0
    token_ids: list = field(default_factory=list)
    token_logprobs: list = field(default_factory=list)
    """log p(token) of every generated token under the distribution it was drawn from, before temperature, top-k and
    top-p (the LM's; with plan guidance, the guided one)."""
    token_plan_sentence: list = field(default_factory=list)
    """For every input position (prompt + generated): the document sentence whose plan conditioned it."""
    unaligned_positions: list = field(default_factory=list)
    """Positions fed with the next sentence's plan before the splitter merged that sentence end away."""

    def format(self) -> str:
        lines = [f"PROMPT: {self.prompt.strip()}", ""]
        for i, sentence in enumerate(self.sentences):
            lines.append(f"[{i + 1}] {sentence['text'].strip()}")
            plan = sentence.get("plan")
            if sentence.get("requested") is not None:  # an outlined sentence: its plan is the outline
                lines.append(f"      requested {_action_text(sentence, 'requested')}; "
                             f"realised {_action_text(sentence, 'realised')}")
            elif plan:
                for k, path in enumerate(plan["action_paths"]):
                    lines.append(f"      path {k + 1}: " + " -> ".join(str(a) for a in path))
                for action, example in plan.get("actions", {}).items():
                    lines.append(f"      action {action}: {example!r}")
        lines.append(f"({self.planner_calls} planner calls, {self.rollbacks} rollbacks, {len(self.token_ids)} tokens)")
        return "\n".join(lines)



@dataclass
class GenerationState:
    """What ``PlannedGenerator.generate`` changes while it writes one document. L positions: the prompt's
    tokens, then the generated ones; P plans made so far."""

    ids: list[int]
    """(L,) token ids."""
    prompt_len: int
    """Tokens of the prompt: ids[prompt_len:] are generated."""
    position_plan: list[int] = field(default_factory=list)
    """(L,) index into ``records`` of the plan whose vector conditions each input position."""
    records: list[PlanRecord] = field(default_factory=list)
    """(P,) every plan made so far."""
    vectors: list[torch.Tensor] = field(default_factory=list)
    """(P,) of (D,) the plan vectors of ``records`` (empty without conditioning)."""
    logprobs: list[float] = field(default_factory=list)
    """(L - prompt_len,) log p of every generated token."""
    cache: Any = None
    """The LM's KV cache of the positions [window_start, window_start + cached)."""
    cached: int = 0
    window_start: int = 0
    """First position the LM reads (the window slides at the LM's position limit)."""
    current_plan: int = 0
    """Plan of the open sentence: it conditions the next position fed."""
    first_open: int = 0
    """Document index of the first sentence of the open text (the prompt's open sentence)."""
    plan_of_sentence: dict[int, int] = field(default_factory=dict)
    """Document sentence of the open text -> its plan."""
    num_complete: int = 0
    """Complete sentences the splitter sees in the open text."""
    last_rollback: int = -1
    """Position re-fed by the last rollback (a position is rolled back to at most once)."""
    rollbacks: int = 0
    unaligned: set[int] = field(default_factory=set)
    """Positions fed with a later sentence's plan before the splitter merged that sentence end away."""
    embed_cache: dict[str, np.ndarray] = field(default_factory=dict)
    """(E,) embedding of each generated sentence, by its text."""
    max_sentences: Optional[int] = None
    """Stop once this many sentences of the open text are complete (None: at max_new_tokens)."""
    stopped: bool = False
    """Generation ended at ``max_sentences``: the last sentence kept is complete."""

    @property
    def generated(self) -> list[int]:
        return self.ids[self.prompt_len:]


class PlannedGenerator:
    """Generates from a PlannedLM with re-planning at generated sentence ends (see the module docstring)."""

    def __init__(self, model, tokenizer, plans: PlanConfig, *, planner=None,
                 embed_fn: EmbedFn | None = None, split: PreparedSplit | None = None,
                 sentence_splitter: str = "sentencizer", device: str | torch.device = "cpu", seed: int = 0,
                 precision: str = "auto", action_prior: np.ndarray | None = None, use_cache: bool = True):
        self.model = model.to(device).eval()
        self.use_cache = use_cache  # False: re-run the window every step (same result, slower)
        self.precision = precision  # autocast of the LM, the adapter and the planner (auto: bf16 on CUDA)
        self.tokenizer = tokenizer
        self.plans = plans.resolve()  # a hand-built config: its unset fields get the defaults
        kind = self.plans.plan_kind
        self.planner = planner.to(device).eval() if planner is not None and kind.uses_planner else None
        self.embed_fn = embed_fn
        self.split = split
        self.sentence_splitter = sentence_splitter
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        if kind.uses_planner and planner is None:
            raise PlanlmError(f"plans kind {self.plans.kind} needs a planner (set --plans.planner_dir)")
        config = model.lm.config
        self.max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 1024)
        self.planner_calls = 0
        self.lm_calls = 0
        self.paths_sampled: list[int] = []  # paths per planned boundary (the path policy's counts)
        self.document: Optional[OutlineDocument] = None  # the outline of the generation under way
        self.action_prior = action_prior  # (C,) action frequencies of the null plan (plan guidance); None: uniform
        self._null_vector: torch.Tensor | None = None

    # ------------------------------------------------------------------------------ prompts
    def prompt_from_text(self, text: str, history_embeds: np.ndarray | None = None) -> Prompt:
        """A free prompt: its sentences (all but the last complete) embedded with ``embed_fn``."""
        ids = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        input_ids, offsets = list(ids["input_ids"]), np.asarray(ids["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        if not input_ids:
            raise PlanlmError("--prompt is empty: give some text (or --article for a test article's prefix)")
        spans = split_sentences([text], self.sentence_splitter)[0] or [(0, len(text))]
        complete = spans[:-1]
        width = self.context_width()
        history = np.zeros((0, width), np.float32) if history_embeds is None else np.asarray(history_embeds, np.float32)
        embeds = self._embed([text[a:b] for a, b in complete]) if complete else np.zeros((0, width), np.float32)
        context = np.concatenate([history, embeds]) if len(embeds) else history
        from planlm.data.tokens import assign_tokens_to_sentences

        local = assign_tokens_to_sentences(offsets, np.asarray(spans, dtype=np.int64))  # (L,) prompt sentence
        local = _plan_alignment(local)
        first = len(history)
        token_sentence = [first + int(j) for j in local]
        contexts = {first + j: context[:first + j] for j in range(len(spans))}
        return Prompt(input_ids, text[:spans[-1][0]], text[spans[-1][0]:], context, token_sentence, contexts)

    def prompt_from_article(self, split: PreparedSplit, article: int, boundary: int, context_length: int = 128) -> Prompt:
        """The <= context_length tokens of ``article`` before its sentence ``boundary`` (article-local),
        planned from the true sentences and their prepared embeddings."""
        sentences = split.sentence_range(article)
        if not 1 <= boundary <= len(sentences):
            raise PlanlmError(f"{split.path}: article {article} has {len(sentences)} sentences; --boundary must be in "
                              f"[1, {len(sentences)}] (the number of true sentences before the generated text)")
        s = sentences.start + boundary
        tokens = split.token_range(article)
        token_sentence = np.asarray(split.token_sentence[tokens.start:tokens.stop])
        begin = tokens.start + int(np.searchsorted(token_sentence, s))  # first token of sentence s
        start = max(tokens.start, begin - context_length)
        if begin == start:
            raise PlanlmError(f"{split.path}: article {article} has no token before sentence {boundary}")
        plan_sentence = np.asarray(split.token_plan_sentence[start:begin]) - sentences.start  # document-local
        context = np.asarray(split.embeddings[sentences.start:s], dtype=np.float32)  # (S, E) true embeddings
        contexts = {int(j): context[:int(j)] for j in np.unique(plan_sentence)}
        text = split.articles[article]["text"]
        first_char = int(split.sentence_spans[int(split.token_sentence[start])][0])
        prompt_text = text[:int(split.sentence_spans[s - 1][1])]
        return Prompt([int(t) for t in split.input_ids[start:begin]], prompt_text[first_char:], "",
                      context, [int(j) for j in plan_sentence], contexts, list(sentences))

    def context_width(self) -> int:
        if self.planner is not None:
            return self.planner.config.embedding_dim
        if self.model.codebook is not None:
            return int(self.model.codebook.shape[1])
        return 1

    def _embed(self, texts: list[str]) -> np.ndarray:
        if self.planner is None and self.embed_fn is None:
            return np.zeros((len(texts), self.context_width()), np.float32)  # the planner is not used
        if self.embed_fn is None:
            raise PlanlmError("generation needs an embed_fn for the generated sentences (the corpus's encoder)")
        return np.asarray(self.embed_fn(list(texts)), dtype=np.float32)

    # ------------------------------------------------------------------------------ planning
    @torch.no_grad()
    def plan(self, contexts: list[np.ndarray], sentences: list[int], oracle: list[int] | None = None):
        """One planner call for several boundaries -> action_paths (B, K, T), path_mask (B, K, T), vectors (B, D)
        (plans in expectation: the most likely action of each step as action_paths). Under an outline its
        sentences get the oracle kind's plans over the outline's document, the others the generator's own."""
        if not self.plans.has_plans:
            return None, None, None
        document = self.document
        if document is None:
            return self._plan_with(self.plans, self._boundaries(contexts, sentences, oracle))
        outlined = document.outlined(sentences) | self.plans.plan_kind.reads_future  # (B,)
        planned = []
        rows = np.flatnonzero(outlined)  # the outline's: the oracle kind over the outline's document
        if len(rows):
            planned.append((rows, self._plan_with(self._outline_plans, document.boundaries(
                [sentences[i] for i in rows]))))
        rows = np.flatnonzero(~outlined)  # the others: the generator's own plans
        if len(rows):
            planned.append((rows, self._plan_with(self.plans, self._boundaries(
                [contexts[i] for i in rows], [sentences[i] for i in rows], oracle))))
        return _merge_rows(planned, len(sentences))

    def _plan_with(self, plans: PlanConfig, boundaries: Boundaries):
        """The plans of ``boundaries`` under ``plans`` -> action_paths (B, K, T), path_mask (B, K, T), vectors
        (B, D)."""
        with autocast(self.device, self.precision):
            made = make_plans(boundaries, plans, self.generator, self.planner).to(self.device)
            vectors = self.model.plan_vectors(*made).float()  # (B, D)
        if self.planner is not None and plans.plan_kind.uses_planner:
            self.planner_calls += 1
        if plans.plan_kind.samples_paths:
            self.paths_sampled += made.path_mask[:, :, 0].sum(1).tolist()  # the path policy's counts
        paths = made.action_paths if made.action_probs is None else made.action_paths[..., 0]  # (B, K, T)
        return paths, made.path_mask, vectors

    @torch.no_grad()
    def null_vector(self) -> torch.Tensor:
        """(D,) the plan vector of the null plan that plan guidance contrasts with: every path and step the action
        prior (``action_prior``, else uniform) in expectation, so it tells the LM nothing about the next sentence."""
        if self._null_vector is None:
            num_actions = self.model.config.num_actions
            prior = np.ones(num_actions) if self.action_prior is None else np.asarray(self.action_prior, np.float64)
            if prior.shape != (num_actions,) or prior.min() < 0 or prior.sum() <= 0:
                raise PlanlmError(f"action_prior: {num_actions} non-negative frequencies with a positive sum needed "
                                  f"(got shape {prior.shape})")
            shape = (1, self.plans.num_paths, self.plans.horizon, num_actions)  # (1, K, T, C)
            paths = torch.arange(num_actions, device=self.device).expand(shape).contiguous()
            probs = torch.as_tensor(prior / prior.sum(), dtype=torch.float32, device=self.device).expand(shape)
            with autocast(self.device, self.precision):
                self._null_vector = self.model.plan_vectors(paths, None, probs.contiguous()).float()[0]  # (D,)
        return self._null_vector

    @property
    def _outline_plans(self) -> PlanConfig:
        """The plans of outlined sentences: the oracle path of the outline's document, with the generator's K and T."""
        return PlanConfig(kind="oracle", num_paths=self.plans.num_paths, horizon=self.plans.horizon).resolve()

    def outline_document(self, prompt: Prompt, outline: Outline) -> OutlineDocument:
        """The document ``outline`` describes after ``prompt``: the actions of the prompt's complete sentences (the
        prepared ones of an article prefix, else their embeddings' nearest actions), then the outline's."""
        if not self.plans.has_plans or self.model.adapter is None:
            raise PlanlmError("this model reads no plans (plans kind none, no adapter): an outline cannot steer it; "
                              "use a model trained with plans")
        num_actions = self.model.config.num_actions
        codebook = None if self.model.codebook is None else self.model.codebook.cpu().numpy()
        actions = outline.actions(num_actions, self.embed_fn, codebook)
        before = len(prompt.context_embeds)
        if prompt.oracle_sentences is not None and self.split is not None:
            prefix = np.asarray(self.split.actions[prompt.oracle_sentences[:before]], dtype=np.int64)
        else:  # free text; a prompt whose last sentence looks finished: the outline starts after it
            embeds = [prompt.context_embeds] + ([self._embed([prompt.open_text.strip()])]
                                                if _finished(prompt.open_text) else [])
            embeds = np.concatenate(embeds)
            prefix = (nearest_actions(embeds, codebook) if len(embeds) and self.embed_fn is not None
                      and codebook is not None else np.zeros(len(embeds), np.int64))  # read only by oracle models
        return OutlineDocument.of(prefix, actions, outline.then, num_actions)

    def _boundaries(self, contexts: list[np.ndarray], sentences: list[int], oracle: list[int] | None) -> Boundaries:
        """The boundaries of one planner call: the planner's contexts; for an article prefix (``oracle``: the
        split-global sentence of each document sentence) their place in the split, the true future known only
        inside the article."""
        num_actions = self.model.config.num_actions
        if self.planner is not None:
            return Boundaries.of_contexts(contexts, num_actions, self.planner)
        if oracle is None:
            if self.plans.plan_kind.reads_future:
                raise PlanlmError(f"{self.plans.kind} plans need a test article's prefix (prompt_from_article / "
                                  f"--article)")
            return Boundaries(len(contexts), num_actions)
        known = np.asarray([s < len(oracle) for s in sentences])
        global_sentences = np.asarray([oracle[s] if ok else oracle[-1] for s, ok in zip(sentences, known)])
        return Boundaries(len(contexts), num_actions, split=self.split, sentences=global_sentences, known=known)

    # ------------------------------------------------------------------------------ decoding
    def _sample(self, logits: torch.Tensor, sampling: SamplingConfig) -> int:
        logits = logits.float()[None]  # (1, V)
        if sampling.temperature == 0:
            return int(logits.argmax(-1))
        from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        logits = TemperatureLogitsWarper(sampling.temperature)(None, logits)
        if sampling.top_k is not None:
            logits = TopKLogitsWarper(sampling.top_k)(None, logits)
        if sampling.top_p is not None:
            logits = TopPLogitsWarper(sampling.top_p)(None, logits)
        probs = torch.softmax(logits, -1)
        return int(torch.multinomial(probs, 1, generator=self.generator))

    @torch.no_grad()
    def _next_logits(self, state: GenerationState, use_cache: bool, guidance: float = 1.0) -> torch.Tensor:
        """(V,) logits of the next token; with plan guidance w != 1, l_null + w (l_plan - l_null) from a batch of two
        rows (the plans, the null plan; the KV cache holds both)."""
        ids, position_plan = state.ids, state.position_plan
        if len(ids) - state.window_start > self.max_positions:  # slide by one: the last max_positions tokens
            state.window_start = len(ids) - self.max_positions
            state.cache, state.cached = None, 0  # absolute positions moved: the cache no longer applies
        begin = state.window_start + (state.cached if use_cache else 0)
        input_ids = torch.tensor(ids[begin:], device=self.device)[None]  # (1, L)
        kwargs = {}
        guided = guidance != 1 and bool(state.vectors)
        if state.vectors:
            table = torch.stack(state.vectors)  # (P, D) every plan made so far
            kwargs["plan_embeds"] = table[torch.tensor(position_plan[begin:], device=self.device)][None]  # (1, L, D)
            if guided:  # row 1: the null plan at every position
                kwargs["plan_embeds"] = torch.cat([kwargs["plan_embeds"],
                                                   self.null_vector().expand_as(kwargs["plan_embeds"])])  # (2, L, D)
                input_ids = input_ids.expand(2, -1)  # (2, L)
        self.lm_calls += 1
        with autocast(self.device, self.precision):
            if use_cache:
                out = self.model(input_ids=input_ids, cache=state.cache, use_cache=True, logits_to_keep=1, **kwargs)
                state.cache, state.cached = output_cache(out), len(ids) - state.window_start
            else:
                out = self.model(input_ids=input_ids, use_cache=False, logits_to_keep=1, **kwargs)
        logits = out.logits[:, -1].float()  # (1 or 2, V)
        return logits[1] + guidance * (logits[0] - logits[1]) if guided else logits[0]

    def _add_plans(self, state: GenerationState, paths, mask, vectors, sentences: list[int],
                   contexts: list[np.ndarray]) -> list[int]:
        ids = []
        for i, sentence in enumerate(sentences):
            if vectors is not None:
                state.vectors.append(vectors[i])
            state.records.append(PlanRecord(sentence, len(contexts[i]),
                                            paths[i].tolist() if paths is not None else [],
                                            mask[i].tolist() if mask is not None else []))
            ids.append(len(state.records) - 1)
        return ids

    @torch.no_grad()
    def generate(self, prompt: Prompt, sampling: SamplingConfig | None = None, outline: Outline | None = None,
                 max_sentences: int | None = None, stop: list[str] | None = None) -> GenerationResult:
        """Continue ``prompt``; ``outline``: the actions its sentences should take (``planlm.evaluate.outline``);
        ``max_sentences``: stop once that many sentences are written (an outline that ends in stop: its length);
        ``stop``: stop once the generated text holds one of these strings (lm-eval's ``until``)."""
        sampling = sampling or SamplingConfig()
        self.planner_calls = self.lm_calls = 0
        if self.plans.plan_kind.reads_future and outline is None and (self.split is None or
                                                                      prompt.oracle_sentences is None):
            raise PlanlmError(f"{self.plans.kind} plans in generation need a test article's prefix (set --article) "
                              f"or an outline (--outline)")
        self.document = None if outline is None else self.outline_document(prompt, outline)
        if outline is not None and outline.then == "stop":  # the sentences before the outline count too
            outlined = self.document.first - len(prompt.context_embeds) + len(outline)
            max_sentences = outlined if max_sentences is None else min(max_sentences, outlined)
        if max_sentences is not None and max_sentences < 1:
            raise PlanlmError(f"max_sentences {max_sentences} must be >= 1")
        if sampling.guided and (not self.plans.has_plans or self.model.adapter is None):
            raise PlanlmError(f"--sampling.plan_guidance {sampling.plan_guidance}: this model reads no plans (plans "
                              f"kind none), so there is nothing to guide; leave it at 1")
        try:
            return self._generate(prompt, sampling, max_sentences, stop or [])
        finally:
            self.document = None

    def _generate(self, prompt: Prompt, sampling: SamplingConfig, max_sentences: int | None,
                  stop: list[str]) -> GenerationResult:
        state = self._start(prompt)
        state.max_sentences = max_sentences
        steps = 0
        while (len(state.generated) < sampling.max_new_tokens and steps < 4 * sampling.max_new_tokens
               and not state.stopped):
            steps += 1
            self._step(state, prompt, sampling)
            if stop and any(string in self.tokenizer.decode(state.generated) for string in stop):
                break
        return self._result(state, prompt)

    def _start(self, prompt: Prompt) -> GenerationState:
        """Plans of the prompt's tokens (one batched planner call) and of the open sentence."""
        state = GenerationState(ids=list(prompt.input_ids), prompt_len=len(prompt.input_ids))
        prompt_sentences = sorted(set(prompt.token_sentence))
        contexts = [prompt.sentence_contexts[j] for j in prompt_sentences]
        paths, mask, vectors = self.plan(contexts, prompt_sentences, prompt.oracle_sentences)
        plan_ids = dict(zip(prompt_sentences, self._add_plans(state, paths, mask, vectors, prompt_sentences, contexts)))
        state.position_plan = [plan_ids[j] for j in prompt.token_sentence]
        doc_context = prompt.context_embeds  # (S, E) complete sentences
        open_sentence = len(doc_context)  # document index of the sentence being written
        if open_sentence in plan_ids:
            state.current_plan = plan_ids[open_sentence]
        else:
            paths, mask, vectors = self.plan([doc_context], [open_sentence], prompt.oracle_sentences)
            state.current_plan = self._add_plans(state, paths, mask, vectors, [open_sentence], [doc_context])[0]
        state.plan_of_sentence = {open_sentence: state.current_plan}
        state.first_open = open_sentence
        return state

    def _step(self, state: GenerationState, prompt: Prompt, sampling: SamplingConfig) -> None:
        """Sample one token, then follow the splitter: re-plan when a sentence ended, step back when it merged."""
        logits = self._next_logits(state, self.use_cache, sampling.plan_guidance)  # (V,)
        token = self._sample(logits, sampling)
        state.logprobs.append(float(torch.log_softmax(logits.float(), -1)[token]))
        state.ids.append(token)
        state.position_plan.append(state.current_plan)
        open_text = prompt.open_text + self.tokenizer.decode(state.generated)
        complete = split_sentences([open_text], self.sentence_splitter)[0][:-1]
        if len(complete) < state.num_complete:
            self._merged(state, len(complete))
        elif len(complete) > state.num_complete:
            self._replan(state, prompt, open_text, complete)

    def _merged(self, state: GenerationState, num_complete: int) -> None:
        """The splitter merged sentences again (e.g. "red." + "." = "red.."): the open sentence is an earlier
        one, so its plan conditions the next tokens. Positions already fed with the later plan keep it (they
        are reported as unaligned, not silently re-conditioned)."""
        state.num_complete = num_complete
        state.current_plan = state.plan_of_sentence[state.first_open + num_complete]
        state.position_plan[-1] = state.current_plan
        fed = state.position_plan[:-1]
        state.unaligned.update(p for p in range(max(state.last_rollback - 1, state.prompt_len - 1), len(fed))
                               if state.records[fed[p]].sentence > state.first_open + num_complete)

    def _replan(self, state: GenerationState, prompt: Prompt, open_text: str, complete: list) -> None:
        """One more complete sentence: re-plan the new open sentence from every complete one (or, with
        ``max_sentences`` complete, drop the new sentence's tokens and stop)."""
        state.num_complete = len(complete)
        if state.max_sentences is not None and len(complete) >= state.max_sentences:
            boundary_char = complete[state.max_sentences - 1][1] - len(prompt.open_text)
            return self._stop(state, state.prompt_len + _first_token_after(self.tokenizer, state.generated,
                                                                            boundary_char))
        complete_texts = [open_text[a:b] for a, b in complete]
        new = [t for t in complete_texts if t not in state.embed_cache]
        if new:
            state.embed_cache.update(zip(new, self._embed(new)))
        context = np.concatenate([prompt.context_embeds] + [state.embed_cache[t][None] for t in complete_texts])
        open_sentence = len(context)
        paths, mask, vectors = self.plan([context], [open_sentence], prompt.oracle_sentences)
        state.current_plan = self._add_plans(state, paths, mask, vectors, [open_sentence], [context])[0]
        state.plan_of_sentence[open_sentence] = state.current_plan
        # First generated token of the new sentence: the first whose last character lies after the
        # end of the last complete sentence (as in planlm.data.tokens).
        boundary_char = complete[-1][1] - len(prompt.open_text)
        first_new = state.prompt_len + _first_token_after(self.tokenizer, state.generated, boundary_char)
        if state.prompt_len <= first_new < len(state.ids) and first_new > state.last_rollback:
            self._roll_back(state, first_new)
        else:
            state.position_plan[-1] = state.current_plan  # not fed yet: it gets the new plan

    def _stop(self, state: GenerationState, first_new: int) -> None:
        """The last sentence asked for is complete: keep the tokens before ``first_new`` (the next sentence's first)."""
        first_new = max(first_new, state.prompt_len + 1)  # a token that holds both the end and the next start stays
        del state.ids[first_new:], state.position_plan[first_new:], state.logprobs[first_new - state.prompt_len:]
        state.stopped = True

    def _roll_back(self, state: GenerationState, first_new: int) -> None:
        """Drop the new sentence's tokens and re-feed the previous sentence's last token with the new plan."""
        state.rollbacks += 1
        state.last_rollback = first_new
        del state.ids[first_new:], state.position_plan[first_new:]
        del state.logprobs[first_new - state.prompt_len:]
        state.position_plan[first_new - 1] = state.current_plan  # the previous sentence's last token
        keep = first_new - 1 - state.window_start
        if state.cache is not None and keep > 0:
            if state.cached > keep:  # a negative crop removes tokens in every transformers version
                state.cache.crop(keep - state.cached)
            state.cached = keep
        else:
            state.cache, state.cached = None, 0

    def _result(self, state: GenerationState, prompt: Prompt) -> GenerationResult:
        generated = state.generated
        open_text = prompt.open_text + self.tokenizer.decode(generated)
        spans = split_sentences([open_text], self.sentence_splitter)[0]
        sentences = []
        for j, (a, b) in enumerate(spans):
            record = state.records[state.plan_of_sentence.get(state.first_open + j, state.current_plan)]
            sentences.append({"text": open_text[a:b], "complete": j < len(spans) - 1 or state.stopped,
                              "plan": {"action_paths": record.action_paths, "path_mask": record.path_mask,
                                       "context_sentences": record.context_sentences}
                              if record.action_paths else None})
            if self.document is not None:
                sentences[-1]["requested"] = self.document.requested(state.first_open + j)
        return GenerationResult(prompt=prompt.text_before_open + prompt.open_text,
                                text=self.tokenizer.decode(generated), sentences=sentences,
                                planner_calls=self.planner_calls, rollbacks=state.rollbacks, lm_calls=self.lm_calls,
                                token_ids=generated, token_logprobs=state.logprobs,
                                token_plan_sentence=[state.records[p].sentence for p in state.position_plan],
                                unaligned_positions=sorted(p for p in state.unaligned if p < len(state.ids)))


def _finished(open_text: str) -> bool:
    """Whether a prompt's last sentence looks finished (ends in . ! or ?, maybe closing quotes or brackets)."""
    import re

    return bool(re.search(r"[.!?][\"')\]]*\s*$", open_text))


def _action_text(sentence: dict, which: str) -> str:
    """``12 ("a few words of its example")`` for a sentence's requested or realised action."""
    action = sentence.get(which)
    example = sentence.get(f"{which}_example")
    return "?" if action is None else f"{action}" + (f' ("{example}")' if example else "")


def _merge_rows(parts: list[tuple[np.ndarray, tuple]], size: int):
    """Plans of disjoint row sets, [(rows (B_i,), (paths, mask, vectors))], as one batch of ``size`` rows."""
    merged = []
    for field_index in range(3):
        first = parts[0][1][field_index]
        out = first.new_zeros((size, *first.shape[1:]))
        for rows, planned in parts:
            out[torch.from_numpy(rows).to(out.device)] = planned[field_index].to(out.dtype)
        merged.append(out)
    return tuple(merged)


def _plan_alignment(local_sentence: np.ndarray) -> np.ndarray:
    """The alignment of ``planlm.data.artifacts`` within one text: the last token of a sentence carries the next sentence."""
    plan = local_sentence.copy()
    move = np.flatnonzero(local_sentence[1:] != local_sentence[:-1])
    plan[move] = local_sentence[move + 1]
    return plan


def _first_token_after(tokenizer, token_ids: list[int], char: int) -> int:
    """Index of the first token whose decoded text ends after character ``char`` of decode(token_ids)."""
    for i in range(len(token_ids)):
        if len(tokenizer.decode(token_ids[:i + 1])) > char:
            return i
    return len(token_ids)



__all__ = ["PlannedGenerator", "SamplingConfig", "GenerationResult", "GenerationState", "Prompt", "PlanRecord"]
