"""The planner's own documents (``prepare.planner_corpus``): more text for the planner than the LM reads.

The LM's cost grows with every token it reads; the planner reads sentence embeddings and is cheap to train,
and it predicts the next action better from more text. So ``planlm prepare`` can give the planner and the k-means
codebook more documents than the LM's training split: with ``rest_of_train: true``, the rest of the corpus's
training side, in draw order: the pieces of training documents that ``corpus.pieces_per_source`` or the training
split's edge leaves out, then every document after the training split (all of its pieces). Test and validation
documents never contribute.

``prepare`` writes them, after the LM's training articles, as the split ``planner_train``: sentences, spans,
embeddings (the LM's training sentences copied, the others streamed to disk in resumable chunks) and actions,
with empty token arrays, so that no LM window can be drawn from it. The codebook is fitted on it and
``train-planner`` trains on it (and fits its baselines on it); validation stays the validation split.

No document lies in two splits. The rest of the training side is drawn by document id, like the splits, and each
of its pieces is compared by text with the whole test and validation documents like the LM's training split
(``planlm.data.held_out``): a near-copy of a held-out document is a counted skip, and a verbatim passage of 50
words or more of one is cut out.
"""

from __future__ import annotations

from dataclasses import dataclass

PLANNER_SPLIT = "planner_train"


@dataclass
class PlannerCorpusConfig:
    """More documents for the planner and the codebook than the LM reads (off by default)."""

    rest_of_train: bool = False
    """Add the rest of the corpus's training side: the pieces that ``corpus.pieces_per_source`` leaves out of
    training documents and every document past ``corpus.num_train`` (never a test or validation document)."""

    @property
    def enabled(self) -> bool:
        return self.rest_of_train
