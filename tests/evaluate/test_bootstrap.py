import json

import numpy as np
import pytest

from planlm.errors import PlanlmError
from planlm.evaluate.bootstrap import (bootstrap_mean, bootstrap_perplexity, compare, paired_bootstrap,
                                       write_per_article)


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


def test_cluster_resampling_draws_every_piece_of_a_document_equally_often():
    from planlm.evaluate.bootstrap import _resample_counts

    sources = ["a", "a", "b", "c", "c", "c", "d"]
    counts = _resample_counts(len(sources), 500, seed=3, clusters=sources)  # (R, N_art)
    assert (counts[:, 0] == counts[:, 1]).all() and (counts[:, 3] == counts[:, 4]).all()
    assert (counts[:, 3] == counts[:, 5]).all()
    assert (counts[:, [0, 2, 3, 6]].sum(1) == 4).all()  # 4 documents drawn per resample, not 7 pieces
    assert not (counts[:, 0] == counts[:, 2]).all()  # documents are drawn independently
    # every article its own document: exactly the resampling over articles
    alone = _resample_counts(len(sources), 50, seed=3, clusters=[f"x{i}" for i in range(7)])
    assert (alone == _resample_counts(len(sources), 50, seed=3)).all()


def test_pieces_of_one_document_widen_the_interval_when_their_errors_are_shared():
    """Ten documents of six pieces whose per-token NLL is the document's: resampling pieces as if independent
    gives a far narrower interval than resampling the ten documents."""
    rng = np.random.default_rng(0)
    sources = np.repeat([f"doc{d}" for d in range(10)], 6)
    tokens = np.full(60, 100)
    nll = (3.0 + rng.normal(0, 0.3, 10))[np.arange(60) // 6] * tokens
    pieces = bootstrap_perplexity(nll, tokens, num_samples=2000)
    documents = bootstrap_perplexity(nll, tokens, num_samples=2000, clusters=sources)
    assert documents["ppl"] == pieces["ppl"]
    assert documents["ci_high"] - documents["ci_low"] > 1.8 * (pieces["ci_high"] - pieces["ci_low"])
    paired = paired_bootstrap(nll, nll - 0.02 * tokens * (1 + rng.normal(0, 1, 10))[np.arange(60) // 6], tokens,
                              num_samples=2000, clusters=sources)
    unclustered = paired_bootstrap(nll, nll - 0.02 * tokens * (1 + rng.normal(0, 1, 10))[np.arange(60) // 6],
                                   tokens, num_samples=2000)
    assert paired["ci_high"] - paired["ci_low"] > 1.5 * (unclustered["ci_high"] - unclustered["ci_low"])


def test_source_of_a_piece_id_and_an_old_per_article_csv_without_source(tmp_path):
    from planlm.evaluate.bootstrap import read_per_article, source_of

    assert source_of("speech-1945#3") == "speech-1945" and source_of("a#b#12") == "a#b"
    assert source_of("Title #x") == "Title #x" and source_of("plain") == "plain" and source_of("#4") == "#4"
    (tmp_path / "per_article.csv").write_text("article,id,nll_sum,tokens\n0,doc#0,30.0,10\n1,doc#1,31.0,10\n"
                                              "2,other,29.0,10\n")
    table = read_per_article(tmp_path)
    assert list(table["source"]) == ["doc", "doc", "other"] and list(table["tokens"]) == [10, 10, 10]
    write_per_article(tmp_path / "per_article.csv", [{"article": 0, "id": "x#0", "source": "y", "nll_sum": 1.0,
                                                      "tokens": 1}])
    assert read_per_article(tmp_path)["source"][0] == "y"  # the written column wins over the id


def _seed_noise(num_seeds, seed_sd=0.03, seed=0):
    """Per-seed NLL sums (S, 40) of A and B over 10 documents of 4 pieces: B better by 0.02 nats plus seed noise."""
    rng = np.random.default_rng(seed)
    sources = np.repeat(np.arange(10), 4)
    tokens = rng.integers(200, 400, 40)
    level = 3.0 + rng.normal(0, 0.2, 10)[sources]
    nll_a = np.stack([(level + rng.normal(0, 0.005, 40)) * tokens for _ in range(num_seeds)])
    shift = -0.02 + rng.normal(0, seed_sd, (num_seeds, 1)) + rng.normal(0, 0.005, (num_seeds, 40))
    return nll_a, nll_a + shift * tokens, tokens, sources


def test_the_seed_noise_interval_reaches_past_the_per_seed_range_at_two_seeds():
    from scipy.stats import t

    from planlm.evaluate.bootstrap import seeded_paired_interval

    nll_a, nll_b, tokens, sources = _seed_noise(2)
    new = seeded_paired_interval(nll_a, nll_b, tokens, num_samples=500, clusters=sources)
    per_seed = [np.exp(b.sum() / tokens.sum()) - np.exp(a.sum() / tokens.sum()) for a, b in zip(nll_a, nll_b)]
    assert new["diff"] == pytest.approx(np.mean(per_seed))
    assert new["ci_low"] < min(per_seed) and new["ci_high"] > max(per_seed)
    # the half-width is the two parts' t quantiles in quadrature, the seed part on S - 1 = 1 degree of freedom
    seed_part = t.ppf(0.975, 1) * np.std(per_seed, ddof=1) / np.sqrt(2)
    document_part = t.ppf(0.975, 9) * new["document_se"]
    assert new["ci_high"] - new["diff"] == pytest.approx(np.hypot(seed_part, document_part))
    assert 0.05 < new["p_value"] <= 1  # the interval covers 0
    with pytest.raises(PlanlmError, match=">= 2 training seeds"):
        seeded_paired_interval(nll_a[:1], nll_b[:1], tokens)


def test_the_seed_noise_interval_shrinks_to_the_document_bootstrap_when_seeds_agree():
    from scipy.stats import t

    from planlm.evaluate.bootstrap import seeded_paired_interval

    nll_a, _, tokens, sources = _seed_noise(3)
    nll_b = nll_a - 0.02 * tokens * (1 + np.random.default_rng(1).normal(0, 1, 10))[sources]  # same gain each seed
    new = seeded_paired_interval(nll_a, nll_b, tokens, num_samples=2000, clusters=sources)
    documents = paired_bootstrap(nll_a.mean(0), nll_b.mean(0), tokens, num_samples=2000, clusters=sources)
    assert new["seed_se"] < 0.05 * new["document_se"]
    # the short side is the normal-theory document part; the long side adds the documents' skew (bootstrap-t)
    short = min(new["diff"] - new["ci_low"], new["ci_high"] - new["diff"])
    assert short == pytest.approx(t.ppf(0.975, 9) * new["document_se"], rel=0.01)
    assert 1.0 < (new["ci_high"] - new["ci_low"]) / (documents["ci_high"] - documents["ci_low"]) < 1.5
    assert new["ci_high"] < 0 and new["p_value"] < 0.05


def test_share_of_the_oracle_gain_on_a_known_case():
    from planlm.evaluate.bootstrap import oracle_gain_share

    rng = np.random.default_rng(0)
    sources = np.repeat(np.arange(12), 3)
    tokens = np.full(36, 200)
    fixed = (3.0 + rng.normal(0, 0.2, 12)[sources]) * tokens
    noise = rng.normal(0, 0.01, (2, 36))
    oracle = np.stack([fixed - 0.2 * tokens] * 2)  # the same large gain in both seeds
    condition = np.stack([fixed - (0.05 + n) * tokens for n in noise])  # about a quarter of it
    fixed = np.stack([fixed, fixed])
    result = oracle_gain_share(fixed, condition, oracle, tokens, num_samples=500, clusters=sources)
    ppl = [np.exp(x.sum() / tokens.sum()) for x in (fixed[0], condition[0], condition[1], oracle[0])]
    expected = ((ppl[1] + ppl[2]) / 2 - ppl[0]) / (ppl[3] - ppl[0])
    assert result["share"] == pytest.approx(expected) and 0.2 < result["share"] < 0.3
    assert result["ci_low"] < result["share"] < result["ci_high"] and result["note"] is None
    assert 0.0 < result["ci_low"] and result["ci_high"] < 0.5
    # an oracle whose gain is lost in seed noise: no bounded interval, and a note that says why
    oracle = np.stack([fixed[0] - 0.2 * tokens, fixed[0] + 0.15 * tokens])
    unstable = oracle_gain_share(fixed, condition, oracle, tokens, num_samples=500, clusters=sources)
    assert unstable["ci_low"] is None and unstable["ci_high"] is None
    assert "not distinguishable from 0" in unstable["note"]
    single = oracle_gain_share(fixed[0], condition[0], oracle[0], tokens, num_samples=500, clusters=sources)
    assert single["seeds"] == 1 and single["ci_low"] < single["share"] < single["ci_high"]


def test_compare_refuses_a_seed_that_scored_other_articles_in_one_line(tmp_path):
    from planlm.evaluate.bootstrap import compare_evaluations

    nll, tokens = _articles(6)
    ids = [f"doc{i}" for i in range(6)]
    for name in ("a", "b"):
        _eval_dir_seed(tmp_path / name, 0, ids, nll, tokens)
        _eval_dir_seed(tmp_path / name, 1, ids[:4] + ["other", "doc5"], nll, tokens)  # seed 1: other articles
    with pytest.raises(PlanlmError, match=r"seed1: seed 1 scored other articles than seed 0 .* article other vs doc4"
                       ) as err:
        compare_evaluations(tmp_path / "a", tmp_path / "b")
    assert "\n" not in str(err.value) and "evaluate every seed on the same --split" in str(err.value)
    for name in ("c", "d"):
        _eval_dir_seed(tmp_path / name, 0, ids, nll, tokens)
        _eval_dir_seed(tmp_path / name, 1, ids, nll, tokens + np.arange(6) // 5)  # doc5 has one more token
    with pytest.raises(PlanlmError, match=r"seed 1's article doc5 \(row 5\) has \d+ scored tokens vs \d+ in seed 0"
                       ) as err:
        compare_evaluations(tmp_path / "c", tmp_path / "d")
    assert "\n" not in str(err.value) and "same tokenizer, --stride" in str(err.value)


def test_an_evaluation_writes_each_piece_s_source_document(tmp_path):
    from types import SimpleNamespace

    from planlm.evaluate.bootstrap import read_per_article
    from planlm.evaluate.metrics import PerplexityMetrics
    from planlm.evaluate.perplexity import _write_evaluation
    from planlm.stage import StageDir

    split = SimpleNamespace(articles=[{"id": "speech#0", "source": "speech"}, {"id": "speech#2", "source": "speech"},
                                      {"id": "letter#1", "source": "letters"}, {"id": "solo"}])
    result = {"nll_sums": np.array([4.0, 5.0, 6.0, 7.0]), "tokens": np.array([2, 2, 3, 3]), "num_paths": np.ones(4)}
    with StageDir(tmp_path, {"split": "test"}) as stage:
        _write_evaluation(stage, PerplexityMetrics.from_dict({"ppl": 1.0}), result, split, 4)
    table = read_per_article(tmp_path)  # through the manifest's cheap check
    assert list(table["source"]) == ["speech", "speech", "letters", "solo"]  # the split's, not guessed from ids


def test_seeded_interval_of_any_statistic_is_the_seeded_paired_interval_for_perplexity():
    """``seeded_interval`` (adherence's intervals) reuses the document bootstrap and the seed t quantile: given the
    perplexity difference as its statistic, it gives exactly ``seeded_paired_interval``."""
    from planlm.evaluate.bootstrap import seeded_interval, seeded_paired_interval

    rng = np.random.default_rng(0)
    tokens = rng.integers(50, 200, size=12).astype(float)
    nll_a = tokens * rng.normal(4.0, 0.2, size=(3, 12))
    nll_b = nll_a - tokens * rng.normal(0.05, 0.05, size=(3, 12))
    clusters = [f"doc{i // 3}" for i in range(12)]
    paired = seeded_paired_interval(nll_a, nll_b, tokens, 300, 0.9, seed=4, clusters=clusters)
    general = seeded_interval(lambda w, s: np.exp(w @ nll_b[s] / (w @ tokens)) - np.exp(w @ nll_a[s] / (w @ tokens)),
                              3, 12, 300, 0.9, seed=4, clusters=clusters)
    assert general["mean"] == pytest.approx(paired["diff"])
    assert (general["ci_low"], general["ci_high"]) == pytest.approx((paired["ci_low"], paired["ci_high"]))
    assert general["documents"] == 4 and len(general["seeds"]) == 3


@pytest.mark.lab  # the interval reported before, kept in experiments/ for the coverage simulations
def test_the_two_level_bootstrap_is_stuck_in_the_per_seed_range_at_two_seeds():
    from experiments.two_level_bootstrap import seeded_paired_bootstrap
    from planlm.evaluate.bootstrap import seeded_paired_interval

    nll_a, nll_b, tokens, sources = _seed_noise(2)
    new = seeded_paired_interval(nll_a, nll_b, tokens, num_samples=500, clusters=sources)
    old = seeded_paired_bootstrap(nll_a, nll_b, tokens, num_samples=500)
    per_seed = [np.exp(b.sum() / tokens.sum()) - np.exp(a.sum() / tokens.sum()) for a, b in zip(nll_a, nll_b)]
    assert old["ci_low"] >= min(per_seed) - 0.1 and old["ci_high"] <= max(per_seed) + 0.1
    assert new["ci_high"] - new["ci_low"] > 4 * (old["ci_high"] - old["ci_low"])
    with pytest.raises(PlanlmError, match=">= 2 training seeds"):
        seeded_paired_bootstrap(nll_a[:1], nll_b[:1], tokens)


def test_the_slope_half_width_takes_t_on_welch_satterthwaite_df_for_one_slope_and_for_many():
    """``slope_half_width`` (the interval of `planlm across-runs`' slope and of experiments/ladder_power.py): the t
    quantile on the Welch-Satterthwaite df of the runs' seed terms w_r^2 var_r, in quadrature with t_{G-1} on the
    documents; a run of one seed adds nothing, no seed noise leaves the documents alone; vectorised over simulated
    ladders, each slope as if computed alone."""
    from scipy.stats import t

    from planlm.evaluate.bootstrap import slope_half_width

    w, seed_vars, seeds = np.array([-0.5, 0.1, 0.4]), np.array([0.04, 0.09, 0.01]), [3, 5, 4]
    terms = w ** 2 * seed_vars
    df = terms.sum() ** 2 / (terms[0] ** 2 / 2 + terms[1] ** 2 / 4 + terms[2] ** 2 / 3)
    half, seed_var, dof = slope_half_width(w, seed_vars, seeds, 0.02, 30)
    assert seed_var == pytest.approx(terms.sum()) and dof == pytest.approx(df)
    assert half == pytest.approx(np.sqrt(t.ppf(0.975, df) ** 2 * terms.sum() + t.ppf(0.975, 29) ** 2 * 0.02))
    one_seed = slope_half_width(np.append(w, 0.3), np.append(seed_vars, 0.0), seeds + [1], 0.02, 30)
    assert one_seed[2] == pytest.approx(df) and one_seed[0] == pytest.approx(half)
    alone, _, no_df = slope_half_width(w, np.zeros(3), [1, 1, 1], 0.02, 30)
    assert np.isnan(no_df) and alone == pytest.approx(t.ppf(0.975, 29) * np.sqrt(0.02))
    rng = np.random.default_rng(0)
    many, documents = rng.uniform(0.01, 0.1, (5, 3)), rng.uniform(0.0, 0.05, 5)
    halves, _, _ = slope_half_width(w, many, seeds, documents, 30)
    assert halves == pytest.approx([float(slope_half_width(w, m, seeds, d, 30)[0]) for m, d in zip(many, documents)])
