"""Static batch shapes for a compiled LM stage (``runtime.compile``): a batch padded to a few fixed shapes.

A compiled function is compiled again for every new shape of its inputs (or, with automatic dynamic shapes, for
every new guard on them), and CUDA graphs record one graph per shape. The LM's batches vary in three sizes: the
windows of the last batch (B), the longest window (L), and the number of distinct sentences whose plans the
batch carries (N, a new value almost every batch). ``StaticShapes.pad`` pads B to the batch size and L to the
context length (one shape for the LM's transformer), and N up to a bucket of ``sentence_bucket`` (a few shapes
for the adapter: at most one graph per bucket). K paths and T steps are the plans' own, fixed by the run.

Padding is exact for what the batch scores: a padded window attends to its own tokens only and has no label, a
padded position has no label and sits after every real token of its window (causal attention: no real token
sees it), and a padded sentence's paths are all masked and no token points at it (``plan_index`` -1 stays -1).
The sums over a padded axis may round in another order, so the compiled stage equals the eager one within
floating-point tolerance, not bit for bit; without compilation nothing is padded.

Letters: B windows, L tokens, N sentences, K paths, T steps, M top actions (in expectation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from planlm.data.windows import IGNORE_INDEX

SMALLEST_BUCKET = 8
"""The smallest bucket of sentences per batch."""


def sentence_bucket(num_sentences: int, smallest: int = SMALLEST_BUCKET) -> int:
    """The bucket ``num_sentences`` is padded up to: the smallest of 2^k and 3 x 2^(k-1) (8, 12, 16, 24, 32, 48,
    ...) that holds it, so a batch carries at most half again its sentences, and a range of sentence counts that
    spans a factor of two falls in at most three buckets."""
    size = smallest
    while True:
        for bucket in (size, size * 3 // 2):
            if num_sentences <= bucket:
                return bucket
        size *= 2


@dataclass(frozen=True)
class StaticShapes:
    """The fixed shapes of a compiled stage's batches: ``batch_size`` windows of ``context_length`` tokens, and the
    sentences' plans in buckets of ``sentence_bucket``."""

    batch_size: int
    context_length: int

    def pad(self, batch: dict) -> dict:
        """``batch`` (``planlm.data.windows.collate_windows``'s keys) padded to the static shapes; other keys as
        they are. Raises ValueError for a batch larger than the shapes."""
        windows, length = batch["input_ids"].shape
        if windows > self.batch_size or length > self.context_length:
            raise ValueError(f"a batch of {windows} x {length} tokens exceeds the static shape "
                             f"{self.batch_size} x {self.context_length}")
        extra_rows, extra_columns = self.batch_size - windows, self.context_length - length
        padded = dict(batch)
        if extra_rows or extra_columns:
            columns = (0, extra_columns, 0, extra_rows)  # F.pad's order: last axis first
            padded["input_ids"] = F.pad(batch["input_ids"], columns, value=0)
            padded["labels"] = F.pad(batch["labels"], columns, value=IGNORE_INDEX)
            if "plan_index" in batch:
                padded["plan_index"] = F.pad(batch["plan_index"], columns, value=-1)
            if batch.get("attention_mask") is not None:
                # a padded window attends to all of its own tokens (no fully masked row, whose attention would be
                # NaN); a padded position of a real window is masked
                mask = F.pad(batch["attention_mask"], (0, extra_columns), value=0)
                padded["attention_mask"] = F.pad(mask, (0, 0, 0, extra_rows), value=1)
        if batch.get("action_paths") is not None:
            sentences = batch["action_paths"].shape[0]
            extra = sentence_bucket(sentences) - sentences
            if extra:
                for name, value in (("action_paths", 0), ("path_mask", False), ("action_probs", 0.0)):
                    if batch.get(name) is not None:
                        tensor = batch[name]
                        padded[name] = torch.cat([tensor, tensor.new_full((extra, *tensor.shape[1:]), value)])
        return padded
