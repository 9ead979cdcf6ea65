"""A synthetic corpus in which the future shapes the present, with the Bayes-optimal LM known exactly.

Each sentence has one of 8 topical types (weather, cooking, ...). Which type comes next follows the
mechanism benchmark's lag rule: the first ``lag`` sentences of an article are uniform; after them the type
of sentence j is t + 1 or t + 2 (mod 8, p = 1/2) of the type t of sentence j - lag. Within fewer than
``lag`` sentences the types are independent and uniform, so an LM whose window spans fewer sentences
learns nothing about the types to come from it; a planner that reads the whole article knows each of the
next ``lag`` types up to two candidates.

A sentence announces where the article goes, as real writing does::

    Rain soaked the hills then loudly briefly.
    opener verb the noun  A    B      C      .

Its topic words (opener, verb, noun; 4 choices each) are those of its own type i. Its last three words
are chosen by the types of the next sentences: the connective A by one bit of type i + 1, the manner B by
another bit of type i + 2, the register C by a third bit of type i + 3 (2 words per bit value). The bits
are those of the types' reflected Gray code, so they are independent under uniform types and each
candidate pair {t + 1, t + 2} differs in exactly one bit: the planner knows A's and B's bit 3 times in 4
and C's bit 1 time in 2. Each bit of a type is announced by exactly one word before its sentence, so the
text already read never tells the word to come: only a plan of T >= 2 (A), T >= 3 (B), T >= 4 (C) does.
The last sentences of an article announce ``LOOKAHEAD`` virtual types that continue the type sequence.

``ideal_token_nll`` gives the exact per-token NLL of the Bayes-optimal LM that sees its evaluation window
(the windows of ``planlm.data.windows.article_windows`` with stride = context_length - 1) and a plan:
none, the true next T actions (oracle), or the true posterior of the next T actions given the article
before the sentence (an ideal planner, K -> infinity).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planlm.errors import PlanlmError

NUM_TYPES = 8
LOOKAHEAD = 3  # the register word looks this many sentences ahead
# Per type: openers, verbs, nouns (a sentence's own topic, 4 choices each).
TOPICS = (
    (("Rain", "Wind", "Snow", "Thunder"),
     ("soaked", "battered", "covered", "shook"), ("hills", "valley", "meadows", "plains")),
    (("Chefs", "Cooks", "Bakers", "Grillers"),
     ("roasted", "seasoned", "sliced", "baked"), ("garlic", "bread", "onions", "salmon")),
    (("Strikers", "Goalkeepers", "Defenders", "Referees"),
     ("kicked", "blocked", "passed", "chased"), ("ball", "penalty", "corner", "header")),
    (("Astronomers", "Telescopes", "Satellites", "Probes"),
     ("observed", "tracked", "photographed", "measured"), ("comet", "nebula", "galaxy", "eclipse")),
    (("Violinists", "Pianists", "Drummers", "Singers"),
     ("performed", "rehearsed", "composed", "recorded"), ("symphony", "melody", "chorus", "sonata")),
    (("Bankers", "Investors", "Traders", "Brokers"),
     ("bought", "sold", "hedged", "valued"), ("bonds", "shares", "stocks", "futures")),
    (("Doctors", "Nurses", "Surgeons", "Pharmacists"),
     ("treated", "examined", "vaccinated", "diagnosed"), ("patient", "infection", "fever", "wound")),
    (("Sailors", "Captains", "Fishermen", "Pirates"),
     ("steered", "anchored", "rowed", "boarded"), ("ship", "vessel", "yacht", "schooner")),
)
# The announcing words: (sentences ahead, Gray-code bit of that type, words for bit 0, words for bit 1).
ANNOUNCE = (
    (1, 1, ("then", "next"), ("later", "afterwards")),  # connective A
    (2, 2, ("quietly", "calmly"), ("loudly", "boldly")),  # manner B
    (3, 0, ("briefly", "simply"), ("elaborately", "lengthily")),  # register C
)
TOKENS_PER_SENTENCE = 3 + 1 + len(ANNOUNCE) + 1  # topic words, "the", announcing words, "."
GRAY = np.arange(NUM_TYPES) ^ (np.arange(NUM_TYPES) >> 1)


def gray_bit(types: np.ndarray, bit: int) -> np.ndarray:
    return (GRAY[types] >> bit) & 1


def sample_types(rng: np.random.Generator, num: int, length: int, lag: int) -> np.ndarray:
    """(num, length) type sequences of the lag rule (also used by the tests' Monte Carlo estimate)."""
    types = np.empty((num, length), dtype=np.int64)
    types[:, :lag] = rng.integers(NUM_TYPES, size=(num, min(lag, length)))
    for j in range(lag, length):
        types[:, j] = (types[:, j - lag] + 1 + rng.integers(2, size=num)) % NUM_TYPES
    return types


def sentence_words(types: np.ndarray, index: int, rng: np.random.Generator) -> list[str]:
    """The words of sentence ``index`` of an article whose (real + virtual) types are ``types``."""
    own = TOPICS[types[index]]
    words = [rng.choice(own[0]), rng.choice(own[1]), "the", rng.choice(own[2])]
    for ahead, bit, *choices in ANNOUNCE:
        words.append(rng.choice(choices[gray_bit(types[index + ahead], bit)]))
    return words


def make_articles(num_articles: int, min_sentences: int, max_sentences: int, lag: int, seed: int,
                  prefix: str = "look") -> list[dict]:
    """Articles {id, title, sentences, actions (the true types), types (+ LOOKAHEAD virtual ones)}."""
    rng = np.random.default_rng(seed)
    articles = []
    for index in range(num_articles):
        length = int(rng.integers(min_sentences, max_sentences + 1))
        types = sample_types(rng, 1, length + LOOKAHEAD, lag)[0]
        sentences = [" ".join(sentence_words(types, i, rng)) + "." for i in range(length)]
        articles.append({"id": f"{prefix}-{index}", "title": f"Lookahead {index}", "sentences": sentences,
                         "actions": types[:length].tolist(), "types": types.tolist()})
    return articles


def vocabulary() -> list[str]:
    words = {"the", "."}
    for topic in TOPICS:
        for group in topic:
            words.update(group)
    for _, _, *choices in ANNOUNCE:
        for group in choices:
            words.update(group)
    return sorted(words)


def word_level_tokenizer(folder: str | Path, words: list[str]) -> str:
    """A word-level fast tokenizer over a closed vocabulary (offsets from the whitespace pre-tokenizer),
    saved as a ``PreTrainedTokenizerFast`` folder: one token per word and one per ".". Returns the folder."""
    folder = Path(folder)
    if (folder / "tokenizer.json").is_file():
        return str(folder)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{word: i + 2 for i, word in enumerate(sorted(words))}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(folder)
    return str(folder)


def make_lookahead_prepared(out_dir: str | Path, num_articles: dict[str, int], sentences: tuple[int, int] = (12, 20),
                            lag: int = 6, embedding_dim: int = 16, noise: float = 0.05, seed: int = 0) -> Path:
    """Write the corpus as a prepared folder (``planlm.testing.synthetic``): actions = the true types, embeddings =
    the type's centroid + noise, a word-level tokenizer in ``<out_dir>/tokenizer``. The true types, virtual
    ones included, go to ``<out_dir>/<split>/types.json`` (the known answer)."""
    import json

    from planlm.data.artifacts import SPLITS
    from planlm.testing.synthetic import noisy_centroids, write_synthetic_prepared

    out_dir = Path(out_dir)
    tokenizer = word_level_tokenizer(out_dir / "tokenizer", vocabulary())
    rng = np.random.default_rng(seed)
    centroids = rng.normal(size=(NUM_TYPES, embedding_dim)).astype(np.float32)
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    splits = {}
    for offset, split in enumerate(SPLITS):
        articles = make_articles(num_articles.get(split, 0), *sentences, lag, seed=seed * 10 + offset, prefix=split)
        splits[split] = (articles, noisy_centroids(centroids, [a["actions"] for a in articles], noise, rng))
    config = {"source": "lookahead", "lag": lag, "num_articles": num_articles, "sentences": list(sentences),
              "embedding_dim": embedding_dim, "noise": noise, "seed": seed}
    write_synthetic_prepared(out_dir, splits, centroids, tokenizer, config)
    for split, (articles, _) in splits.items():
        (out_dir / split / "types.json").write_text(json.dumps({a["id"]: a["types"] for a in articles}))
    return out_dir


# ------------------------------------------------------------------------------------ the known answer
def _slot_feature(slot: int) -> tuple[int, int | None]:
    """(sentences ahead, Gray bit) that chooses the word of a slot; bit None = the whole type; ahead -1 = fixed."""
    if slot in (0, 1, 3):
        return 0, None
    if slot in (2, TOKENS_PER_SENTENCE - 1):
        return -1, None
    ahead, bit, *_ = ANNOUNCE[slot - 4]
    return ahead, bit


def _allowed(types: np.ndarray, sentence: int, slot: int) -> np.ndarray:
    """(NUM_TYPES,) bool: the values of the deciding type that agree with the word in this slot."""
    ahead, bit = _slot_feature(slot)
    true = types[sentence + ahead]
    if bit is None:
        return np.arange(NUM_TYPES) == true
    return gray_bit(np.arange(NUM_TYPES), bit) == gray_bit(true, bit)


def max_context_length(lag: int) -> int:
    """The longest LM window that never reaches the sentence ``lag`` before a type a token has to guess."""
    slots = [(slot, _slot_feature(slot)[0]) for slot in range(TOKENS_PER_SENTENCE)]
    return min((lag - ahead - 1) * TOKENS_PER_SENTENCE + slot + 1 for slot, ahead in slots if ahead >= 0)


def token_evidence(types: np.ndarray, num_sentences: int, context_length: int, lag: int) -> list[dict]:
    """Per scored token of one article (all but its first, in order): the deciding type ``target`` (its index,
    or -1 for a fixed word), the words' ``choices`` given it, the ``mask`` (NUM_TYPES,) of its values that
    agree with the words of the window before the token, the ``allowed`` values of the word itself and its
    ``sentence``. Raises when a window reaches the sentence ``lag`` before the type a token has to guess (the
    only earlier sentence tied to it), so that the window and a plan tell of that type only what they show."""
    positions = num_sentences * TOKENS_PER_SENTENCE
    stride = context_length - 1
    out = []
    for position in range(1, positions):
        sentence, slot = divmod(position, TOKENS_PER_SENTENCE)
        start = (position - 1) // stride * stride  # the window that predicts this token starts here
        ahead, bit = _slot_feature(slot)
        if ahead < 0:
            out.append({"target": -1})
            continue
        target = sentence + ahead
        if target - lag >= start // TOKENS_PER_SENTENCE:
            raise PlanlmError(f"--context_length {context_length}: a window reaches the sentence {lag} before a type "
                              f"it has to guess (lag {lag}); use at most {max_context_length(lag)}")
        mask = np.ones(NUM_TYPES, dtype=bool)
        # the words announcing the target type: its own topic words and the word `a` sentences before it
        witnesses = [target * TOKENS_PER_SENTENCE + s for s in (0, 1, 3)]
        witnesses += [(target - a) * TOKENS_PER_SENTENCE + 3 + i for i, (a, *_) in enumerate(ANNOUNCE, 1)]
        for witness in witnesses:
            if start <= witness < position:
                mask &= _allowed(types, *divmod(witness, TOKENS_PER_SENTENCE))
        out.append({"target": target, "sentence": sentence, "mask": mask, "allowed": _allowed(types, sentence, slot),
                    "choices": 4 if bit is None else 2})
    return out


def plan_prior(types: np.ndarray, num_sentences: int, sentence: int, target: int, plan: str, horizon: int,
               lag: int) -> np.ndarray:
    """(NUM_TYPES,) what a plan of boundary ``sentence`` says of type ``target``: ``oracle`` the true type if
    it is one of the next ``horizon`` real sentences, ``planner`` its posterior given the types before the
    sentence (the two successors of the type ``lag`` back), ``none`` (or out of reach) uniform."""
    uniform = np.full(NUM_TYPES, 1.0 / NUM_TYPES)
    if plan == "none" or not sentence <= target < sentence + horizon:
        return uniform
    if plan == "oracle":
        return (np.arange(NUM_TYPES) == types[target]).astype(float) if target < num_sentences else uniform
    if target < lag:
        return uniform
    prior = np.zeros(NUM_TYPES)
    prior[(types[target - lag] + np.array([1, 2])) % NUM_TYPES] = 0.5
    return prior


OPTIMA = (("none", 1), ("oracle", 1), ("oracle", 2), ("oracle", 3), ("oracle", 5), ("planner", 1), ("planner", 3),
          ("planner", 5))


def ideal_token_nll(types: np.ndarray, num_sentences: int, context_length: int, lag: int,
                    optima=OPTIMA) -> dict[tuple[str, int], np.ndarray]:
    """{(plan, T): (tokens - 1,)} exact NLL of every scored token of one article for the Bayes-optimal LM with its
    window and that plan. ``types``: the article's types, virtual ones included."""
    if lag <= LOOKAHEAD:
        raise PlanlmError(f"--lag {lag} must exceed {LOOKAHEAD}: the planner must know the types a sentence announces")
    evidence = token_evidence(types, num_sentences, context_length, lag)
    out = {}
    for plan, horizon in optima:
        nll = np.zeros(len(evidence))
        for index, token in enumerate(evidence):
            if token["target"] >= 0:
                posterior = token["mask"] * plan_prior(types, num_sentences, token["sentence"], token["target"],
                                                       plan, horizon, lag)
                nll[index] = -np.log(posterior[token["allowed"]].sum() / posterior.sum() / token["choices"])
        out[(plan, horizon)] = nll
    return out


def ideal_split_nll(split, types_by_id: dict[str, list[int]], context_length: int, lag: int,
                    optima=OPTIMA) -> dict[tuple[str, int], float]:
    """{(plan, T): NLL per token} of the Bayes-optimal LM on a prepared split, checked against its tokens."""
    lengths = np.diff(np.asarray(split.sentence_offsets))
    tokens = np.diff(np.asarray(split.token_offsets))
    if not (tokens == TOKENS_PER_SENTENCE * lengths).all():
        raise PlanlmError(f"{split.path}: expected {TOKENS_PER_SENTENCE} tokens per sentence; the corpus or its "
                          f"tokenizer changed")
    totals = dict.fromkeys(optima, 0.0)
    for article, length in zip(split.articles, lengths):
        nll = ideal_token_nll(np.asarray(types_by_id[article["id"]]), int(length), context_length, lag, optima)
        for key in optima:
            totals[key] += nll[key].sum()
    return {key: value / float((tokens - 1).sum()) for key, value in totals.items()}
