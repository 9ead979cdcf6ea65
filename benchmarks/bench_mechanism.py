"""The plan channel on a corpus with a known answer: planner against the Bayes optimum, LM conditions paired over seeds.

The corpus is synthetic text in which the type of the next sentence follows a known Markov chain over
8 topical sentence types (weather, cooking, football, ...): five types have two successors with
p = 1/2 each (ambiguous boundaries), three have one (deterministic boundaries), and the successor sets
overlap, so one argmax action can stand for two different sets while K sampled paths tell them apart.
A sentence of a type is drawn from that type's own words ("Rain soaked the hills before dawn."), so the
sentence encoder separates the types. Everything after the corpus goes through the real stages:

1. ``planlm.prepare``: spaCy sentencizer, the offline MiniLM encoder, k-means with num_actions = 8, and a
   word-level tokenizer built here (``tokenizers`` WordLevel saved as a ``PreTrainedTokenizerFast``
   folder). Printed: k-means purity (cluster against true type).
2. ``planlm.train_planner``: step-1 (and step-t) accuracy and NLL beside the Bayes optimum given the
   clustering: p(next cluster | previous type) = (P^t C)[type, :], with P the true transition matrix and
   C = p(cluster | type) counted on the train split, scored on the same test boundaries.
3. ``planlm.train_lm`` + ``planlm.evaluate`` for none / fixed / argmax (T=1, K=1) / sampled (T=1, K=10) /
   ours (T=3, K=10, multipath) / oracle, once per seed, every condition of a seed starting from that
   seed's base LM with the same ``train.seed``; paired bootstrap intervals over test articles
   (``planlm.evaluate.bootstrap.paired_bootstrap``) per seed and pooled (NLL summed over seeds).
4. ``planlm.sweep``: K = 1, 2, 5, 10, 20 of the sampled model at inference, paired against K = 1.

Targets (issue 12, item 9), each printed PASS/FAIL: planner step-1 NLL within 10% of the optimum;
oracle < sampled < argmax < none with every pooled paired interval excluding 0; the K sweep never
significantly worse from one K to the next up to K = 20; the whole run under 30 minutes on 2 cores.

Every stage caches under ``--out_dir`` (the library's own stage reuse), so a rerun only does what is
missing; ``--epochs``, ``--seeds`` etc. retrain only what they change.

    python benchmarks/bench_mechanism.py                          # full size (the committed result)
    python benchmarks/bench_mechanism.py --quick --out_dir /tmp/mech   # minutes: small corpus, 1 seed
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

# ---------------------------------------------------------------------------------------------- corpus
# Each type: openers (the sentence's first word), verbs, nouns (after "the"), two-word tails.
TYPES = {
    "weather": (["Rain", "Wind", "Snow", "Thunder"], ["soaked", "battered", "covered", "shook"],
                ["hills", "valley", "meadows", "plains"], ["before dawn", "all night", "at noon", "since morning"]),
    "cooking": (["Chefs", "Cooks", "Bakers", "Grillers"], ["roasted", "seasoned", "sliced", "baked"],
                ["garlic", "bread", "onions", "salmon"], ["with butter", "for dinner", "in ovens", "over coals"]),
    "football": (["Strikers", "Goalkeepers", "Defenders", "Referees"], ["kicked", "blocked", "passed", "chased"],
                 ["ball", "penalty", "corner", "header"], ["near goal", "after halftime", "in stoppage", "during matches"]),
    "astronomy": (["Astronomers", "Telescopes", "Satellites", "Probes"], ["observed", "tracked", "photographed", "measured"],
                  ["comet", "nebula", "galaxy", "eclipse"], ["through lenses", "beyond Jupiter", "across orbits", "near Saturn"]),
    "music": (["Violinists", "Pianists", "Drummers", "Singers"], ["performed", "rehearsed", "composed", "recorded"],
              ["symphony", "melody", "chorus", "sonata"], ["on stage", "in concert", "with orchestras", "for audiences"]),
    "finance": (["Bankers", "Investors", "Traders", "Brokers"], ["bought", "sold", "hedged", "valued"],
                ["bonds", "shares", "stocks", "futures"], ["at auction", "for profit", "on markets", "during trading"]),
    "medicine": (["Doctors", "Nurses", "Surgeons", "Pharmacists"], ["treated", "examined", "vaccinated", "diagnosed"],
                 ["patient", "infection", "fever", "wound"], ["in hospitals", "with antibiotics", "after surgery", "during checkups"]),
    "sailing": (["Sailors", "Captains", "Fishermen", "Pirates"], ["steered", "anchored", "rowed", "boarded"],
                ["ship", "vessel", "yacht", "schooner"], ["across oceans", "at harbor", "through storms", "near reefs"]),
}
TYPE_NAMES = list(TYPES)
NUM_TYPES = len(TYPES)
# Successors of each type: five ambiguous (two successors, p = 1/2) and three deterministic (one successor).
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


def make_articles(num_articles: int, min_sentences: int, max_sentences: int, seed: int) -> list[dict]:
    """Articles {id, title, text, types}; the types are the known answer, the rest is what prepare reads."""
    rng = np.random.default_rng(seed)
    matrix = transition_matrix()
    articles = []
    for index in range(num_articles):
        length = int(rng.integers(min_sentences, max_sentences + 1))
        types = [int(rng.choice(NUM_TYPES, p=START))]
        while len(types) < length:
            types.append(int(rng.choice(NUM_TYPES, p=matrix[types[-1]])))
        sentences = []
        for kind in types:
            openers, verbs, nouns, tails = TYPES[TYPE_NAMES[kind]]
            sentences.append(f"{rng.choice(openers)} {rng.choice(verbs)} the {rng.choice(nouns)} {rng.choice(tails)}.")
        articles.append({"id": f"mech-{index}", "title": f"Mechanism {index}", "text": " ".join(sentences),
                         "types": types})
    return articles


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


def bayes_optimum(split, types: np.ndarray, confusion: np.ndarray, horizon: int) -> dict[str, list[float]]:
    """Per step t: expected top-1 accuracy and the NLL on this split's boundaries of the Bayes-optimal
    predictor of the cluster of sentence s + t - 1 given the true type of sentence s - 1 (the start
    distribution for an article's first sentence), with C = p(cluster | type) from the train split."""
    matrix = transition_matrix()
    first = np.zeros(split.num_sentences, dtype=bool)
    first[np.asarray(split.sentence_offsets[:-1])] = True
    article_end = np.asarray(split.sentence_offsets[1:])[split.sentence_article]
    clusters = np.asarray(split.actions)
    accuracy, nll = [], []
    power = np.eye(NUM_TYPES)
    for step in range(horizon):
        power = power @ matrix  # P^(step + 1)
        from_type = power @ confusion  # (types, clusters): previous type -> cluster step + 1 ahead
        from_start = START @ np.linalg.matrix_power(matrix, step) @ confusion  # (clusters,)
        boundaries = np.flatnonzero(np.arange(split.num_sentences) + step < article_end)
        targets = clusters[boundaries + step]
        previous = types[np.maximum(boundaries - 1, 0)]
        probs = np.where(first[boundaries][:, None], from_start[None, :], from_type[previous])  # (N, clusters)
        accuracy.append(float(probs.max(1).mean()))
        nll.append(float(-np.log(probs[np.arange(len(boundaries)), targets]).mean()))
    return {"top1": accuracy, "nll": nll}


def paired(eval_dirs_a: list[Path], eval_dirs_b: list[Path], samples: int) -> dict:
    """ppl(B) - ppl(A) with its paired bootstrap interval over articles; several seeds are pooled by
    summing each article's NLL over seeds (the pooled ppl is the geometric mean of the seeds')."""
    from planlm.evaluate.bootstrap import paired_bootstrap, read_per_article

    tables_a = [read_per_article(d) for d in eval_dirs_a]
    tables_b = [read_per_article(d) for d in eval_dirs_b]
    for table in tables_a[1:] + tables_b:
        assert (table["id"] == tables_a[0]["id"]).all() and (table["tokens"] == tables_a[0]["tokens"]).all()
    nll_a = np.sum([t["nll_sum"] for t in tables_a], axis=0)
    nll_b = np.sum([t["nll_sum"] for t in tables_b], axis=0)
    tokens = tables_a[0]["tokens"] * len(tables_a)
    return paired_bootstrap(nll_a, nll_b, tokens, num_samples=samples)


def fmt_diff(result: dict) -> str:
    return f"{result['diff']:+.3f} [{result['ci_low']:+.3f}, {result['ci_high']:+.3f}]"


def excludes_zero(result: dict) -> bool:
    return result["ci_high"] < 0 or result["ci_low"] > 0


# ---------------------------------------------------------------------------------------------- main
CONDITIONS = ("none", "fixed", "argmax", "sampled", "ours", "oracle")


def condition_config(name: str, planner_dir: str, args, seed: int) -> dict:
    if name == "none":
        return {"conditioning": "none"}
    if name == "fixed":
        return {"conditioning": "fixed"}
    if name == "argmax":
        return {"conditioning": "planner_argmax", "num_paths": 1, "horizon": 1, "planner_dir": planner_dir}
    if name == "sampled":
        return {"conditioning": "planner_sampled", "num_paths": args.num_paths, "horizon": 1,
                "temperature": 1.0, "planner_dir": planner_dir, "seed": seed}
    if name == "ours":
        return {"conditioning": "planner_sampled", "adapter": "multipath", "num_paths": args.num_paths,
                "horizon": args.horizon, "temperature": 1.0, "planner_dir": planner_dir, "seed": seed}
    if name == "oracle":
        return {"conditioning": "oracle"}
    raise ValueError(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out_dir", default="runs/bench_mechanism")
    parser.add_argument("--quick", action="store_true",
                        help="development size: 300 train articles, 1 seed, 1+1 epochs, K sweep 1/10")
    parser.add_argument("--train_articles", type=int, default=1500)
    parser.add_argument("--test_articles", type=int, default=200)
    parser.add_argument("--validation_articles", type=int, default=100)
    parser.add_argument("--sentences", type=int, nargs=2, default=[6, 12], metavar=("MIN", "MAX"))
    parser.add_argument("--corpus_seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="LM training seeds")
    parser.add_argument("--n_layer", type=int, default=2)
    parser.add_argument("--n_embd", type=int, default=64)
    parser.add_argument("--base_epochs", type=int, default=2, help="epochs of each seed's plain base LM")
    parser.add_argument("--epochs", type=int, default=4, help="epochs of each condition, from its seed's base LM")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--num_paths", type=int, default=10, help="K of the sampled condition and of ours")
    parser.add_argument("--horizon", type=int, default=3, help="T of ours (and of the planner)")
    parser.add_argument("--planner_epochs", type=int, default=15)
    parser.add_argument("--k_sweep", type=int, nargs="+", default=[1, 2, 5, 10, 20])
    parser.add_argument("--bootstrap_samples", type=int, default=1000)
    args = parser.parse_args()
    if args.quick:
        args.train_articles, args.test_articles, args.validation_articles = 300, 60, 30
        args.seeds, args.base_epochs, args.epochs, args.planner_epochs = args.seeds[:1], 1, 1, 3
        args.k_sweep = [1, 10]

    from planlm.data.resources import use_offline_mode_if_no_hub

    use_offline_mode_if_no_hub()
    from planlm.data.actions import ActionsConfig
    from planlm.data.artifacts import PreparedDataset
    from planlm.data.corpus import CorpusConfig
    from planlm.data.prepare import prepare
    from planlm.evaluate.perplexity import evaluate
    from planlm.evaluate.sweeps import sweep
    from planlm.planner import PlannerShape
    from planlm.train.lm import ConditioningConfig, LMModelConfig, LMTrainConfig, train_lm
    from planlm.train.planner import PlannerTrainArgs, train_planner

    out = Path(args.out_dir)
    clock = Clock()
    total = args.train_articles + args.validation_articles + args.test_articles
    articles = make_articles(total, args.sentences[0], args.sentences[1], args.corpus_seed)
    write_corpus(out / "corpus.jsonl", articles)
    tokenizer = build_tokenizer(out / "tokenizer")
    types_by_id = {a["id"]: a["types"] for a in articles}

    # 1. prepare: sentencizer, MiniLM, k-means into as many actions as there are types
    prepared_dir = str(out / "prepared")
    clock("prepare", prepare, out_dir=prepared_dir,
          corpus=CorpusConfig(source=str(out / "corpus.jsonl"), num_train=args.train_articles,
                              num_validation=args.validation_articles, num_test=args.test_articles, seed=0),
          actions=ActionsConfig(num_actions=NUM_TYPES), tokenizer=tokenizer, progress=False)
    prepared = PreparedDataset(prepared_dir)
    splits = {name: prepared.split(name) for name in ("train", "test")}
    types = {name: true_types(split, types_by_id) for name, split in splits.items()}
    score, counts = purity(np.asarray(splits["train"].actions), types["train"], prepared.num_actions)
    test_score, _ = purity(np.asarray(splits["test"].actions), types["test"], prepared.num_actions)
    confusion = (counts + 1e-3) / (counts + 1e-3).sum(1, keepdims=True)  # p(cluster | type), train split

    # 2. planner against the Bayes optimum given the clustering
    planner_dir = str(out / "planner")
    clock("train-planner", train_planner, prepared_dir=prepared_dir, out_dir=planner_dir,
          model=PlannerShape(d_model=64, num_heads=2, dim_feedforward=128, horizon=args.horizon),
          train=PlannerTrainArgs(batch_size=128, lr=1e-3, max_epochs=args.planner_epochs, eval_split="test",
                                 progress_bar=False))
    summary = json.loads((Path(planner_dir) / "summary.json").read_text())["metrics"]
    optimum = bayes_optimum(splits["test"], types["test"], confusion, args.horizon)

    # 3. LM conditions, per seed from that seed's base LM
    lm_model = {"model_type": "gpt2", "n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": 2, "n_positions": 128}
    eval_dirs: dict[str, list[Path]] = {name: [] for name in CONDITIONS}
    metrics: dict[str, list[dict]] = {name: [] for name in CONDITIONS}
    sweep_dirs: list[Path] = []
    for seed in args.seeds:
        base_dir = out / "lm" / f"_base-seed{seed}"
        clock("train-lm", train_lm, prepared_dir=prepared_dir, out_dir=str(base_dir),
              model=LMModelConfig(model_config=lm_model),
              train=LMTrainConfig(batch_size=args.batch_size, lr=args.lr, max_epochs=args.base_epochs,
                                  warmup_steps=20, seed=seed, progress_bar=False, log_every_n_steps=10))
        for name in CONDITIONS:
            model_dir = out / "lm" / f"{name}-seed{seed}"
            clock("train-lm", train_lm, prepared_dir=prepared_dir, out_dir=str(model_dir),
                  model=LMModelConfig(init_from=str(base_dir)),
                  conditioning=ConditioningConfig(**condition_config(name, planner_dir, args, seed)),
                  train=LMTrainConfig(batch_size=args.batch_size, lr=args.lr, max_epochs=args.epochs,
                                      warmup_steps=5, seed=seed, progress_bar=False, log_every_n_steps=10))
            eval_dir = out / "eval" / f"{name}-seed{seed}"
            metrics[name].append(clock("evaluate", evaluate, model_dir=str(model_dir), prepared_dir=prepared_dir,
                                       out_dir=str(eval_dir), split="test", stride=64, batch_size=64,
                                       bootstrap_samples=args.bootstrap_samples))
            eval_dirs[name].append(eval_dir)
        sweep_dir = out / "sweeps" / f"sampled-seed{seed}"
        clock("sweep", sweep, model_dir=str(out / "lm" / f"sampled-seed{seed}"), prepared_dir=prepared_dir,
              out_dir=str(sweep_dir), kind="num_paths", num_paths=args.k_sweep, split="test", stride=64,
              batch_size=64, bootstrap_samples=args.bootstrap_samples)
        sweep_dirs.append(sweep_dir)
    report(args, prepared, score, test_score, counts, summary, optimum, metrics, eval_dirs, sweep_dirs, clock)


def report(args, prepared, score, test_score, counts, summary, optimum, metrics, eval_dirs, sweep_dirs, clock) -> None:
    targets: list[tuple[str, bool, str]] = []
    n = prepared.manifest["counts"]
    print(f"\n# Mechanism benchmark ({args.out_dir})\n")
    print(f"corpus: {NUM_TYPES} sentence types (5 ambiguous with 2 successors at p=1/2, 3 deterministic); "
          f"{n['train']['articles']}/{n['validation']['articles']}/{n['test']['articles']} train/val/test articles, "
          f"{n['train']['sentences']} train sentences, {n['train']['tokens']} train tokens; word-level "
          f"tokenizer ({prepared.manifest['tokenizer'].split('/')[-1]}), MiniLM sentence encoder, k-means "
          f"{prepared.num_actions} clusters")
    print(f"k-means purity (cluster vs true type): train {score:.4f}, test {test_score:.4f}")

    print("\n## Planner (test boundaries) against the Bayes optimum given the clustering\n")
    print("| step | planner top-1 | optimum top-1 (expected) | bigram top-1 | planner NLL | optimum NLL | "
          "planner / optimum | bigram NLL |")
    print("|---|---|---|---|---|---|---|---|")
    planner = summary["planner_teacher_forced"]
    for step in range(len(optimum["nll"])):
        print(f"| {step + 1} | {planner['top1'][step]:.4f} | {optimum['top1'][step]:.4f} | "
              f"{summary['bigram']['top1'][step]:.4f} | {planner['nll'][step]:.4f} | {optimum['nll'][step]:.4f} | "
              f"{planner['nll'][step] / optimum['nll'][step]:.3f} | {summary['bigram']['nll'][step]:.4f} |")
    ratio = planner["nll"][0] / optimum["nll"][0]
    targets.append(("planner step-1 NLL within 10% of the optimum", ratio <= 1.10,
                    f"{planner['nll'][0]:.4f} vs {optimum['nll'][0]:.4f} ({100 * (ratio - 1):+.1f}%)"))

    seeds = args.seeds
    print(f"\n## LM test perplexity, {len(seeds)} seed(s) (each condition from its seed's base LM, "
          f"{args.epochs} epoch(s) after {args.base_epochs} base epoch(s))\n")
    print("| condition | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | pooled |")
    print("|---" * (len(seeds) + 3) + "|")
    from planlm.evaluate.bootstrap import read_per_article

    pooled = {}
    for name in CONDITIONS:
        ppls = [m["ppl"] for m in metrics[name]]
        tables = [read_per_article(d) for d in eval_dirs[name]]
        pooled[name] = float(np.exp(sum(t["nll_sum"].sum() for t in tables) / sum(t["tokens"].sum() for t in tables)))
        print(f"| {name} | " + " | ".join(f"{p:.4f}" for p in ppls) +
              f" | {np.mean(ppls):.4f} ± {np.std(ppls):.4f} | {pooled[name]:.4f} |")

    print("\n## Paired differences (ppl B - A, 95% paired bootstrap over test articles; negative: B better)\n")
    pairs = [("none", "argmax"), ("argmax", "sampled"), ("sampled", "oracle"), ("none", "fixed"),
             ("sampled", "ours"), ("argmax", "ours"), ("none", "oracle")]
    print("| B - A | " + " | ".join(f"seed {s}" for s in seeds) + " | pooled |")
    print("|---" * (len(seeds) + 2) + "|")
    results = {}
    for a, b in pairs:
        per_seed = [paired([eval_dirs[a][i]], [eval_dirs[b][i]], args.bootstrap_samples) for i in range(len(seeds))]
        results[(a, b)] = paired(eval_dirs[a], eval_dirs[b], args.bootstrap_samples)
        print(f"| {b} - {a} | " + " | ".join(fmt_diff(r) for r in per_seed) + f" | {fmt_diff(results[(a, b)])} |")
    chain = [("none", "argmax"), ("argmax", "sampled"), ("sampled", "oracle")]
    ordered = all(results[pair]["ci_high"] < 0 for pair in chain)
    targets.append(("oracle < sampled < argmax < none, every pooled interval below 0", ordered,
                    "; ".join(f"{b} - {a} {fmt_diff(results[(a, b)])}" for a, b in chain)))

    print(f"\n## K sweep of the sampled model (trained with K = {args.num_paths}) at inference, paired\n")
    k_dirs = {k: [d / f"num_paths-{k:g}" for d in sweep_dirs] for k in args.k_sweep}
    print("| K | pooled ppl | - K=1 (pooled) | - previous K (pooled) |")
    print("|---|---|---|---|")
    worse = []
    for i, k in enumerate(args.k_sweep):
        tables = [read_per_article(d) for d in k_dirs[k]]
        ppl = float(np.exp(sum(t["nll_sum"].sum() for t in tables) / sum(t["tokens"].sum() for t in tables)))
        if i == 0:
            print(f"| {k} | {ppl:.4f} | | |")
            continue
        first = paired(k_dirs[args.k_sweep[0]], k_dirs[k], args.bootstrap_samples)
        step = paired(k_dirs[args.k_sweep[i - 1]], k_dirs[k], args.bootstrap_samples)
        if step["ci_low"] > 0:
            worse.append(f"K={args.k_sweep[i - 1]}->{k} {fmt_diff(step)}")
        print(f"| {k} | {ppl:.4f} | {fmt_diff(first)} | {fmt_diff(step)} |")
    targets.append((f"K sweep never significantly worse from one K to the next up to K = {max(args.k_sweep)}",
                    not worse, "; ".join(worse) or "no step's interval lies above 0"))

    elapsed = time.time() - clock.start
    stage_times = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in clock.stages.items())
    targets.append(("the whole run under 30 minutes", elapsed < 1800,
                    f"{elapsed / 60:.1f} min in this invocation ({stage_times}); reused stages count ~0"))
    print("\n## Targets\n")
    for name, ok, detail in targets:
        print(f"- {'PASS' if ok else 'FAIL'}: {name}: {detail}")


if __name__ == "__main__":
    main()
