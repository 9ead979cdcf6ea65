"""The plan channel on a corpus with a known answer: planner against the Bayes optimum, LM conditions paired over seeds.

The corpus is synthetic text over 8 topical sentence types (weather, cooking, football, ...). A sentence
of a type is drawn from that type's own words ("Rain soaked the hills before dawn.": 4 slots of 4 words,
7 tokens), so the sentence encoder separates the types. Which type comes next is known exactly, in two
regimes:

- ``--lag 6`` (default): the first 6 sentences of an article have uniform random types; after them, the
  type of sentence j is one of two successors (t + 1 or t + 2 mod 8, p = 1/2) of the type t of sentence
  j - 6, and the LM's window (37 tokens) cannot reach that sentence. The planner reads the whole article,
  so its plans carry what the LM cannot see: two candidates out of 8. An argmax plan names one of them,
  and the other is then t + 1 or t - 1 of it; K sampled paths name both. Expected order: oracle < sampled
  < argmax < none.
- ``--lag 0`` (the control): a Markov chain over the types (five with two successors at p = 1/2, three
  with one) and a 128-token window. The window holds everything the planner knows, so an LM that has
  learned the chain gains nothing from planner plans; only oracle plans help.

Everything after the corpus goes through the real stages:

1. ``planlm.prepare``: spaCy sentencizer, the offline MiniLM encoder, k-means with num_actions = 8 (the
   lowest-inertia of ``--kmeans_restarts`` k-means seeds), and a word-level tokenizer built here
   (``tokenizers`` WordLevel saved as a ``PreTrainedTokenizerFast`` folder). Printed: k-means purity.
2. ``planlm.train_planner``: per-step accuracy and NLL beside the Bayes optimum given the clustering:
   p(cluster of sentence j) = p(type of j | the true types before j) C, with C = p(cluster | type)
   counted on the train split, scored on the same test boundaries (steps t > 1 teacher-forced, as the
   planner's summary scores them).
3. ``planlm.train_lm`` + ``planlm.evaluate`` for none / fixed / argmax (T=1, K=1) / sampled (T=1, K=10) /
   ours (T=3, K=10, multipath) / oracle, once per seed, every condition of a seed starting from that
   seed's base LM with the same ``train.seed`` (paired: same init, window order and dropout); paired
   bootstrap intervals over test articles (``planlm.evaluate.bootstrap.paired_bootstrap``) per seed and
   pooled (NLL summed over seeds). Beside them, the perplexity of the ideal LM, known exactly
   (``lm_floor``): without plans, with ideal planner plans and with oracle plans.
4. ``planlm.sweep``: K = 1, 2, 5, 10, 20 of the sampled model at inference, paired against K = 1 and
   against the previous K.

Targets, each printed PASS/FAIL: planner step-1 NLL within 10% of the optimum;
oracle < sampled < argmax < none with every pooled paired interval excluding 0; the K sweep never
significantly worse from one K to the next up to K = 20; the whole run under 30 minutes on 2 cores.

Every stage caches under ``--out_dir`` (the library's own stage reuse), so a rerun only does what is
missing; ``--epochs``, ``--seeds`` etc. retrain only what they change. The report also goes to
``<out_dir>/report.md``.

    python experiments/bench_mechanism.py                               # the committed result
    python experiments/bench_mechanism.py --lag 0 --out_dir runs/bench_mechanism_lag0   # the control
    python experiments/bench_mechanism.py --quick --out_dir /tmp/mech   # minutes: small corpus, 1 seed
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import numpy as np

# ---------------------------------------------------------------------------------------------- corpus
# Each type: openers (the sentence's first word), verbs, nouns (after "the"), two-word tails.
TYPES = {
    "weather": (["Rain", "Wind", "Snow", "Thunder"], ["soaked", "battered", "covered", "shook"],
                ["hills", "valley", "meadows", "plains"],
                ["before dawn", "all night", "at noon", "since morning"]),
    "cooking": (["Chefs", "Cooks", "Bakers", "Grillers"], ["roasted", "seasoned", "sliced", "baked"],
                ["garlic", "bread", "onions", "salmon"],
                ["with butter", "for dinner", "in ovens", "over coals"]),
    "football": (["Strikers", "Goalkeepers", "Defenders", "Referees"], ["kicked", "blocked", "passed", "chased"],
                 ["ball", "penalty", "corner", "header"],
                 ["near goal", "after halftime", "in stoppage", "during matches"]),
    "astronomy": (["Astronomers", "Telescopes", "Satellites", "Probes"],
                  ["observed", "tracked", "photographed", "measured"], ["comet", "nebula", "galaxy", "eclipse"],
                  ["through lenses", "beyond Jupiter", "across orbits", "near Saturn"]),
    "music": (["Violinists", "Pianists", "Drummers", "Singers"], ["performed", "rehearsed", "composed", "recorded"],
              ["symphony", "melody", "chorus", "sonata"],
              ["on stage", "in concert", "with orchestras", "for audiences"]),
    "finance": (["Bankers", "Investors", "Traders", "Brokers"], ["bought", "sold", "hedged", "valued"],
                ["bonds", "shares", "stocks", "futures"],
                ["at auction", "for profit", "on markets", "during trading"]),
    "medicine": (["Doctors", "Nurses", "Surgeons", "Pharmacists"], ["treated", "examined", "vaccinated", "diagnosed"],
                 ["patient", "infection", "fever", "wound"],
                 ["in hospitals", "with antibiotics", "after surgery", "during checkups"]),
    "sailing": (["Sailors", "Captains", "Fishermen", "Pirates"], ["steered", "anchored", "rowed", "boarded"],
                ["ship", "vessel", "yacht", "schooner"],
                ["across oceans", "at harbor", "through storms", "near reefs"]),
}
TYPE_NAMES = list(TYPES)
NUM_TYPES = len(TYPES)
# --lag 0: successors of each type: five ambiguous (two successors, p = 1/2) and three deterministic (one successor).
# The sets overlap (2 -> {3, 4} and 3 -> {4, 5}; 5 -> {6, 7} and 6 -> {7, 0}), so an argmax plan can be
# the same for two types whose other successor differs.
SUCCESSORS = {0: (1, 2), 1: (3,), 2: (3, 4), 3: (4, 5), 4: (6,), 5: (6, 7), 6: (7, 0), 7: (0,)}


def transition_matrix() -> np.ndarray:
    """(types, types) true p(next type | type)."""
    matrix = np.zeros((NUM_TYPES, NUM_TYPES))
    for source, nexts in SUCCESSORS.items():
        matrix[source, list(nexts)] = 1.0 / len(nexts)
    return matrix


START = np.full(NUM_TYPES, 1.0 / NUM_TYPES)  # the first sentence's type


# The lag regime: the first `lag` sentences of an article have uniform random types; after them, the type of
# sentence j is one of two successors of the type of sentence j - lag, p = 1/2 each. With the LM's window
# shorter than `lag` sentences, only the planner (which reads the whole article) can know those two.
LAG_SUCCESSORS = {t: ((t + 1) % NUM_TYPES, (t + 2) % NUM_TYPES) for t in range(NUM_TYPES)}
TOKENS_PER_SENTENCE = 7  # opener verb the noun preposition word .


def make_articles(num_articles: int, min_sentences: int, max_sentences: int, seed: int, lag: int = 0,
                  successors: dict = LAG_SUCCESSORS) -> list[dict]:
    """Articles {id, title, text, types}; the types are the known answer, the rest is what prepare reads.
    ``successors``: the types that may follow each type ``lag`` sentences later (uniformly)."""
    rng = np.random.default_rng(seed)
    matrix = transition_matrix()
    articles = []
    for index in range(num_articles):
        length = int(rng.integers(min_sentences, max_sentences + 1))
        types = [int(rng.choice(NUM_TYPES, p=START))]
        while len(types) < length:
            if lag == 0:
                types.append(int(rng.choice(NUM_TYPES, p=matrix[types[-1]])))
            elif len(types) < lag:
                types.append(int(rng.integers(NUM_TYPES)))
            else:
                types.append(int(rng.choice(successors[types[-lag]])))
        sentences = []
        for kind in types:
            openers, verbs, nouns, tails = TYPES[TYPE_NAMES[kind]]
            sentences.append(f"{rng.choice(openers)} {rng.choice(verbs)} the {rng.choice(nouns)} {rng.choice(tails)}.")
        articles.append({"id": f"mech-{index}", "title": f"Mechanism {index}", "text": " ".join(sentences),
                         "types": types})
    return articles


def type_probs(split, types: np.ndarray, lag: int, window: bool = False,
               successors: dict = LAG_SUCCESSORS) -> np.ndarray:
    """(N_sent, types) the true p(type of sentence j | all earlier sentences); with ``window``, given only
    what fits in the LM's window (the same for lag = 0, where the previous sentence decides)."""
    sentence_offsets = np.asarray(split.sentence_offsets)
    local = np.arange(split.num_sentences) - sentence_offsets[split.sentence_article]  # index in the article
    probs = np.empty((split.num_sentences, NUM_TYPES))
    if lag == 0:
        probs[:] = transition_matrix()[types[np.maximum(np.arange(split.num_sentences) - 1, 0)]]
        probs[local == 0] = START
        return probs
    probs[:] = 1.0 / NUM_TYPES
    if not window:
        for j in np.flatnonzero(local >= lag):
            probs[j] = 0.0
            nexts = list(successors[int(types[j - lag])])
            probs[j, nexts] = 1.0 / len(nexts)
    return probs


def write_corpus(path: Path, articles: list[dict]) -> None:
    """JSONL for prepare; rewritten only when it changes (prepare keys its reuse on the file's mtime)."""
    text = "".join(json.dumps({k: a[k] for k in ("id", "title", "text")}) + "\n" for a in articles)
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def build_tokenizer(folder: Path) -> str:
    """A word-level fast tokenizer over the corpus's closed vocabulary (offsets from the pre-tokenizer)."""
    if (folder / "tokenizer.json").is_file():
        return str(folder)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"the", "."}
    for parts in TYPES.values():
        for group in parts:
            for phrase in group:
                words.update(phrase.split())
    vocab = {"[PAD]": 0, "[UNK]": 1, **{word: i + 2 for i, word in enumerate(sorted(words))}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()  # words and punctuation apart, with offsets
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(folder)
    return str(folder)


# ---------------------------------------------------------------------------------------------- helpers
class Clock:
    """Wall time per stage of this invocation (reused stages take about nothing)."""

    def __init__(self):
        self.start, self.stages = time.time(), {}

    def __call__(self, name: str, fn, *args, **kwargs):
        began = time.time()
        result = fn(*args, **kwargs)
        self.stages[name] = self.stages.get(name, 0.0) + time.time() - began
        return result


def true_types(split, types_by_id: dict[str, list[int]]) -> np.ndarray:
    """(N_sent,) true type of every sentence of a prepared split, checked against spaCy's sentence count."""
    types = np.concatenate([np.asarray(types_by_id[article["id"]]) for article in split.articles])
    if len(types) != split.num_sentences:
        raise SystemExit(f"{split.path}: spaCy found {split.num_sentences} sentences where the corpus has "
                         f"{len(types)}; the templates must split into exactly one sentence each")
    return types


def purity(clusters: np.ndarray, types: np.ndarray, num_clusters: int) -> tuple[float, np.ndarray]:
    counts = np.zeros((NUM_TYPES, num_clusters))
    np.add.at(counts, (types, clusters), 1)
    return float(counts.max(0).sum() / counts.sum()), counts


def bayes_optimum(split, types: np.ndarray, confusion: np.ndarray, horizon: int, lag: int,
                  successors: dict = LAG_SUCCESSORS) -> dict[str, list[float]]:
    """Per step t, teacher-forced as the planner is scored: expected top-1 accuracy and NLL, on this split's
    boundaries, of the Bayes-optimal predictor of the cluster of sentence j = s + t - 1 given the true types
    of the sentences before j, p(cluster) = p(type | history) C, with C = p(cluster | type) counted on the
    train split. Exact when the clustering is pure; with impure clusters a planner that sees only the
    earlier clusters (steps t > 1) cannot quite reach it."""
    article_end = np.asarray(split.sentence_offsets[1:])[split.sentence_article]
    clusters = np.asarray(split.actions)
    cluster_probs = type_probs(split, types, lag, successors=successors) @ confusion  # (N_sent, clusters)
    accuracy, nll = [], []
    for step in range(horizon):
        targets = np.flatnonzero(np.arange(split.num_sentences) + step < article_end) + step  # sentences j
        probs = cluster_probs[targets]
        accuracy.append(float(probs.max(1).mean()))
        nll.append(float(-np.log(probs[np.arange(len(targets)), clusters[targets]]).mean()))
    return {"top1": accuracy, "nll": nll}


def lm_floor(split, types: np.ndarray, lag: int, successors: dict = LAG_SUCCESSORS) -> dict[str, float]:
    """Test perplexity of the ideal LM, known exactly: each slot of a sentence is a uniform choice of 4 words
    given its type ("the", the tail's second word and "." are determined), each article's first token is not
    scored, and a sentence's first word also pays -log p(type | what the LM knows): nothing more with oracle
    plans; the true distribution given the whole article before it with ideal planner plans (sampled, K
    large); given its window alone without plans (lag = 0: the same as with plans, the window holds the
    previous sentence)."""
    lengths = np.diff(np.asarray(split.sentence_offsets))
    tokens = np.diff(np.asarray(split.token_offsets)) - 1
    if not (tokens + 1 == TOKENS_PER_SENTENCE * lengths).all():
        raise SystemExit(f"{split.path}: expected {TOKENS_PER_SENTENCE} tokens per sentence; the templates or the "
                         f"tokenizer changed")
    oracle = (4 * lengths - 1) * np.log(4)
    following = np.setdiff1d(np.arange(split.num_sentences), np.asarray(split.sentence_offsets[:-1]))
    floors = {"oracle": float(np.exp(oracle.sum() / tokens.sum()))}
    for name, window in (("planner", False), ("none", True)):
        probs = type_probs(split, types, lag, window=window, successors=successors)[following, types[following]]
        extra = np.bincount(split.sentence_article[following], weights=-np.log(probs), minlength=len(lengths))
        floors[name] = float(np.exp((oracle + extra).sum() / tokens.sum()))
    return floors


PAIRED_INTERVALS = ("95% intervals: per seed, a paired bootstrap over test documents; pooled, the seed-noise "
                    "interval of `planlm compare` (a t quantile on S - 1 degrees of freedom over seeds, in "
                    "quadrature with the bootstrap over documents)")


def paired(eval_dirs_a: list[Path], eval_dirs_b: list[Path], samples: int) -> dict:
    """ppl(B) - ppl(A), paired on the same articles: one seed, a bootstrap over source documents; several seeds
    (the i-th of A paired with the i-th of B), the mean of the seeds' differences with the seed-noise interval of
    ``planlm compare`` (``seeded_paired_interval``), so that it carries seed noise."""
    from planlm.evaluate.bootstrap import paired_bootstrap, read_per_article, seeded_paired_interval

    tables_a = [read_per_article(d) for d in eval_dirs_a]
    tables_b = [read_per_article(d) for d in eval_dirs_b]
    for table in tables_a[1:] + tables_b:
        assert (table["id"] == tables_a[0]["id"]).all() and (table["tokens"] == tables_a[0]["tokens"]).all()
    nll_a = np.stack([t["nll_sum"] for t in tables_a])  # (S, N_art)
    nll_b = np.stack([t["nll_sum"] for t in tables_b])
    sources = tables_a[0].get("source")
    if len(tables_a) == 1:
        return paired_bootstrap(nll_a[0], nll_b[0], tables_a[0]["tokens"], num_samples=samples, clusters=sources)
    return seeded_paired_interval(nll_a, nll_b, tables_a[0]["tokens"], num_samples=samples, clusters=sources)


def fmt_diff(result: dict) -> str:
    return f"{result['diff']:+.3f} [{result['ci_low']:+.3f}, {result['ci_high']:+.3f}]"


def excludes_zero(result: dict) -> bool:
    return result["ci_high"] < 0 or result["ci_low"] > 0


# ---------------------------------------------------------------------------------------------- main
CONDITIONS = ("none", "fixed", "argmax", "sampled", "ours", "oracle")


def condition_config(name: str, planner_dir: str, args, seed: int) -> dict:
    """The train-lm arguments (plans, adapter) of one condition of the benchmark."""
    from planlm.models.adapter import AdapterSettings
    from planlm.plans.config import PlanConfig

    sampled = dict(kind="planner_sampled", num_paths=args.num_paths, temperature=1.0, planner_dir=planner_dir,
                   seed=seed)
    plans = {"none": PlanConfig(kind="none"), "fixed": PlanConfig(kind="fixed"), "oracle": PlanConfig(kind="oracle"),
             "argmax": PlanConfig(kind="planner_argmax", num_paths=1, horizon=1, planner_dir=planner_dir),
             "sampled": PlanConfig(horizon=1, **sampled), "ours": PlanConfig(horizon=args.horizon, **sampled),
             # not in CONDITIONS: sampled's plans in expectation (K = 1), experiments/bench_expectation.py
             "expected": PlanConfig(horizon=1, **{**sampled, "num_paths": 1}, expectation=True)}[name]
    return {"plans": plans, "adapter": AdapterSettings(kind="multipath" if name == "ours" else "project_avg")}


def prepare_corpus(args, out: Path, clock: Clock) -> tuple[str, dict[str, list[int]]]:
    """Write the corpus and the word-level tokenizer, then prepare it (sentencizer, MiniLM, k-means into as
    many actions as there are types, the lowest inertia of --kmeans_restarts seeds): (prepared folder, the
    true types of every article by id)."""
    from planlm.data.artifacts import PreparedDataset
    from planlm.data.corpus import CorpusConfig
    from planlm.data.kmeans import ActionsConfig
    from planlm.data.prepare import prepare

    total = args.train_articles + args.validation_articles + args.test_articles
    articles = make_articles(total, args.sentences[0], args.sentences[1], args.corpus_seed, args.lag, args.successors)
    write_corpus(out / "corpus.jsonl", articles)
    tokenizer = build_tokenizer(out / "tokenizer")
    prepared_dir = str(out / "prepared")
    corpus = CorpusConfig(source=str(out / "corpus.jsonl"), num_train=args.train_articles,
                          num_validation=args.validation_articles, num_test=args.test_articles, seed=0)

    def prepare_with(kmeans_seed: int) -> float:
        clock("prepare", prepare, out_dir=prepared_dir, corpus=corpus, tokenizer=tokenizer,
              actions=ActionsConfig(num_actions=NUM_TYPES, seed=kmeans_seed))
        return float(PreparedDataset(prepared_dir).manifest["kmeans"]["inertia_per_sentence"])

    # k-means restarts, the best kept by inertia (never by purity, which reads the answer): a single k-means++
    # start merges two of the 8 types and splits another about one time in three on this corpus. A changed
    # k-means seed only refits k-means and re-tokenises; prepare keeps the embeddings.
    restarts_file = out / "kmeans_restarts.json"
    key = json.dumps([vars(args)[k] for k in ("train_articles", "validation_articles", "test_articles",
                                              "sentences", "corpus_seed", "lag")]
                     + ([args.lag_successors] if args.lag_successors != "pairs" else []))
    inertias = json.loads(restarts_file.read_text()) if restarts_file.is_file() else {}
    inertias = inertias if inertias.get("key") == key else {"key": key, "inertia": {}}
    for kmeans_seed in range(args.kmeans_restarts):
        if str(kmeans_seed) not in inertias["inertia"]:
            inertias["inertia"][str(kmeans_seed)] = prepare_with(kmeans_seed)
            restarts_file.write_text(json.dumps(inertias))
    best_seed = int(min(inertias["inertia"], key=lambda s: (inertias["inertia"][s], int(s))))
    prepare_with(best_seed)  # reused when the folder already holds it
    return prepared_dir, {a["id"]: a["types"] for a in articles}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv``, default sys.argv), with what follows from --lag and --quick and the
    library's default multipath_lr_scale filled in."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default="runs/bench_mechanism")
    parser.add_argument("--quick", action="store_true",
                        help="development size: 300 train articles, 1 seed unless --seeds, 1+1 epochs, K sweep 1/10")
    parser.add_argument("--train_articles", type=int, default=1500)
    parser.add_argument("--test_articles", type=int, default=200)
    parser.add_argument("--validation_articles", type=int, default=100)
    parser.add_argument("--lag", type=int, default=6,
                        help="0: Markov chain over types (the LM's window holds all the planner knows: a control); "
                             "L > 0: a sentence's type depends on the sentence L back, beyond the LM's window")
    parser.add_argument("--lag_successors", choices=["pairs", "mixed"], default="pairs",
                        help="with --lag > 0: pairs (every type two successors, p = 1/2) or mixed (the --lag 0 "
                             "successor sets: five types with two, three with one, so some boundaries are "
                             "deterministic for the planner; experiments/bench_adaptive.py)")
    parser.add_argument("--sentences", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                        help="sentences per article (default: 6 12 at lag 0, 12 20 otherwise)")
    parser.add_argument("--context_length", type=int, default=None,
                        help="LM window in tokens, training and evaluation (default: 128 at lag 0, else the longest "
                             "window that cannot reach the sentence lag back)")
    parser.add_argument("--corpus_seed", type=int, default=0)
    parser.add_argument("--kmeans_restarts", type=int, default=3,
                        help="k-means seeds tried; the lowest inertia is kept")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="LM training seeds (default 0 1 2; --quick: 0)")
    parser.add_argument("--n_layer", type=int, default=2)
    parser.add_argument("--n_embd", type=int, default=64)
    parser.add_argument("--base_epochs", type=int, default=2, help="epochs of each seed's plain base LM")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of each condition, from its seed's base LM")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--clip", type=float, default=1.0, help="gradient-norm clipping of the conditions (0: none)")
    parser.add_argument("--multipath_lr_scale", type=float, default=None,
                        help="rate of the multipath adapter's transformers / the adapter's (default: the library's)")
    parser.add_argument("--tag", default="", help="train and evaluate the LMs under <out_dir>/<tag> (a recipe variant "
                                                  "that shares the corpus and the planner)")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--num_paths", type=int, default=10, help="K of the sampled condition and of ours")
    parser.add_argument("--horizon", type=int, default=3, help="T of ours (and of the planner)")
    parser.add_argument("--planner_epochs", type=int, default=60)
    parser.add_argument("--planner_d_model", type=int, default=64)
    parser.add_argument("--planner_layers", type=int, default=1)
    parser.add_argument("--planner_lr", type=float, default=1e-3)
    parser.add_argument("--planner_dir", default=None, help="planner folder (default <out_dir>/planner)")
    parser.add_argument("--planner_only", action="store_true", help="stop after the planner's table")
    parser.add_argument("--k_sweep", type=int, nargs="+", default=[1, 2, 5, 10, 20])
    parser.add_argument("--bootstrap_samples", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per process: these tiny models gain little from a second thread, and "
                             "on shared cores two threads spin-wait (a 2 x 64 LM step: 52 ms of CPU with 1 thread, "
                             "1 s with 2)")
    parser.add_argument("--workers", type=int, default=2,
                        help="seeds trained side by side in this many processes (each with --threads threads); "
                             "the results do not depend on it")
    args = parser.parse_args(argv)
    args.sentences = args.sentences or ([6, 12] if args.lag == 0 else [12, 20])
    args.seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    # mixed: the lag relation takes the Markov chain's successor sets
    args.successors = SUCCESSORS if args.lag_successors == "mixed" else LAG_SUCCESSORS
    # The sentence lag back must be out of reach: its last content word is 7 (lag - 1) + 2 tokens before
    # the first word of the sentence it decides, and a window reads at most context_length - 1 tokens.
    reach = TOKENS_PER_SENTENCE * (args.lag - 1) + 2
    args.context_length = args.context_length or (128 if args.lag == 0 else reach)
    if args.lag and args.context_length - 1 >= reach:
        parser.error(f"--context_length {args.context_length} lets the LM read the sentence --lag {args.lag} back; "
                     f"use at most {reach}")
    if args.quick:
        args.train_articles, args.test_articles, args.validation_articles = 300, 60, 30
        args.base_epochs, args.epochs, args.planner_epochs = 1, 1, 3
        args.k_sweep = [1, 10]
    if args.multipath_lr_scale is None:
        from planlm.train.lm_module import MULTIPATH_LR_SCALE

        args.multipath_lr_scale = MULTIPATH_LR_SCALE
    return args


def close_report(targets: list, lines: list[str], say, clock, workers: int, minutes: int, path: Path) -> None:
    """Add the time target (this invocation's wall time under ``minutes``), list every target as PASS or FAIL,
    print the report and write it to ``path``."""
    elapsed = time.time() - clock.start
    cpu = sum(usage.ru_utime + usage.ru_stime for usage in (resource.getrusage(resource.RUSAGE_SELF),
                                                          resource.getrusage(resource.RUSAGE_CHILDREN)))
    stage_times = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in clock.stages.items())
    targets.append((f"the whole run under {minutes} minutes", elapsed < minutes * 60,
                    f"{elapsed / 60:.1f} min wall in this invocation ({stage_times}, summed over up to {workers} "
                    f"processes; reused stages count ~0), {cpu / 60:.1f} min of CPU time on {os.cpu_count()} cores"))
    say("\n## Targets\n")
    for name, ok, detail in targets:
        say(f"- {'PASS' if ok else 'FAIL'}: {name}: {detail}")
    print("\n".join(lines))
    path.write_text("\n".join(lines).lstrip("\n") + "\n")


def main() -> None:
    args = parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from planlm.data.resources import use_offline_mode_if_no_hub

    use_offline_mode_if_no_hub()
    from planlm.data.artifacts import PreparedDataset

    out, clock = Path(args.out_dir), Clock()
    # 1. prepare, then the purity of the clustering against the true types
    prepared_dir, types_by_id = prepare_corpus(args, out, clock)
    prepared = PreparedDataset(prepared_dir)
    splits = {name: prepared.split(name) for name in ("train", "test")}
    types = {name: true_types(split, types_by_id) for name, split in splits.items()}
    score, counts = purity(np.asarray(splits["train"].actions), types["train"], prepared.num_actions)
    test_score, _ = purity(np.asarray(splits["test"].actions), types["test"], prepared.num_actions)
    confusion = (counts + 1e-3) / (counts + 1e-3).sum(1, keepdims=True)  # p(cluster | type), train split

    # 2. planner against the Bayes optimum given the clustering
    planner_dir = train_mechanism_planner(args, prepared_dir, clock)
    summary = planner_test_metrics(prepared, planner_dir, args.horizon)
    optimum = bayes_optimum(splits["test"], types["test"], confusion, args.horizon, args.lag, args.successors)
    floor = lm_floor(splits["test"], types["test"], args.lag, args.successors)

    if args.planner_only:
        print("\n".join(planner_table(args, prepared, score, test_score, summary, optimum)[0]))
        return

    # 3. LM conditions, per seed from that seed's base LM; seeds share nothing but the argmax plan cache
    # (its sampling has no seed), which train-lm's own cache step builds here before the seeds run side by side
    from planlm.train.lm import _training_plans

    _training_plans(condition_config("argmax", planner_dir, args, 0)["plans"].resolve(), prepared,
                    ["train", "validation"])
    jobs = [(args, seed, prepared_dir, planner_dir) for seed in args.seeds]
    if args.workers > 1 and len(jobs) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(args.workers, len(jobs)), mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(train_seed, *zip(*jobs)))
    else:
        results = [train_seed(*job) for job in jobs]
    eval_dirs = {name: [r["eval_dirs"][name] for r in results] for name in CONDITIONS}
    metrics = {name: [r["metrics"][name] for r in results] for name in CONDITIONS}
    sweep_dirs = [r["sweep_dir"] for r in results]
    for result in results:
        for stage, seconds in result["stages"].items():
            clock.stages[stage] = clock.stages.get(stage, 0.0) + seconds
    report(args, prepared, score, test_score, counts, summary, optimum, floor, metrics, eval_dirs, sweep_dirs, clock)


def train_mechanism_planner(args, prepared_dir: str, clock: Clock) -> str:
    """The benchmark's planner (reused when trained): its folder."""
    from planlm.models.planner import PlannerSettings
    from planlm.train.planner import PlannerTrainArgs, train_planner

    planner_dir = args.planner_dir or str(Path(args.out_dir) / "planner")
    clock("train-planner", train_planner, prepared_dir=prepared_dir, out_dir=planner_dir,
          model=PlannerSettings(d_model=args.planner_d_model, num_heads=2, dim_feedforward=2 * args.planner_d_model,
                             num_layers=args.planner_layers, horizon=args.horizon),
          train=PlannerTrainArgs(batch_size=128, lr=args.planner_lr, max_epochs=args.planner_epochs))
    return planner_dir


def planner_test_metrics(prepared, planner_dir: str, horizon: int) -> dict:
    """The planner's and the baselines' per-step metrics on the test split (the planner's summary holds them on
    validation)."""
    from planlm.models.planner import Planner
    from planlm.train.planner_metrics import baseline_metrics, evaluate_planner

    planner, test = Planner.from_pretrained(planner_dir), prepared.split("test")
    metrics = evaluate_planner(planner, test, horizon, 512)
    metrics.update(baseline_metrics(prepared.split(prepared.planner_split), test, horizon, prepared.num_actions))
    return metrics


def lm_window(args) -> dict:
    """The LM's window, in training and evaluation alike: with other strides this small LM, which learned on
    those windows only, scores worse however long its context (measured at lag 6)."""
    return {"context_length": args.context_length, "stride": args.context_length - 1}


def train_base(args, seed: int, prepared_dir: str, clock: Clock) -> Path:
    """A seed's plain base LM (--base_epochs), the start of every condition of that seed: its folder."""
    from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm

    base_dir = Path(args.out_dir) / args.tag / "lm" / f"_base-seed{seed}"
    lm_model = {"model_type": "gpt2", "n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": 2,
                "n_positions": args.context_length}
    clock("train-lm", train_lm, prepared_dir=prepared_dir, out_dir=str(base_dir),
          model=LMModelConfig(model_config=lm_model),
          train=LMTrainConfig(batch_size=args.batch_size, lr=args.lr, max_epochs=args.base_epochs,
                              warmup_steps=20, seed=seed, log_every_n_steps=10, **lm_window(args)))
    return base_dir


def train_condition(args, name: str, seed: int, prepared_dir: str, planner_dir: str, base_dir: Path,
                    clock: Clock, adapter=None, condition: dict | None = None) -> tuple[Path, dict]:
    """One condition of a seed, from its base LM (--epochs), evaluated on the test split: (its evaluation
    folder, metrics). ``adapter``: AdapterSettings instead of the condition's own (a recipe variant);
    ``condition``: {plans, adapter} of a condition this benchmark does not name (bench_lookahead.py's grid)."""
    from planlm.evaluate.perplexity import evaluate
    from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm

    out = Path(args.out_dir) / args.tag
    model_dir, eval_dir = out / "lm" / f"{name}-seed{seed}", out / "eval" / f"{name}-seed{seed}"
    condition = dict(condition or condition_config(name, planner_dir, args, seed))
    condition["adapter"] = adapter or condition["adapter"]
    clock("train-lm", train_lm, prepared_dir=prepared_dir, out_dir=str(model_dir),
          model=LMModelConfig(init_from=str(base_dir)), **condition,
          train=LMTrainConfig(batch_size=args.batch_size, lr=args.lr, max_epochs=args.epochs, warmup_steps=5, gradient_clip_val=args.clip or None,
                              multipath_lr_scale=args.multipath_lr_scale, seed=seed,
                              log_every_n_steps=10, **lm_window(args)))
    metrics = clock("evaluate", evaluate, model_dir=str(model_dir), prepared_dir=prepared_dir, out_dir=str(eval_dir),
                    split="test", batch_size=64, **lm_window(args), bootstrap_samples=args.bootstrap_samples)
    return eval_dir, metrics


def train_seed(args, seed: int, prepared_dir: str, planner_dir: str) -> dict:
    """One seed's base LM and conditions, each trained from that base LM, evaluated on the test split, and the
    sampled model's K sweep: {metrics, eval_dirs (per condition), sweep_dir, stages (seconds per stage)}."""
    import torch

    torch.set_num_threads(args.threads)  # a worker process starts with torch's default
    from planlm.evaluate.sweeps import sweep

    clock, out = Clock(), Path(args.out_dir) / args.tag
    base_dir = train_base(args, seed, prepared_dir, clock)
    metrics, eval_dirs = {}, {}
    for name in CONDITIONS:
        eval_dirs[name], metrics[name] = train_condition(args, name, seed, prepared_dir, planner_dir, base_dir, clock)
    sweep_dir = out / "sweeps" / f"sampled-seed{seed}"
    clock("sweep", sweep, model_dir=str(out / "lm" / f"sampled-seed{seed}"), prepared_dir=prepared_dir,
          out_dir=str(sweep_dir), kind="num_paths", num_paths=args.k_sweep, split="test", **lm_window(args),
          batch_size=64, bootstrap_samples=args.bootstrap_samples)
    return {"metrics": metrics, "eval_dirs": eval_dirs, "sweep_dir": sweep_dir, "stages": clock.stages}


def planner_table(args, prepared, score, test_score, summary, optimum) -> tuple[list[str], list]:
    """The corpus line, k-means purity and the planner against the Bayes optimum: (report lines, targets)."""
    targets: list[tuple[str, bool, str]] = []
    lines: list[str] = []

    def say(text: str = "") -> None:
        lines.append(text)
    n = prepared.manifest["counts"]
    say(f"\n# Mechanism benchmark ({args.out_dir})\n")
    regime = ("Markov chain over the types (5 with 2 successors at p=1/2, 3 with one)" if args.lag == 0 else
              f"the first {args.lag} sentences of an article uniform, then each type one of "
              f"{'2 successors (p=1/2)' if args.lag_successors == 'pairs' else 'the successors of the --lag 0 chain'} "
              f"of the type {args.lag} sentences back, beyond the LM's {args.context_length}-token window")
    say(f"corpus: {NUM_TYPES} sentence types; {regime}; "
          f"{n['train']['articles']}/{n['validation']['articles']}/{n['test']['articles']} train/val/test articles, "
          f"{n['train']['sentences']} train sentences, {n['train']['tokens']} train tokens; word-level "
          f"tokenizer ({prepared.manifest['tokenizer'].split('/')[-1]}), MiniLM sentence encoder, k-means "
          f"{prepared.num_actions} clusters")
    restarts = json.loads((Path(args.out_dir) / "kmeans_restarts.json").read_text())["inertia"]
    say(f"k-means purity (cluster vs true type): train {score:.4f}, test {test_score:.4f} (k-means seed "
          f"{prepared.manifest['config']['actions']['seed']}, the lowest inertia per sentence of "
          + ", ".join(f"{v:.4f}" for v in restarts.values()) + ")")

    say("\n## Planner (test boundaries) against the Bayes optimum given the clustering\n")
    say("| step (teacher-forced) | planner top-1 | optimum top-1 (expected) | bigram top-1 | planner NLL | "
        "optimum NLL | planner / optimum | bigram NLL |")
    say("|---|---|---|---|---|---|---|---|")
    planner = summary["planner_teacher_forced"]
    for step in range(len(optimum["nll"])):
        say(f"| {step + 1} | {planner['top1'][step]:.4f} | {optimum['top1'][step]:.4f} | "
              f"{summary['bigram']['top1'][step]:.4f} | {planner['nll'][step]:.4f} | {optimum['nll'][step]:.4f} | "
              f"{planner['nll'][step] / optimum['nll'][step]:.3f} | {summary['bigram']['nll'][step]:.4f} |")
    ratio = planner["nll"][0] / optimum["nll"][0]
    targets.append(("planner step-1 NLL within 10% of the optimum", ratio <= 1.10,
                    f"{planner['nll'][0]:.4f} vs {optimum['nll'][0]:.4f} ({100 * (ratio - 1):+.1f}%)"))

    return lines, targets


def report(args, prepared, score, test_score, counts, summary, optimum, floor, metrics, eval_dirs, sweep_dirs,
           clock) -> None:
    lines, targets = planner_table(args, prepared, score, test_score, summary, optimum)

    def say(text: str = "") -> None:
        lines.append(text)

    seeds = args.seeds
    say(f"\n## LM test perplexity, {len(seeds)} seed(s) (each condition from its seed's base LM, "
          f"{args.epochs} epoch(s) after {args.base_epochs} base epoch(s); lr {args.lr:g}, multipath "
          f"transformers at {args.multipath_lr_scale:g} of it, "
          f"gradient clipping {args.clip or 'none'})\n")
    say("| condition | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | pooled |")
    say("|---" * (len(seeds) + 3) + "|")
    from planlm.evaluate.bootstrap import read_per_article

    pooled = {}
    for name in CONDITIONS:
        ppls = [m.ppl for m in metrics[name]]
        tables = [read_per_article(d) for d in eval_dirs[name]]
        pooled[name] = float(np.exp(sum(t["nll_sum"].sum() for t in tables) / sum(t["tokens"].sum() for t in tables)))
        say(f"| {name} | " + " | ".join(f"{p:.4f}" for p in ppls) +
              f" | {np.mean(ppls):.4f} ± {np.std(ppls):.4f} | {pooled[name]:.4f} |")
    blank = " | ".join("" for _ in seeds)
    say(f"| ideal LM, no plan (known) | {blank} | | {floor['none']:.4f} |")
    say(f"| ideal LM, ideal planner plans (known) | {blank} | | {floor['planner']:.4f} |")
    say(f"| ideal LM, oracle plans (known) | {blank} | | {floor['oracle']:.4f} |")

    say(f"\n## Paired differences (ppl B - A, negative: B better; {PAIRED_INTERVALS})\n")
    pairs = [("none", "argmax"), ("argmax", "sampled"), ("sampled", "oracle"), ("none", "fixed"),
             ("sampled", "ours"), ("argmax", "ours"), ("none", "oracle")]
    say("| B - A | " + " | ".join(f"seed {s}" for s in seeds) + " | pooled |")
    say("|---" * (len(seeds) + 2) + "|")
    results = {}
    for a, b in pairs:
        per_seed = [paired([eval_dirs[a][i]], [eval_dirs[b][i]], args.bootstrap_samples) for i in range(len(seeds))]
        results[(a, b)] = paired(eval_dirs[a], eval_dirs[b], args.bootstrap_samples)
        say(f"| {b} - {a} | " + " | ".join(fmt_diff(r) for r in per_seed) + f" | {fmt_diff(results[(a, b)])} |")
    chain = [("none", "argmax"), ("argmax", "sampled"), ("sampled", "oracle")]
    ordered = all(results[pair]["ci_high"] < 0 for pair in chain)
    targets.append(("oracle < sampled < argmax < none, every pooled interval below 0", ordered,
                    "; ".join(f"{b} - {a} {fmt_diff(results[(a, b)])}" for a, b in chain)))

    say(f"\n## K sweep of the sampled model (trained with K = {args.num_paths}) at inference, paired\n")
    k_dirs = {k: [d / f"num_paths-{k:g}" for d in sweep_dirs] for k in args.k_sweep}
    say("| K | pooled ppl | - K=1 (pooled) | - previous K (pooled) |")
    say("|---|---|---|---|")
    worse = []
    for i, k in enumerate(args.k_sweep):
        tables = [read_per_article(d) for d in k_dirs[k]]
        ppl = float(np.exp(sum(t["nll_sum"].sum() for t in tables) / sum(t["tokens"].sum() for t in tables)))
        if i == 0:
            say(f"| {k} | {ppl:.4f} | | |")
            continue
        first = paired(k_dirs[args.k_sweep[0]], k_dirs[k], args.bootstrap_samples)
        step = paired(k_dirs[args.k_sweep[i - 1]], k_dirs[k], args.bootstrap_samples)
        if step["ci_low"] > 0:
            worse.append(f"K={args.k_sweep[i - 1]}->{k} {fmt_diff(step)}")
        say(f"| {k} | {ppl:.4f} | {fmt_diff(first)} | {fmt_diff(step)} |")
    targets.append((f"K sweep never significantly worse from one K to the next up to K = {max(args.k_sweep)}",
                    not worse, "; ".join(worse) or "no step's interval lies above 0"))

    close_report(targets, lines, say, clock, args.workers, 30, Path(args.out_dir) / args.tag / "report.md")


if __name__ == "__main__":
    main()
