"""The planner's training data: every sentence boundary of a split, batched with similar context lengths
(``BoundaryCollate``, the paper's per-boundary encoder) or as article rows whose every boundary is one
example (``ArticleCollate``, the article-level encoder: one row per article, no context gathered per boundary).

Letters: B boundaries, S context sentences, E embedding width, T horizon, R article rows, J boundaries of a row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from planlm.data.artifacts import PreparedSplit
from planlm.plans.contexts import IGNORE_INDEX, article_contexts, article_rows, boundary_contexts, boundary_targets


class BoundaryDataset(Dataset):
    """Every sentence boundary of a split (item = split-global sentence index)."""

    def __init__(self, num_sentences: int):
        self.num_sentences = num_sentences

    def __len__(self) -> int:
        return self.num_sentences

    def __getitem__(self, index: int) -> int:
        return index


class LengthGroupedSampler(torch.utils.data.Sampler):
    """Shuffled boundaries in an order where each run of ``batch_size`` has similar context lengths.

    Batches are padded to their longest context, so grouping cuts the padding several-fold (articles
    of 1-15 sentences). Shuffle, cut into mega-batches of 50 batches, sort each by context length, then
    shuffle the order of the batches. Under DDP Lightning swaps it for a DistributedSampler (still
    correct, just without the grouping).
    """

    def __init__(self, context_lengths: np.ndarray, batch_size: int, seed: int = 0, group: int = 50):
        self.context_lengths, self.batch_size, self.seed, self.group = context_lengths, batch_size, seed, group
        self.epoch = 0
        self.skip_batches = 0  # batches the next epoch leaves out at its start (a resumed epoch; ResumeMidEpoch)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.context_lengths)

    def __iter__(self):
        rng = np.random.default_rng((self.seed, self.epoch))
        order = rng.permutation(len(self.context_lengths))
        mega = self.batch_size * self.group
        chunks = [order[i:i + mega] for i in range(0, len(order), mega)]
        chunks = [chunk[np.argsort(self.context_lengths[chunk], kind="stable")] for chunk in chunks]
        batches = [chunk[i:i + self.batch_size] for chunk in chunks for i in range(0, len(chunk), self.batch_size)]
        skip, self.skip_batches = self.skip_batches, 0
        for index in rng.permutation(len(batches))[skip:]:
            yield from batches[index].tolist()


def reopen_split(path: str | Path, num_articles: int | None) -> PreparedSplit:
    """The split at ``path`` (a collate holds only its path, to pickle cheaply into DataLoader workers), cut to its
    first ``num_articles`` articles when given (a planner fitted on a head of its split)."""
    split = PreparedSplit(path)
    return split if num_articles is None or num_articles == split.num_articles else split.head(num_articles)


class BoundaryCollate:
    """Boundary indices -> {context_embeds (B, S, E), context_mask (B, S), target_actions (B, T), sentences (B,)}.

    With ``with_texts`` (finetuned encoder) the batch carries the unique context sentence texts and
    ``context_index`` (B, S) into them instead of cached embeddings. Holds only the split's path, so it
    pickles cheaply into DataLoader workers.
    """

    def __init__(self, split_path: str | Path, horizon: int, max_sentences: int, with_texts: bool = False,
                 num_articles: int | None = None):
        self.split_path, self.horizon, self.max_sentences, self.with_texts = Path(split_path), horizon, max_sentences, with_texts
        self.num_articles = num_articles  # the first articles only (``PreparedSplit.head``); None: all
        self._split: PreparedSplit | None = None

    @property
    def split(self) -> PreparedSplit:
        if self._split is None:
            self._split = reopen_split(self.split_path, self.num_articles)
        return self._split

    def __getstate__(self):
        return {**self.__dict__, "_split": None}

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor | list[str]]:
        sentences = np.asarray(indices, dtype=np.int64)
        targets = boundary_targets(self.split, sentences, self.horizon)  # (B, T)
        if not self.with_texts:
            context_embeds, context_mask = boundary_contexts(self.split, sentences, self.max_sentences)
            return {"context_embeds": context_embeds, "context_mask": context_mask, "target_actions": targets,
                    "sentences": torch.from_numpy(sentences)}
        # Sentence s's context sentences are s-S'..s-1: their indices, found with an index-only "embedding".
        index_column = np.arange(self.split.num_sentences, dtype=np.float32)[:, None]
        context_index, context_mask = boundary_contexts(self.split, sentences, self.max_sentences, index_column)
        context_index = context_index.squeeze(-1).long()  # (B, S)
        unique = torch.unique(context_index[context_mask])
        texts = [self.split.sentence_text(int(s)) for s in unique]
        context_index = torch.searchsorted(unique, context_index).clamp(max=max(len(unique) - 1, 0))
        return {"context_index": context_index, "texts": texts, "context_mask": context_mask,
                "target_actions": targets, "sentences": torch.from_numpy(sentences)}



class ArticleCollate:
    """Article row indices -> {context_embeds (R, S, E), context_mask (R, S), target_actions (R, S+1, T),
    sentences (R, S+1)}: a row's sentences and the targets of each of its boundaries (IGNORE_INDEX past the
    row's boundaries and before its first supervised one; ``sentences`` -1 there), for ``Planner.article_forward``."""

    def __init__(self, split_path: str | Path, horizon: int, max_sentences: int, num_articles: int | None = None):
        self.split_path, self.horizon, self.max_sentences = Path(split_path), horizon, max_sentences
        self.num_articles = num_articles  # the first articles only (``PreparedSplit.head``); None: all
        self._split: PreparedSplit | None = None
        self._rows: np.ndarray | None = None

    @property
    def split(self) -> PreparedSplit:
        if self._split is None:
            self._split = reopen_split(self.split_path, self.num_articles)
        return self._split

    @property
    def rows(self) -> np.ndarray:
        if self._rows is None:
            self._rows = article_rows(self.split, self.max_sentences)
        return self._rows

    def __getstate__(self):
        return {**self.__dict__, "_split": None, "_rows": None}

    def __call__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        context_embeds, context_mask, sentences = article_contexts(self.split, self.rows[np.asarray(indices)])
        supervised = sentences >= 0  # (R, J)
        targets = torch.full((*sentences.shape, self.horizon), IGNORE_INDEX, dtype=torch.long)  # (R, J, T)
        targets[torch.from_numpy(supervised)] = boundary_targets(self.split, sentences[supervised], self.horizon)
        return {"context_embeds": context_embeds, "context_mask": context_mask, "target_actions": targets,
                "sentences": torch.from_numpy(sentences)}
