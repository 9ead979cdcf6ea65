"""Write to a plan: a user's outline as the plans of generation.

An ``Outline`` is the action each generated sentence should take, in order: action ids, or sentences in plain
words, each mapped to its nearest action by the corpus's own encoder and codebook (the way ``planlm prepare``
assigned the training sentences). Generation (``PlannedGenerator.generate(..., outline=...)``) reads it as a
document whose future the user wrote: the sentences before the outline keep their actions (the prompt's, nearest
codebook entry of their embeddings), the outline's actions follow, and the plan of an outlined sentence is the
**oracle kind's** plan over that document (``planlm.plans.kinds.OracleKind``): the outline's next T actions,
every one of the K paths the same, the steps past the outline's end masked out (as the oracle masks past an
article's end). No kind is added: an outline is the oracle path of a document the user wrote.

Why every path is the outline, not the outline's prefix followed by sampled steps: the adapter folds the K paths
into one vector (Project and Avg averages their step embeddings; multipath reads them), so sampled steps would
pull the plan away from what the user asked for, and the planner cannot be told to continue a prefix it did not
sample. Past the outline the plan says nothing more than the outline says.

When the outline runs out, ``then`` decides: ``planner`` hands the plans back to the model's own (its planner;
for a kind that reads the future, oracle, the document ends with the outline, so its plans there are empty), and
``stop`` ends generation with the last outlined sentence.

Letters: A actions, E embedding width, L outline length, S sentences before the outline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Optional, Sequence, Union

import numpy as np

from planlm.data.actions import nearest_actions
from planlm.errors import PlanlmError
from planlm.plans.contexts import Boundaries

OutlineItem = Union[int, str]
AfterOutline = Literal["planner", "stop"]


@dataclass
class Outline:
    """What each generated sentence should do: an action id or a sentence in plain words per sentence."""

    items: list[OutlineItem]
    """The outline, one item per generated sentence: an action id (int) or a sentence (str, mapped to its nearest
    action with the corpus's encoder and codebook)."""
    then: AfterOutline = "planner"
    """When the outline runs out: planner (the model's own plans take over) or stop (generation ends)."""

    def __post_init__(self):
        if not self.items:
            raise PlanlmError("--outline is empty: give one action id or sentence per sentence to generate")
        if self.then not in ("planner", "stop"):
            raise PlanlmError(f"--after_outline {self.then!r}: choose planner or stop")

    def __len__(self) -> int:
        return len(self.items)

    def actions(self, num_actions: int, embed_fn: Optional[Callable[[list[str]], np.ndarray]],
                codebook: Optional[np.ndarray]) -> np.ndarray:
        """(L,) the action of every item: ids checked against the codebook's A, sentences embedded and assigned."""
        actions = np.zeros(len(self.items), dtype=np.int64)
        texts = {i: item for i, item in enumerate(self.items) if isinstance(item, str) and not _is_int(item)}
        for i, item in enumerate(self.items):
            if i not in texts:
                actions[i] = check_action(item, num_actions)
        if texts:
            if embed_fn is None or codebook is None:
                raise PlanlmError("an outline in words needs the corpus's sentence encoder and codebook (embed_fn); "
                                  "give action ids, or the prepared corpus")
            embeddings = np.asarray(embed_fn([t.strip() for t in texts.values()]), dtype=np.float32)  # (L', E)
            actions[list(texts)] = nearest_actions(embeddings, np.asarray(codebook, dtype=np.float32))
        return actions


def _is_int(item) -> bool:
    return isinstance(item, str) and item.strip().lstrip("-").isdigit()


def check_action(item: OutlineItem, num_actions: int) -> int:
    """An action id of the outline, or a one-line error naming it and the codebook's range."""
    action = int(item)
    if not 0 <= action < num_actions:
        raise PlanlmError(f"--outline: action {action} is not in the codebook: its actions are 0..{num_actions - 1}")
    return action


@dataclass
class OutlineDocument:
    """The document an outline describes, in the form the oracle kind reads a split (one article): the actions of
    the S sentences before the outline, then the outline's L. Boundary j (document-local) is the point before
    sentence j; ``first`` = S is the first outlined sentence."""

    actions: np.ndarray
    """(S + L,) int64."""
    first: int
    then: AfterOutline
    num_actions: int

    @classmethod
    def of(cls, before: np.ndarray, outline: np.ndarray, then: AfterOutline, num_actions: int) -> OutlineDocument:
        before = np.asarray(before, dtype=np.int64).reshape(-1)
        return cls(np.concatenate([before, np.asarray(outline, dtype=np.int64)]), len(before), then, num_actions)

    @property
    def sentence_offsets(self) -> np.ndarray:
        return np.array([0, len(self.actions)], dtype=np.int64)

    @property
    def sentence_article(self) -> np.ndarray:
        return np.zeros(len(self.actions), dtype=np.int64)

    def outlined(self, sentences: Sequence[int]) -> np.ndarray:
        """(B,) bool: which boundaries plan an outlined sentence."""
        sentences = np.asarray(sentences, dtype=np.int64)
        return (sentences >= self.first) & (sentences < len(self.actions))

    def requested(self, sentence: int) -> Optional[int]:
        """The outline's action for document sentence ``sentence`` (None outside the outline)."""
        return int(self.actions[sentence]) if self.first <= sentence < len(self.actions) else None

    def boundaries(self, sentences: Sequence[int]) -> Boundaries:
        """Boundaries at document sentences (B,) for the oracle kind; past the document's end the future is unknown
        (a plan with no valid step)."""
        sentences = np.asarray(sentences, dtype=np.int64)
        known = sentences < len(self.actions)
        return Boundaries(len(sentences), self.num_actions, split=self, sentences=np.minimum(sentences,
                          len(self.actions) - 1), known=known)


__all__ = ["Outline", "OutlineDocument", "OutlineItem", "AfterOutline", "check_action"]
