"""LM tokenisation: each whole article is tokenised once and tokens are mapped to sentences by
character offsets (tokenising sentence by sentence would drop the spaces between sentences and
change the token stream from standard evaluation).
"""

from __future__ import annotations

import numpy as np


def assign_tokens_to_sentences(token_spans: np.ndarray, sentence_spans: np.ndarray) -> np.ndarray:
    """Local sentence index of every token.

    token_spans (L, 2) character [start, end) of each token; sentence_spans (S, 2), sorted, disjoint.
    A token belongs to the sentence that contains its last character; tokens in the gaps between
    sentences (whitespace) belong to the next sentence, and trailing tokens to the last sentence.
    GPT-2's " The" (space + word) thus lands in the sentence of "The".
    """
    if len(sentence_spans) == 0:
        raise ValueError("article without sentences")
    last_char = np.maximum(token_spans[:, 1] - 1, token_spans[:, 0])  # (L,)
    sentence_ends = sentence_spans[:, 1]  # (S,)
    index = np.searchsorted(sentence_ends, last_char, side="right")  # first sentence ending after the char
    return np.minimum(index, len(sentence_spans) - 1)


def tokenize_articles(tokenizer, texts: list[str], sentence_spans: list[np.ndarray], batch_size: int = 64):
    """Tokenise whole articles and map tokens to their (article-local) sentences.

    Returns lists of (input_ids (L,), token_sentence (L,)) per article. Articles that yield no
    token get empty arrays.
    """
    ids_out, sent_out = [], []
    for start in range(0, len(texts), batch_size):
        batch = texts[start:start + batch_size]
        enc = tokenizer(batch, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        for j, (ids, offsets) in enumerate(zip(enc["input_ids"], enc["offset_mapping"])):
            ids = np.asarray(ids, dtype=np.int64)
            spans = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
            sent = assign_tokens_to_sentences(spans, np.asarray(sentence_spans[start + j])) if len(ids) else ids
            ids_out.append(ids)
            sent_out.append(sent.astype(np.int64))
    return ids_out, sent_out
