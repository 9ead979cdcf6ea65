"""The sentence boundaries a plan is made for, as the planner reads them: their contexts, their targets, and the
walk over a prepared split that the plan cache and the live plan sources share.

Boundary s (split-global sentence index) is the point before sentence s; its context is the true sentences of the
same article before s (the last ``max_sentences`` of them) and its plan is the actions of sentences s, s+1, ...,
s+T-1. A planner with the article-level encoder reads article rows (``article_rows``: one pass per article serves
all its boundaries, the same contexts).

Letters: B boundaries, R article rows, J boundaries of a row, S context sentences, E embedding width, T horizon,
N_sent sentences of the split.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, Optional

import numpy as np
import torch

from planlm.data.artifacts import PreparedSplit
from planlm.data.windows import IGNORE_INDEX  # the target of a step beyond the article's end
from planlm.errors import PlanlmError

MAX_ROWS = 4096  # most paths (B*K) per planner forward in a walk: bounds activation memory, keeps caches warm


@dataclass
class Boundaries:
    """B sentence boundaries to plan, in the forms the plan kinds read (``planlm.plans.kinds``).

    A planner reads ``context_embeds`` (B, S, E) and ``context_mask`` (B, S) [True = real sentence]: the sentences
    before each boundary. With article rows (the article-level encoder) they are the rows' sentences (R, S, E) and
    (R, S), and boundary b is boundary ``bound[b]`` of row ``row[b]``. Kinds that read the corpus find the
    boundaries at ``sentences`` (B,) split-global in ``split``; ``known`` (B,) bool is False where the true future
    is unknown (generation past the article's end). ``num_actions`` is A, the actions a plan is made of."""

    size: int
    num_actions: int
    context_embeds: Optional[torch.Tensor] = None
    context_mask: Optional[torch.Tensor] = None
    row: Optional[torch.Tensor] = None
    bound: Optional[torch.Tensor] = None
    split: Optional[PreparedSplit] = None
    sentences: Optional[np.ndarray] = None
    known: Optional[np.ndarray] = None
    states: dict = field(default_factory=dict)
    """The planner's start states of these boundaries, by horizon: the kinds that plan one batch share one pass."""

    def __len__(self) -> int:
        return self.size

    def start_state(self, planner, horizon: int):
        """The decoding state of every boundary after the planner read its context (``Planner.start``; with article
        rows, one pass over the rows: ``Planner.article_start``), computed once per batch."""
        if horizon not in self.states:
            if self.row is None:
                self.states[horizon] = planner.start(self.context_embeds, self.context_mask, horizon)
            else:
                self.states[horizon] = planner.article_start(self.context_embeds, self.context_mask, self.row,
                                                             self.bound, horizon)
        return self.states[horizon]

    @classmethod
    def of_contexts(cls, contexts: list[np.ndarray], num_actions: int, planner) -> Boundaries:
        """Boundaries from the sentence embeddings before each of them, B arrays (S_b, E) (generation): the last
        ``max_sentences`` of each, right-padded, on the planner's device."""
        width, max_sentences = planner.config.embedding_dim, planner.config.max_sentences
        contexts = [np.array(c[-max_sentences:], np.float32) if len(c) else np.zeros((0, width), np.float32)
                    for c in contexts]
        longest = max(len(c) for c in contexts)
        context_embeds = torch.zeros(len(contexts), longest, width)  # (B, S, E)
        context_mask = torch.zeros(len(contexts), longest, dtype=torch.bool)  # (B, S)
        for i, c in enumerate(contexts):
            context_embeds[i, :len(c)] = torch.from_numpy(c)
            context_mask[i, :len(c)] = True
        device = next(planner.parameters()).device
        return cls(len(contexts), num_actions, context_embeds.to(device), context_mask.to(device))


def boundary_contexts(split: PreparedSplit, sentences: np.ndarray, max_sentences: int,
                      embeddings: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sentences (B,) boundaries -> context_embeds (B, S, E) float32, context_mask (B, S) bool (right-padded).

    The context of boundary s is the sentences of s's article before s, the last ``max_sentences`` of
    them; S is the longest context in the batch (0 when every boundary opens its article).
    ``embeddings`` replaces the split's cached embeddings (a planner that finetunes its encoder).
    """
    sentences = np.asarray(sentences, dtype=np.int64)
    embeddings = split.embeddings if embeddings is None else embeddings
    article_start = split.sentence_offsets[split.sentence_article[sentences]]  # (B,)
    begin = np.maximum(article_start, sentences - max_sentences)  # (B,)
    lengths = sentences - begin  # (B,)
    num_context = int(lengths.max()) if len(lengths) else 0
    positions = np.arange(num_context)
    context_mask = positions[None, :] < lengths[:, None]  # (B, S)
    index = np.where(context_mask, begin[:, None] + positions[None, :], 0)  # (B, S)
    width = embeddings.shape[1]
    context = np.asarray(embeddings[index.reshape(-1)], dtype=np.float32) if index.size else \
        np.zeros((0, width), dtype=np.float32)
    context = context.reshape(len(sentences), num_context, width) * context_mask[..., None]  # (B, S, E)
    return torch.from_numpy(context), torch.from_numpy(context_mask)


def article_rows(split: PreparedSplit, max_sentences: int) -> np.ndarray:
    """The article rows of a split: (R, 3) int64 of (first sentence, boundaries J, first supervised boundary).

    Row r holds sentences begin .. begin+J-2 and its boundaries j = 0 .. J-1 (boundary j: context = the row's
    first j sentences, i.e. global sentence begin+j). One row per article covers its first max_sentences + 1
    boundaries, every context as the paper's (the last max_sentences sentences). A longer article's later
    boundary s gets a row of its own, s-max_sentences .. s-1, supervised at its last boundary only: the same
    context as the per-boundary encoder, but every boundary of such a row runs its T-1 steps, about
    (max_sentences+1)*T tokens for one boundary where the per-boundary encoder takes max_sentences+T (articles
    longer than max_sentences + 1 sentences are where the article encoder is not yet faster)."""
    offsets = split.sentence_offsets
    rows = []
    for begin, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        if end > begin:
            rows.append((begin, min(end - begin, max_sentences + 1), 0))
            rows.extend((s - max_sentences, max_sentences + 1, max_sentences)
                        for s in range(begin + max_sentences + 1, end))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def article_contexts(split: PreparedSplit, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """rows (R, 3) of ``article_rows`` -> context_embeds (R, S, E) float32, context_mask (R, S) bool (a row's
    sentences, right-padded; S = J-1) and sentences (R, J) int64: the boundary (split-global sentence index) of
    each supervised row position, -1 elsewhere."""
    begin, num_bounds, first = np.asarray(rows, dtype=np.int64).reshape(-1, 3).T  # (R,) each
    bound = np.arange(int(num_bounds.max()) if len(num_bounds) else 1)  # (J,)
    supervised = (bound[None, :] >= first[:, None]) & (bound[None, :] < num_bounds[:, None])  # (R, J)
    sentences = np.where(supervised, begin[:, None] + bound[None, :], -1)  # (R, J)
    context_mask = bound[None, :-1] < num_bounds[:, None] - 1  # (R, S)
    index = np.where(context_mask, begin[:, None] + bound[None, :-1], 0)  # (R, S)
    context = np.asarray(split.embeddings[index.reshape(-1)], dtype=np.float32).reshape(*index.shape, -1)
    context = context * context_mask[..., None]  # (R, S, E)
    return torch.from_numpy(context), torch.from_numpy(context_mask), sentences


def boundary_targets(split: PreparedSplit, sentences: np.ndarray, horizon: int) -> torch.Tensor:
    """sentences (B,) -> target_actions (B, T) long: actions of s .. s+T-1, IGNORE_INDEX past the article's end."""
    sentences = np.asarray(sentences, dtype=np.int64)
    article_end = split.sentence_offsets[split.sentence_article[sentences] + 1]  # (B,)
    index = sentences[:, None] + np.arange(horizon)[None, :]  # (B, T)
    valid = index < article_end[:, None]  # (B, T)
    actions = np.asarray(split.actions[np.where(valid, index, 0).reshape(-1)]).reshape(index.shape)
    return torch.from_numpy(np.where(valid, actions, IGNORE_INDEX).astype(np.int64))


class PlannerInputs(NamedTuple):
    """What a planner reads at B boundaries: their contexts and true actions (joint training's batches)."""

    context_embeds: torch.Tensor
    """(B, S, E) float32: the sentences before each boundary, right-padded."""
    context_mask: torch.Tensor
    """(B, S) bool: the real sentences."""
    target_actions: torch.Tensor
    """(B, T) long: the actions of sentences s .. s+T-1, IGNORE_INDEX past the article's end (the action loss)."""

    def inputs(self) -> dict[str, torch.Tensor]:
        return self._asdict()


class ContextSource:
    """The planner's inputs at any boundaries of a split, in place of their plans: a window batch (``collate_windows``)
    then carries what the planner reads, and the planner runs inside the LM's training step (``train.joint``).
    ``planlm.plans.sources.ShuffledPlans`` shuffles them as it shuffles plans."""

    def __init__(self, split: PreparedSplit, max_sentences: int, target_horizon: int, num_paths: int, horizon: int):
        self.split, self.max_sentences, self.target_horizon = split, max_sentences, target_horizon
        self.num_paths, self.horizon = num_paths, horizon  # of the plans the planner will make of them

    def __call__(self, sentences: np.ndarray) -> PlannerInputs:
        context_embeds, context_mask = boundary_contexts(self.split, sentences, self.max_sentences)
        return PlannerInputs(context_embeds, context_mask, boundary_targets(self.split, sentences, self.target_horizon))


@torch.no_grad()
def embed_split(planner, split: PreparedSplit, batch_size: int = 64) -> np.ndarray:
    """(N_sent, E) embeddings of every sentence of the split by the planner's own (finetuned) encoder."""
    planner.eval()
    out = np.zeros((split.num_sentences, planner.config.embedding_dim), dtype=np.float32)
    for start in range(0, split.num_sentences, batch_size):
        texts = [split.sentence_text(s) for s in range(start, min(start + batch_size, split.num_sentences))]
        out[start:start + len(texts)] = planner.embed_sentences(texts).float().cpu().numpy()
    return out


def check_split(split: PreparedSplit, where: str) -> None:
    if split.num_sentences == 0:
        raise PlanlmError(f"{split.path}: split {split.name!r} has no sentences; prepare it with articles or "
                          f"leave it out of {where}")


def split_batches(split: PreparedSplit, sentences: np.ndarray, num_actions: int, per_forward: int, planner=None,
                  article: bool = False, skip: int = 0) -> Iterator[tuple[np.ndarray, Boundaries]]:
    """The walk over ``sentences`` (N,) of a split: (positions in ``sentences`` (B,), their Boundaries), in a fixed
    order that a seeded sampler follows, so the plans depend on the seed, ``per_forward`` and the device type alone.

    Without a planner the boundaries come in order, with their place in the split only. With one, they come sorted
    by context length (little padding), ``per_forward`` at a time, with their contexts on the planner's device;
    with ``article`` (an article-level planner), as article rows of about ``per_forward`` asked boundaries. ``skip``:
    the walk's first batches are passed over without their contexts being built (a walk that resumes)."""
    if planner is None:
        for start in range(skip * per_forward, len(sentences), per_forward):
            rows = np.arange(start, min(start + per_forward, len(sentences)))
            yield rows, Boundaries(len(rows), num_actions, split=split, sentences=sentences[rows])
    elif article:
        yield from _article_batches(planner, split, sentences, num_actions, per_forward, skip)
    else:
        yield from _context_batches(planner, split, sentences, num_actions, per_forward, skip)


def _context_batches(planner, split: PreparedSplit, sentences: np.ndarray, num_actions: int,
                     per_forward: int, skip: int = 0) -> Iterator[tuple[np.ndarray, Boundaries]]:
    device = next(planner.parameters()).device
    max_sentences = planner.config.max_sentences
    embeddings = embed_split(planner, split) if planner.config.finetune_encoder else None
    context_lengths = sentences - split.sentence_offsets[split.sentence_article[sentences]]
    order = np.argsort(np.minimum(context_lengths, max_sentences), kind="stable")
    for start in range(skip * per_forward, len(order), per_forward):
        rows = np.sort(order[start:start + per_forward])  # positions in ``sentences``
        context_embeds, context_mask = boundary_contexts(split, sentences[rows], max_sentences, embeddings)
        yield rows, Boundaries(len(rows), num_actions, context_embeds.to(device), context_mask.to(device),
                               split=split, sentences=sentences[rows])


def _article_batches(planner, split: PreparedSplit, sentences: np.ndarray, num_actions: int,
                     per_forward: int, skip: int = 0) -> Iterator[tuple[np.ndarray, Boundaries]]:
    """Article rows of about ``per_forward`` asked boundaries each; a row's boundaries come in (row, bound) order."""
    device = next(planner.parameters()).device
    position = np.full(split.num_sentences, -1, dtype=np.int64)
    position[sentences] = np.arange(len(sentences))  # boundary -> its position in ``sentences``
    rows = article_rows(split, planner.config.max_sentences)
    asked = np.array([(position[b + f:b + j] >= 0).sum() for b, j, f in rows])  # (R,) boundaries asked for
    rows, asked = rows[asked > 0], asked[asked > 0]
    batch_of = np.cumsum(asked) // per_forward if len(rows) else asked  # consecutive rows of ~per_forward boundaries
    for batch in np.unique(batch_of)[skip:]:
        context_embeds, context_mask, row_sentences = article_contexts(split, rows[batch_of == batch])
        wanted = row_sentences >= 0
        wanted[wanted] = position[row_sentences[wanted]] >= 0  # (R, J)
        row, bound = (torch.from_numpy(x).to(device) for x in np.nonzero(wanted))
        targets = position[row_sentences[wanted]]  # (B,) positions in ``sentences``, in (row, bound) order
        yield targets, Boundaries(len(targets), num_actions, context_embeds.to(device), context_mask.to(device),
                                  row, bound, split=split, sentences=sentences[targets])


__all__ = ["Boundaries", "PlannerInputs", "ContextSource", "boundary_contexts", "article_rows", "article_contexts",
           "boundary_targets", "embed_split", "check_split", "split_batches", "IGNORE_INDEX", "MAX_ROWS"]
