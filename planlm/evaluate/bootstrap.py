"""Bootstrap confidence intervals over articles, and the ``compare`` command (paired bootstrap).

Perplexity is a ratio estimator, exp(sum of NLL / sum of scored tokens), so the articles are
resampled with replacement and the ratio is recomputed on every resample (not a mean of
per-article perplexities). Two evaluations of the same articles are compared by resampling the
same article indices for both (paired bootstrap): most article-to-article variance cancels.

Resamples are drawn as multinomial article counts, (R, N_art) integers, so one resample is one
matrix-vector product.

Runs with several training seeds add a second source of noise: the same recipe trained again gives
another model. ``seeded_paired_bootstrap`` is a two-level bootstrap that carries it: every resample
draws the training seeds with replacement and, independently, the articles (one article draw shared by
the drawn seeds: the test articles are the same for every seed, so their noise does not average out
over seeds). With one seed, seed noise cannot be estimated and the interval is over articles alone.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from planlm.utils import PlanlmError, write_json

PER_ARTICLE = "per_article.csv"
PER_ARTICLE_FIELDS = ("article", "id", "nll_sum", "tokens")


def _resample_counts(num_items: int, num_samples: int, seed: int) -> np.ndarray:
    """(R, N) how often each item is drawn in each of R resamples of size N."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(num_items, np.full(num_items, 1.0 / num_items), size=num_samples)


def _interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(values, [alpha, 1.0 - alpha])
    return float(low), float(high)


def _check(num_samples: int, confidence: float) -> None:
    if num_samples < 1:
        raise PlanlmError(f"--bootstrap_samples must be >= 1 (got {num_samples})")
    if not 0.0 < confidence < 1.0:
        raise PlanlmError(f"--confidence must be in (0, 1) (got {confidence})")


def perplexity(nll_sums: np.ndarray, token_counts: np.ndarray) -> float:
    """exp(total NLL / total scored tokens)."""
    return float(np.exp(np.sum(nll_sums) / np.sum(token_counts)))


def bootstrap_perplexity(nll_sums: np.ndarray, token_counts: np.ndarray, num_samples: int = 1000,
                         confidence: float = 0.95, seed: int = 0) -> dict[str, float]:
    """Perplexity and its percentile bootstrap CI over articles (ratio estimator).

    nll_sums (N_art,) summed NLL of each article; token_counts (N_art,) scored tokens of each.
    """
    _check(num_samples, confidence)
    nll_sums = np.asarray(nll_sums, dtype=np.float64)
    token_counts = np.asarray(token_counts, dtype=np.float64)
    if len(nll_sums) == 0 or token_counts.sum() == 0:
        raise PlanlmError("no scored tokens: the evaluation split (or --max_articles) selects no article with >= 2 tokens")
    counts = _resample_counts(len(nll_sums), num_samples, seed)  # (R, N_art)
    with np.errstate(invalid="ignore", divide="ignore"):
        ppl = np.exp((counts @ nll_sums) / (counts @ token_counts))  # (R,)
    ppl = ppl[np.isfinite(ppl)]  # a resample of only token-less articles has no ratio
    low, high = _interval(ppl, confidence)
    return {"ppl": perplexity(nll_sums, token_counts), "ci_low": low, "ci_high": high,
            "confidence": confidence, "bootstrap_samples": num_samples}


def bootstrap_mean(values: np.ndarray, num_samples: int = 1000, confidence: float = 0.95,
                   seed: int = 0) -> dict[str, float]:
    """Mean of ``values`` (N,) with a percentile bootstrap CI."""
    _check(num_samples, confidence)
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        raise PlanlmError("nothing to average: no evaluated item")
    counts = _resample_counts(len(values), num_samples, seed)
    means = counts @ values / len(values)
    low, high = _interval(means, confidence)
    return {"mean": float(values.mean()), "ci_low": low, "ci_high": high, "confidence": confidence,
            "bootstrap_samples": num_samples}


def paired_bootstrap(nll_a: np.ndarray, nll_b: np.ndarray, token_counts: np.ndarray, num_samples: int = 1000,
                     confidence: float = 0.95, seed: int = 0) -> dict[str, float]:
    """Paired bootstrap of ppl(B) - ppl(A) over the same articles (negative: B is better).

    ``p_value`` is the two-sided fraction of resamples whose difference has the other sign than
    the observed one (doubled, capped at 1): a bootstrap p-value-ish number, not an exact test.
    """
    _check(num_samples, confidence)
    nll_a, nll_b = np.asarray(nll_a, np.float64), np.asarray(nll_b, np.float64)
    token_counts = np.asarray(token_counts, np.float64)
    counts = _resample_counts(len(token_counts), num_samples, seed)  # (R, N_art)
    tokens = counts @ token_counts  # (R,)
    keep = tokens > 0
    ppl_a = np.exp(counts[keep] @ nll_a / tokens[keep])
    ppl_b = np.exp(counts[keep] @ nll_b / tokens[keep])
    observed = perplexity(nll_b, token_counts) - perplexity(nll_a, token_counts)
    return {"ppl_a": perplexity(nll_a, token_counts), "ppl_b": perplexity(nll_b, token_counts),
            **_paired_summary(ppl_b - ppl_a, observed, confidence)}


def _paired_summary(diff: np.ndarray, observed: float, confidence: float) -> dict[str, float]:
    """The interval, the p-value-ish number and the share of resamples where B is better, of the resampled
    differences ``diff`` (R,) around the ``observed`` one."""
    low, high = _interval(diff, confidence)
    if observed == 0:
        p_value = 1.0
    else:
        p_value = min(1.0, 2.0 * float(np.mean(np.sign(diff) != np.sign(observed))))
    return {"diff": observed, "ci_low": low, "ci_high": high, "p_value": p_value,
            "fraction_b_better": float(np.mean(diff < 0)), "confidence": confidence, "bootstrap_samples": len(diff)}


def seeded_paired_bootstrap(nll_a: np.ndarray, nll_b: np.ndarray, token_counts: np.ndarray,
                            num_samples: int = 1000, confidence: float = 0.95, seed: int = 0) -> dict[str, float]:
    """Paired two-level bootstrap of ppl(B) - ppl(A) over training seeds and articles.

    nll_a, nll_b (S, N_art): each seed's per-article NLL sums; token_counts (N_art,). The statistic is the
    difference of the perplexities of the seed-mean NLL; each resample draws S seeds and N_art articles with
    replacement (the same article draw for every drawn seed). Needs S >= 2."""
    _check(num_samples, confidence)
    nll_a, nll_b = np.asarray(nll_a, np.float64), np.asarray(nll_b, np.float64)
    token_counts = np.asarray(token_counts, np.float64)
    num_seeds = nll_a.shape[0]
    if num_seeds < 2:
        raise PlanlmError("a seed-noise interval needs >= 2 training seeds")
    seed_counts = _resample_counts(num_seeds, num_samples, seed + 1)  # (R, S)
    counts = _resample_counts(len(token_counts), num_samples, seed)  # (R, N_art)
    tokens = counts @ token_counts  # (R,)
    keep = tokens > 0

    def resampled_ppl(nll: np.ndarray) -> np.ndarray:
        per_seed = counts[keep] @ nll.T  # (R', S) each drawn article set's NLL under each seed
        return np.exp((seed_counts[keep] * per_seed).sum(1) / num_seeds / tokens[keep])  # (R',)

    observed = perplexity(nll_b.mean(0), token_counts) - perplexity(nll_a.mean(0), token_counts)
    return _paired_summary(resampled_ppl(nll_b) - resampled_ppl(nll_a), observed, confidence)


def write_per_article(path: str | Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=PER_ARTICLE_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row[k] for k in PER_ARTICLE_FIELDS})


def read_per_article(eval_dir: str | Path) -> dict[str, np.ndarray]:
    """The per-article table of an evaluation folder as arrays (article, id, nll_sum, tokens)."""
    from planlm.integrity import fix_for, reading, stage_manifest

    path = Path(eval_dir) / PER_ARTICLE
    stage_manifest(eval_dir)  # the cheap check of a finished evaluation folder: one line per damaged file
    if not path.is_file():
        raise PlanlmError(f"{path}: missing; give an evaluation folder written by `planlm evaluate`")
    with reading(path, fix_for(eval_dir)), open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and set(PER_ARTICLE_FIELDS) - set(rows[0]):
        raise PlanlmError(f"{path}: columns {sorted(rows[0])} lack {sorted(set(PER_ARTICLE_FIELDS) - set(rows[0]))}; "
                          f"rerun `planlm evaluate`")
    try:
        return {"article": np.array([int(r["article"]) for r in rows], dtype=np.int64),
                "id": np.array([r["id"] for r in rows], dtype=object),
                "nll_sum": np.array([float(r["nll_sum"]) for r in rows], dtype=np.float64),
                "tokens": np.array([int(r["tokens"]) for r in rows], dtype=np.int64)}
    except (TypeError, ValueError) as e:
        raise PlanlmError(f"{path}: malformed row ({e}); rerun `planlm evaluate`") from e


def _metrics(eval_dir: Path) -> dict:
    from planlm.integrity import fix_for, load_json

    path = eval_dir / "metrics.json"
    return load_json(path, fix_for(eval_dir)) if path.is_file() else {}


def seed_folders(eval_dir: str | Path) -> dict[int, Path]:
    """{seed: folder} of the ``seed<N>/`` evaluations of a run with seeds; {} for a single evaluation."""
    folders = {}
    for folder in Path(eval_dir).glob("seed*"):
        if folder.name[4:].isdigit() and (folder / PER_ARTICLE).is_file():
            folders[int(folder.name[4:])] = folder
    return dict(sorted(folders.items()))


def paired_tables(dir_a: Path, dir_b: Path) -> tuple[dict, dict]:
    """The per-article tables of two evaluations, after checking that they score the same tokens."""
    table_a, table_b = read_per_article(dir_a), read_per_article(dir_b)
    if len(table_a["id"]) != len(table_b["id"]) or not (table_a["id"] == table_b["id"]).all():
        mismatch = next((i for i, (x, y) in enumerate(zip(table_a["id"], table_b["id"])) if x != y),
                        min(len(table_a["id"]), len(table_b["id"])))
        raise PlanlmError(f"{dir_b / PER_ARTICLE}: not the same articles as {dir_a / PER_ARTICLE} (first difference at "
                          f"row {mismatch}: {len(table_a['id'])} vs {len(table_b['id'])} articles); evaluate both on "
                          f"the same --split and --max_articles")
    if not (table_a["tokens"] == table_b["tokens"]).all():
        row = int(np.flatnonzero(table_a["tokens"] != table_b["tokens"])[0])
        raise PlanlmError(f"{dir_b / PER_ARTICLE}: article {table_b['id'][row]} (row {row}) has {table_b['tokens'][row]} "
                          f"scored tokens vs {table_a['tokens'][row]} in {dir_a}; compare evaluations with the same "
                          f"tokenizer and --stride")
    return table_a, table_b


def _compare_tables(dir_a: Path, dir_b: Path, table_a: dict, table_b: dict, num_samples: int, confidence: float,
                    seed: int) -> dict:
    """The paired bootstrap of two evaluations' per-article tables, with what the folders' metrics say."""
    result = paired_bootstrap(table_a["nll_sum"], table_b["nll_sum"], table_a["tokens"], num_samples, confidence, seed)
    metrics_a, metrics_b = _metrics(dir_a), _metrics(dir_b)
    return {"a": str(dir_a), "b": str(dir_b), "articles": int(len(table_a["id"])),
            "tokens": int(table_a["tokens"].sum()), "protocol": metrics_a.get("protocol"),
            "conditioning_a": metrics_a.get("conditioning"), "conditioning_b": metrics_b.get("conditioning"),
            **result}


def compare_evaluations(a: str | Path, b: str | Path, num_samples: int = 1000, confidence: float = 0.95,
                        seed: int = 0, seed_noise: bool = True) -> dict:
    """ppl(B) - ppl(A) of two evaluation folders with a paired bootstrap (nothing printed).

    Folders of runs with seeds (``seed<N>/`` inside) are paired seed by seed, over the seeds both have:
    ``seeds`` holds each seed's comparison, ``diff_mean``/``diff_std``/``diff_min``/``diff_max`` the spread
    of the difference over seeds, and ``diff`` the difference of the perplexities of the NLL averaged over
    seeds. Its ``ci_low``/``ci_high`` come from the two-level bootstrap over seeds and articles
    (``seeded_paired_bootstrap``; ``interval`` says so) when ``seed_noise`` and >= 2 seeds, else from the
    bootstrap over articles alone, which ``article_ci_low``/``article_ci_high`` always hold. With one seed and
    ``seed_noise``, ``note`` says that seed noise cannot be estimated."""
    dir_a, dir_b = Path(a), Path(b)
    seeds_a, seeds_b = seed_folders(dir_a), seed_folders(dir_b)
    if bool(seeds_a) != bool(seeds_b):
        single, seeded = (dir_a, dir_b) if not seeds_a else (dir_b, dir_a)
        raise PlanlmError(f"{single}: a single evaluation, but {seeded} holds one per seed (seed<N>/); compare two "
                          f"runs with seeds, or two seed<N> folders")
    if not seeds_a:
        return _compare_tables(dir_a, dir_b, *paired_tables(dir_a, dir_b), num_samples, confidence, seed)
    common = sorted(set(seeds_a) & set(seeds_b))
    if not common:
        raise PlanlmError(f"{dir_b}: seeds {sorted(seeds_b)} share none with {dir_a}'s {sorted(seeds_a)}; compare runs "
                          f"trained with the same seeds")
    tables = [paired_tables(seeds_a[s], seeds_b[s]) for s in common]  # each seed's tables read once
    per_seed = {s: _compare_tables(seeds_a[s], seeds_b[s], *pair, num_samples, confidence, seed)
                for s, pair in zip(common, tables)}
    nll_a = np.stack([t[0]["nll_sum"] for t in tables])  # (S, N_art)
    nll_b = np.stack([t[1]["nll_sum"] for t in tables])
    tokens = tables[0][0]["tokens"]
    pooled = paired_bootstrap(nll_a.mean(0), nll_b.mean(0), tokens, num_samples, confidence, seed)
    pooled.update(article_ci_low=pooled["ci_low"], article_ci_high=pooled["ci_high"], interval="articles")
    if seed_noise and len(common) > 1:
        pooled.update(seeded_paired_bootstrap(nll_a, nll_b, tokens, num_samples, confidence, seed),
                      interval="seeds and articles")
    elif seed_noise:
        pooled["note"] = (f"seed noise cannot be estimated from one seed (seed {common[0]}); the interval is over "
                          f"articles alone")
    diffs = np.array([r["diff"] for r in per_seed.values()])
    first = per_seed[common[0]]
    return {**{k: first[k] for k in ("articles", "tokens", "protocol", "conditioning_a", "conditioning_b")},
            **pooled, "a": str(dir_a), "b": str(dir_b), "seeds": per_seed, "diff_mean": float(diffs.mean()),
            "diff_std": float(diffs.std(ddof=1)) if len(diffs) > 1 else 0.0, "diff_min": float(diffs.min()),
            "diff_max": float(diffs.max())}


def compare(a: str, b: str, num_samples: int = 1000, confidence: float = 0.95, seed: int = 0,
            out_file: str | None = None, seed_noise: bool = True) -> dict:
    """Compare two evaluations of the same articles with a paired bootstrap.

    Reports ppl(B) - ppl(A) with its confidence interval (negative: B is better) and a bootstrap
    p-value-ish number (how often a resample disagrees with the observed sign). Evaluation folders of
    runs with seeds (``eval/<condition>`` holding ``seed<N>/``) are paired seed by seed: each seed's
    difference is printed, then the difference of the seed-mean NLL with a two-level bootstrap interval
    over training seeds and articles (over articles alone for single evaluations, one seed or
    ``--seed_noise false``).

    Args:
        a: evaluation folder of the first model (written by ``planlm evaluate``, or a run's eval/<condition>).
        b: evaluation folder of the second model, on the same split, articles and protocol.
        num_samples: bootstrap resamples.
        confidence: confidence level of the interval.
        seed: seed of the resampling.
        out_file: also write the result as JSON here.
        seed_noise: with seeds, let the interval carry the spread over training seeds (two-level bootstrap).
    """
    result = compare_evaluations(a, b, num_samples, confidence, seed, seed_noise)
    level = int(round(confidence * 100))
    for training_seed, one in result.get("seeds", {}).items():
        print(f"seed {training_seed}: B - A = {one['diff']:+.4f} ({level}% CI [{one['ci_low']:+.4f}, "
              f"{one['ci_high']:+.4f}])")
    if "seeds" in result:
        print(f"over {len(result['seeds'])} seeds: B - A mean {result['diff_mean']:+.4f}, "
              f"std {result['diff_std']:.4f}, range [{result['diff_min']:+.4f}, {result['diff_max']:+.4f}]; "
              f"NLL averaged over seeds, interval over {result['interval']}:")
    if result.get("note"):
        print(f"note: {result['note']}")
    print(f"A {result['a']}: ppl {result['ppl_a']:.4f}\nB {result['b']}: ppl {result['ppl_b']:.4f}\n"
          f"B - A = {result['diff']:+.4f} ({level}% CI [{result['ci_low']:+.4f}, {result['ci_high']:+.4f}], "
          f"p~{result['p_value']:.3g}, B better in {100 * result['fraction_b_better']:.1f}% of resamples; "
          f"{result['articles']} articles, {result['tokens']} tokens)")
    if out_file:
        write_json(out_file, result)
    return result
