import json

import numpy as np
import pytest
import torch

from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.evaluate.perplexity import (evaluate, evaluate_split, protocol_label,
                                        scoring_windows, window_batches)
from planlm.models.planned_lm import PlannedLM
from planlm.plans.sources import OraclePlans

from helpers import (linear_output_dtypes, read_csv, sampled_multipath, tiny_gpt2, tiny_gpt2_config, tiny_planned_lm,
                     tiny_planner, use_planner)
from planlm.plans.config import PlanConfig


@pytest.fixture(scope="module")
def bare_lm_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bare_lm")
    tiny_gpt2().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def planned_lm_dir(tmp_path_factory, synthetic_random):
    path = tmp_path_factory.mktemp("planned_lm")
    tiny_planned_lm(PreparedDataset(synthetic_random)).save_pretrained(path)
    return path


def per_article(out_dir):
    return read_csv(out_dir / "per_article.csv")


def test_windows_score_every_token_but_the_first_once_with_the_longest_allowed_context():
    offsets = np.array([0, 1, 40, 45, 300])  # an article of 1 token scores nothing
    for stride, context_length in [(1, 16), (5, 16), (16, 16), (1, 128), (127, 128)]:
        windows = scoring_windows(offsets, range(4), context_length, stride)
        scored = np.concatenate([np.arange(first, end) for _, _, first, end in windows])
        starts = np.concatenate([np.full(end - first, start) for _, start, first, end in windows])
        expected = np.concatenate([np.arange(a + 1, b) for a, b in zip(offsets[:-1], offsets[1:])])
        assert np.array_equal(np.sort(scored), expected) if stride < context_length else \
            set(scored) <= set(expected)
        article_start = offsets[np.searchsorted(offsets, scored, side="right") - 1]
        assert (starts >= article_start).all() and (scored - starts <= context_length - 1).all()
        if stride == 1:  # the reference protocol: exactly min(127, position in article) tokens of context
            assert np.array_equal(scored - starts, np.minimum(scored - article_start, context_length - 1))
    non_overlapping = scoring_windows(offsets, range(4), 16, 16)
    assert [tuple(w) for w in non_overlapping if w[0] == 3][:2] == [(3, 45, 46, 61), (3, 61, 62, 77)]
    assert protocol_label(1).startswith("reference stride-1, 127-token context")
    assert protocol_label(128).startswith("non-overlapping") and protocol_label(8).startswith("strided 8")


def non_overlapping_start(t, num_tokens, width):
    """Where the context of token t starts with non-overlapping windows [width j, width j + width) (None: t
    starts a full window and has no context); a shorter last window is moved back to end at the article's end."""
    start = width * (t // width)
    if start + width <= num_tokens or start == 0:
        return None if t == start else start
    return max(0, num_tokens - width)


def independent_nll(lm, token_ids, context_length, stride=1):
    """Token by token, one window per token, log-softmax by hand."""
    total = 0.0
    for t in range(1, len(token_ids)):
        if stride == 1:
            start = max(0, t - context_length + 1)
        else:
            assert stride == context_length
            start = non_overlapping_start(t, len(token_ids), context_length)
            if start is None:
                continue
        context = torch.tensor(token_ids[start:t])[None]
        with torch.no_grad():
            logits = lm(input_ids=context).logits[0, -1].double()  # (V,)
        log_probs = logits - torch.logsumexp(logits, -1)
        total -= float(log_probs[token_ids[t]])
    return total


@pytest.mark.parametrize("stride", [1, 16])
def test_reference_protocol_matches_an_independent_token_by_token_computation(synthetic_cycle, bare_lm_dir,
                                                                              tmp_path, stride, tiny_lm):
    out = tmp_path / "eval"
    metrics = evaluate(str(bare_lm_dir), str(synthetic_cycle), str(out), max_articles=3, context_length=16,
                       stride=stride, batch_size=4, bootstrap_samples=50)
    split = PreparedDataset(synthetic_cycle)["test"]
    lm = tiny_lm
    rows = per_article(out)
    total_nll, total_tokens, lengths = 0.0, 0, []
    for article, row in enumerate(rows):
        ids = [int(i) for i in split.input_ids[split.token_range(article)]]
        lengths.append(len(ids))
        assert float(row["nll_sum"]) == pytest.approx(independent_nll(lm, ids, 16, stride), rel=1e-5)
        # non-overlapping: the first token of each full window [16j, 16j + 16) has no context; a shorter last
        # window is moved back to 16 tokens, so its first target has context
        no_context = sum(1 for p in range(16, len(ids), 16) if p + 16 <= len(ids)) if stride == 16 else 0
        assert int(row["tokens"]) == len(ids) - 1 - no_context
        total_nll += float(row["nll_sum"])
        total_tokens += int(row["tokens"])
    assert any(n > 16 and n % 16 for n in lengths) and any(n >= 32 for n in lengths)  # the cases above occur
    assert metrics.ppl == pytest.approx(np.exp(total_nll / total_tokens))
    assert metrics.ci_low <= metrics.ppl <= metrics.ci_high
    assert metrics.tokens == total_tokens and metrics.articles == 3 and metrics.conditioning == "none"
    assert metrics.wall_time_s > 0 and metrics.tokens_per_s > 0
    assert json.loads((out / "manifest.json").read_text())["metrics"]["ppl"] == metrics.ppl


def test_conditioned_perplexity_matches_a_direct_planned_lm_forward(synthetic_random, planned_lm_dir, tmp_path):
    prepared = PreparedDataset(synthetic_random)
    split = prepared["test"]
    model = PlannedLM.from_pretrained(planned_lm_dir).eval()
    oracle = OraclePlans(split, num_paths=2, horizon=3)
    metrics = evaluate(str(planned_lm_dir), str(synthetic_random), str(tmp_path / "oracle"), max_articles=4,
                       batch_size=3, bootstrap_samples=50)
    assert metrics.conditioning == "oracle" and metrics.K == 2 and metrics.T == 3
    for article, row in enumerate(per_article(tmp_path / "oracle")):
        tokens = split.token_range(article)
        assert len(tokens) < 128  # one window: the direct forward sees the same context
        plan_sentence = np.asarray(split.token_plan_sentence[tokens.start:tokens.stop])
        sentences, plan_index = np.unique(plan_sentence, return_inverse=True)
        action_paths, path_mask, _ = oracle(sentences)
        input_ids = torch.from_numpy(np.array(split.input_ids[tokens.start:tokens.stop]))[None]
        with torch.no_grad():
            out = model(input_ids=input_ids, labels=input_ids, action_paths=action_paths, path_mask=path_mask,
                        plan_index=torch.from_numpy(plan_index)[None])
        assert float(row["nll_sum"]) == pytest.approx(float(out.loss) * (len(tokens) - 1), rel=1e-4)
    unconditioned = evaluate(str(planned_lm_dir), str(synthetic_random), str(tmp_path / "none"), max_articles=4,
                             plans=PlanConfig(kind="none"), bootstrap_samples=50)
    assert unconditioned.ppl != pytest.approx(metrics.ppl, rel=1e-3)  # the plans do reach the LM


def test_raising_num_paths_does_not_multiply_lm_forward_passes(synthetic_random, tmp_path):
    prepared = PreparedDataset(synthetic_random)
    planner = tiny_planner(prepared)
    planner.save_pretrained(tmp_path / "planner")
    model = tiny_planned_lm(prepared, adapter="multipath")
    calls = []
    model.lm.register_forward_hook(lambda *args: calls.append(1))
    results = {}
    for num_paths in (1, 8):
        calls.clear()
        cond = PlanConfig(kind="planner_sampled", num_paths=num_paths, horizon=3, planner_dir=str(tmp_path / "planner")).resolve()
        results[num_paths] = evaluate_split(model, prepared, prepared["test"], cond, num_articles=6, batch_size=4)
        results[num_paths]["lm_calls"] = len(calls)
    expected_calls = len(window_batches(scoring_windows(prepared["test"].token_offsets, range(6)), 4))
    assert results[1]["lm_calls"] == results[8]["lm_calls"] == expected_calls
    assert not np.allclose(results[1]["nll_sums"], results[8]["nll_sums"])  # K did change the plans


def test_bf16_evaluation_runs_the_lm_the_adapter_and_the_planner_in_bf16(synthetic_random, planned_lm_dir,
                                                                         tmp_path, bf16_allowed):
    prepared = PreparedDataset(synthetic_random)
    split = prepared["test"]
    model, cond = sampled_multipath(prepared, tmp_path / "planner")
    own_layers = set(model.modules())
    with linear_output_dtypes() as seen:
        evaluate_split(model, prepared, split, cond, num_articles=3, batch_size=4, precision="bf16")
    bf16 = {torch.bfloat16}
    assert seen[model.lm.lm_head] == bf16 and seen[model.adapter.projection] == bf16
    planner_layers = [m for m in seen if m not in own_layers]  # the planner loaded from its folder
    assert planner_layers and all(seen[m] == bf16 for m in planner_layers)
    # Same (oracle) plans in both precisions: bf16 rounds the NLL, but only a little.
    oracle = PlanConfig(kind="oracle", num_paths=2, horizon=3).resolve()
    nll = {precision: evaluate_split(model, prepared, split, oracle, num_articles=3, batch_size=4,
                                     precision=precision)["nll_sums"] for precision in ("fp32", "bf16")}
    assert not np.array_equal(nll["fp32"], nll["bf16"])
    np.testing.assert_allclose(nll["bf16"], nll["fp32"], rtol=2e-2)
    # Through the command: --precision reaches every layer, and is part of the result.
    runs = {}
    for precision in ("fp32", "bf16"):
        with linear_output_dtypes() as seen:
            runs[precision] = evaluate(str(planned_lm_dir), str(synthetic_random), str(tmp_path / precision),
                                       max_articles=2, bootstrap_samples=20,
                                       runtime=Runtime(device="cpu", precision=precision))
        assert set().union(*seen.values()) == ({torch.float32} if precision == "fp32" else bf16)
    assert runs["bf16"].ppl != runs["fp32"].ppl and runs["bf16"].ppl == pytest.approx(runs["fp32"].ppl,
                                                                                                rel=2e-2)


def test_cli_reuses_a_complete_evaluation_and_reports_user_errors_in_one_line(synthetic_cycle, bare_lm_dir,
                                                                              planned_lm_dir, tmp_path, capsys):
    from planlm.cli import main

    out = tmp_path / "eval"
    args = ["evaluate", "--model_dir", str(bare_lm_dir), "--prepared_dir", str(synthetic_cycle), "--out_dir", str(out),
            "--max_articles", "2", "--stride", "128", "--bootstrap_samples", "20"]
    main(args)
    first = json.loads((out / "metrics.json").read_text())
    assert first["protocol"].startswith("non-overlapping")
    main(args)  # complete: reused, not recomputed
    assert json.loads((out / "metrics.json").read_text())["wall_time_s"] == first["wall_time_s"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(args[:-4] + ["--stride", "0"])
    assert capsys.readouterr().err.strip() == "planlm: error: --stride 0 must be in [1, --context_length=128]"
    with pytest.raises(PlanlmError, match="codebook"):  # a model trained on other actions
        evaluate(str(planned_lm_dir), str(synthetic_cycle), str(tmp_path / "x"))
    with pytest.raises(PlanlmError, match="no adapter"):
        evaluate(str(bare_lm_dir), str(synthetic_cycle), str(tmp_path / "y"), plans=PlanConfig(kind="oracle"))
    assert not (tmp_path / "y" / "manifest.json").exists()


def test_a_plan_cache_gives_the_same_perplexity_as_running_the_planner(synthetic_random, tmp_path):
    from planlm.plans.sampling import sample_plans

    prepared = PreparedDataset(synthetic_random)
    tiny_planner(prepared).save_pretrained(tmp_path / "planner")
    model = tiny_planned_lm(prepared, adapter="multipath")
    use_planner(model, str(tmp_path / "planner"))
    model.save_pretrained(tmp_path / "model")
    cache = sample_plans(str(synthetic_random), PlanConfig(planner_dir=str(tmp_path / "planner"), num_paths=2,
                                                           horizon=3), splits=["test"], runtime=Runtime(device="cpu"))
    settings = dict(num_paths=2, horizon=3, temperature=1.0, seed=0)
    common = dict(runtime=Runtime(device="cpu"), bootstrap_samples=20)
    live = evaluate(str(tmp_path / "model"), str(synthetic_random), str(tmp_path / "live"), plans=PlanConfig(**settings),
                    **common)
    cached = evaluate(str(tmp_path / "model"), str(synthetic_random), str(tmp_path / "cached"),
                      plans=PlanConfig(plans_dir=str(cache), **settings), **common)
    assert cached.plans_dir == str(cache) and cached.planner_dir is None
    assert cached.ppl == pytest.approx(live.ppl, rel=1e-6)
    greedy = evaluate(str(tmp_path / "model"), str(synthetic_random), str(tmp_path / "greedy"),
                      plans=PlanConfig(kind="planner_argmax", **settings), **common)
    greedy_cached = evaluate(str(tmp_path / "model"), str(synthetic_random), str(tmp_path / "greedy_cached"),
                             plans=PlanConfig(kind="planner_argmax", plans_dir=str(cache), **settings), **common)
    assert greedy.ppl == pytest.approx(greedy_cached.ppl, rel=1e-6) and greedy.ppl != live.ppl
    with pytest.raises(PlanlmError, match="no trained planner here"):
        evaluate(str(tmp_path / "model"), str(synthetic_random), str(tmp_path / "x"), plans=PlanConfig(planner_dir=str(tmp_path)))


def test_trained_oracle_model_end_to_end_beats_its_own_fixed_plans_in_a_paired_comparison(synthetic_random, tmp_path):
    """train-lm -> evaluate (two conditions at evaluation time) -> compare: on synthetic_random only the
    plan tells which words come next, so the true plans must beat a constant action clearly."""
    from planlm.evaluate.bootstrap import compare
    from planlm.plans.config import PlanConfig
    from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm

    model_dir = train_lm(str(synthetic_random), str(tmp_path / "oracle"),
                         model=LMModelConfig(model_config=tiny_gpt2_config()),
                         plans=PlanConfig(kind="oracle"),
                         train=LMTrainConfig(batch_size=4, lr=3e-2, limit_train_batches=40, max_epochs=1,
                                             limit_val_batches=4))
    runs = {kind: evaluate(str(model_dir), str(synthetic_random), str(tmp_path / f"eval-{kind}"), plans=PlanConfig(kind=kind),
                           bootstrap_samples=200, runtime=Runtime(device="cpu")) for kind in ("fixed", "oracle")}
    assert runs["oracle"].ppl < runs["fixed"].ppl
    assert (runs["fixed"].fixed_action, runs["oracle"].fixed_action) == (0, None)  # only the constant kind has one
    # Plan usage: this LM reads its plans (shuffling them across sentences costs much), logged at validation
    # by train-lm too; a constant plan shuffled is the same plan, so the Fixed plans' usage is exactly 0.
    from planlm.stage import read_manifest

    assert read_manifest(model_dir)["last_val_plan_usage"] > 0.3
    assert runs["oracle"].plan_usage.plan_usage_nats > 0.3 and runs["oracle"].plan_usage.plan_usage_ci_low > 0
    oracle = runs["oracle"]
    assert oracle.plan_usage.ppl_shuffled_plans - oracle.ppl == pytest.approx(oracle.plan_usage.plan_usage_ppl)
    assert runs["fixed"].plan_usage.plan_usage_nats == 0
    logged = next((model_dir / "logs").rglob("metrics.csv")).read_text().splitlines()[0].split(",")
    assert "val/plan_usage" in logged
    result = compare(str(tmp_path / "eval-fixed"), str(tmp_path / "eval-oracle"), num_samples=500)
    assert result["ci_high"] < 0 and result["p_value"] < 0.05 and result["articles"] == 20
