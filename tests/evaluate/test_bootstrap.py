import json

import numpy as np
import pytest

from planlm.evaluate.bootstrap import (bootstrap_mean, bootstrap_perplexity, compare, paired_bootstrap,
                                       write_per_article)
from planlm.utils import PlanlmError


def _articles(num_articles, seed=0, mean_nll=3.0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(20, 200, size=num_articles)
    per_token = mean_nll + rng.normal(scale=0.5, size=num_articles)  # article difficulty varies
    return per_token * tokens, tokens


def test_perplexity_is_a_ratio_estimator_not_a_mean_of_article_perplexities():
    nll, tokens = np.array([10.0, 1.0]), np.array([1, 100])
    result = bootstrap_perplexity(nll, tokens, num_samples=200)
    assert result["ppl"] == pytest.approx(np.exp(11.0 / 101))
    assert result["ppl"] != pytest.approx(np.mean(np.exp(nll / tokens)))


def test_interval_matches_an_independent_resampling_loop():
    nll, tokens = _articles(60)
    result = bootstrap_perplexity(nll, tokens, num_samples=4000, seed=1)
    rng = np.random.default_rng(123)
    ratios = []
    for _ in range(4000):
        idx = rng.integers(0, len(nll), size=len(nll))
        ratios.append(np.exp(nll[idx].sum() / tokens[idx].sum()))
    low, high = np.quantile(ratios, [0.025, 0.975])
    width = high - low
    assert result["ci_low"] < result["ppl"] < result["ci_high"]
    assert result["ci_low"] == pytest.approx(low, abs=0.1 * width)
    assert result["ci_high"] == pytest.approx(high, abs=0.1 * width)


def test_interval_shrinks_with_more_articles_and_collapses_without_variance():
    small = bootstrap_perplexity(*_articles(25), num_samples=1000)
    large = bootstrap_perplexity(*_articles(400), num_samples=1000)
    assert (large["ci_high"] - large["ci_low"]) < 0.5 * (small["ci_high"] - small["ci_low"])
    same = bootstrap_perplexity(np.full(10, 20.0), np.full(10, 10), num_samples=100)
    assert same["ci_low"] == pytest.approx(np.exp(2.0)) and same["ci_high"] == pytest.approx(np.exp(2.0))


def test_bootstrap_mean_covers_the_mean():
    values = np.random.default_rng(0).normal(5.0, 1.0, size=200)
    result = bootstrap_mean(values, num_samples=2000)
    assert result["ci_low"] < values.mean() < result["ci_high"]
    assert result["ci_high"] - result["ci_low"] == pytest.approx(2 * 1.96 / np.sqrt(200), rel=0.25)


def test_paired_bootstrap_detects_a_small_consistent_gain_that_unpaired_intervals_miss():
    nll_a, tokens = _articles(80)
    nll_b = nll_a - 0.02 * tokens  # B is better on every article by 0.02 nats per token
    result = paired_bootstrap(nll_a, nll_b, tokens, num_samples=1000)
    assert result["diff"] < 0 and result["ci_high"] < 0
    assert result["p_value"] < 0.01 and result["fraction_b_better"] == 1.0
    ci_a = bootstrap_perplexity(nll_a, tokens)
    ci_b = bootstrap_perplexity(nll_b, tokens)
    assert ci_b["ci_high"] > ci_a["ci_low"]  # the unpaired intervals overlap
    tie = paired_bootstrap(nll_a, nll_a, tokens, num_samples=200)
    assert tie["diff"] == 0 and tie["p_value"] == 1.0


def _eval_dir(path, ids, nll, tokens, conditioning="none"):
    path.mkdir()
    write_per_article(path / "per_article.csv", [{"article": i, "id": a, "nll_sum": n, "tokens": t}
                                                  for i, (a, n, t) in enumerate(zip(ids, nll, tokens))])
    (path / "metrics.json").write_text(json.dumps({"conditioning": conditioning, "protocol": "test"}))
    return path


def test_compare_command_through_the_cli(tmp_path, capsys):
    from planlm.cli import main

    nll_a, tokens = _articles(30)
    ids = [f"doc{i}" for i in range(30)]
    a = _eval_dir(tmp_path / "a", ids, nll_a, tokens)
    b = _eval_dir(tmp_path / "b", ids, nll_a - 0.05 * tokens, tokens, conditioning="oracle")
    main(["compare", "--a", str(a), "--b", str(b), "--num_samples", "300", "--out_file", str(tmp_path / "cmp.json")])
    assert "B - A = -" in capsys.readouterr().out
    result = json.loads((tmp_path / "cmp.json").read_text())
    assert result["ci_high"] < 0 and result["conditioning_b"] == "oracle" and result["articles"] == 30


def test_compare_refuses_different_articles_in_one_line(tmp_path):
    nll, tokens = _articles(5)
    a = _eval_dir(tmp_path / "a", [f"doc{i}" for i in range(5)], nll, tokens)
    b = _eval_dir(tmp_path / "b", ["doc0", "doc1", "other", "doc3", "doc4"], nll, tokens)
    with pytest.raises(PlanlmError, match="first difference at row 2") as err:
        compare(str(a), str(b))
    assert "\n" not in str(err.value)
    c = _eval_dir(tmp_path / "c", [f"doc{i}" for i in range(5)], nll, tokens + 1)
    with pytest.raises(PlanlmError, match="scored tokens"):
        compare(str(a), str(c))
    with pytest.raises(PlanlmError, match="per_article.csv: missing"):
        compare(str(a), str(tmp_path))


def _seeded_eval(root, seed_shifts, nll_a, tokens, ids):
    """eval/a and eval/b of a run with seeds: B is better than A by ``seed_shifts[s]`` nats per token in seed s
    (plus article noise shared by every seed)."""
    noise = np.random.default_rng(7).normal(0, 0.02, len(tokens))
    for s, shift in enumerate(seed_shifts):
        _eval_dir_seed(root / "a", s, ids, nll_a, tokens)
        _eval_dir_seed(root / "b", s, ids, nll_a - (shift + noise) * tokens, tokens, "oracle")
    return root / "a", root / "b"


def _eval_dir_seed(folder, seed, ids, nll, tokens, conditioning="none"):
    folder.mkdir(parents=True, exist_ok=True)
    return _eval_dir(folder / f"seed{seed}", ids, nll, tokens, conditioning)


def _widths(result):
    return result["ci_high"] - result["ci_low"], result["article_ci_high"] - result["article_ci_low"]


def test_seed_noise_widens_the_interval_when_seeds_disagree_and_not_when_they_agree(tmp_path):
    from planlm.evaluate.bootstrap import compare_evaluations

    nll_a, tokens = _articles(60)
    ids = [f"doc{i}" for i in range(60)]
    disagree = compare_evaluations(*_seeded_eval(tmp_path / "disagree", [0.0, 0.04, 0.08], nll_a, tokens, ids))
    agree = compare_evaluations(*_seeded_eval(tmp_path / "agree", [0.04, 0.04, 0.04], nll_a, tokens, ids))
    assert disagree["interval"] == agree["interval"] == "seeds and articles"
    seeded, articles_only = _widths(disagree)
    assert seeded > 3 * articles_only  # the seeds' spread (0 to 0.08 nats) dwarfs the articles'
    assert disagree["ci_low"] <= min(r["diff"] for r in disagree["seeds"].values())
    seeded, articles_only = _widths(agree)
    assert seeded == pytest.approx(articles_only, rel=0.15)
    assert agree["ci_high"] < 0 and agree["diff"] == pytest.approx(agree["diff_mean"], rel=1e-3)
    old = compare_evaluations(tmp_path / "disagree" / "a", tmp_path / "disagree" / "b", seed_noise=False)
    assert old["interval"] == "articles" and old["ci_low"] == disagree["article_ci_low"]


def test_one_seed_gives_the_article_interval_and_a_one_line_note(tmp_path, capsys):
    nll_a, tokens = _articles(30)
    a, b = _seeded_eval(tmp_path, [0.05], nll_a, tokens, [f"doc{i}" for i in range(30)])
    result = compare(str(a), str(b), num_samples=300)
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert notes == ["note: seed noise cannot be estimated from one seed (seed 0); the interval is over articles "
                     "alone"]
    assert result["interval"] == "articles" and result["ci_low"] == result["article_ci_low"]
    assert "seed 0: B - A = -" in out
