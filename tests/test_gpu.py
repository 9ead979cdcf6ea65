"""CUDA paths: bf16 autocast by default (precision auto), planner sampling and evaluation on the GPU.

Run with ``pytest -m gpu`` on a machine with CUDA; skipped elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.evaluate.perplexity import evaluate, evaluate_split
from planlm.plans.cache import load_plans
from planlm.plans.config import PlanConfig
from planlm.plans.draws import draw_plans
from planlm.plans.sampling import sample_plans

from helpers import linear_output_dtypes, sampled_multipath, tiny_planner, use_planner
from planlm.plans.config import PlanConfig

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_planner_samples_on_cuda_in_bf16_by_default(synthetic_cycle, tmp_path, dynamics):
    prepared = PreparedDataset(synthetic_cycle)
    folder = tiny_planner(prepared, dynamics=dynamics, max_sentences=4).save_pretrained(tmp_path / "planner")
    with linear_output_dtypes() as seen:
        out = sample_plans(str(synthetic_cycle), PlanConfig(planner_dir=str(folder), num_paths=4, horizon=3),
                           splits=["validation"],
                           runtime=Runtime(device="cuda"), out_dir=str(tmp_path / "plans"))  # auto: bf16 on CUDA
    assert seen and set().union(*seen.values()) == {torch.bfloat16}
    plans = load_plans(out, "validation", prepared=prepared)
    assert plans.shape == (prepared["validation"].num_sentences, 4, 3) and 0 <= plans.min() and plans.max() < 8
    # reproducible on the GPU, and greedy paths mostly agree with fp32 on the CPU (bf16 rounding aside)
    planner = tiny_planner(prepared, dynamics=dynamics, max_sentences=4)
    split = prepared["validation"]
    sampled = PlanConfig(kind="planner_sampled", num_paths=4, horizon=3).resolve()
    greedy = PlanConfig(kind="planner_sampled", num_paths=1, horizon=3, temperature=0.0).resolve()
    again = draw_plans(planner, split, sampled, device="cuda", precision="auto").paths
    np.testing.assert_array_equal(again, draw_plans(planner, split, sampled, device="cuda", precision="auto").paths)
    greedy_gpu = draw_plans(planner, split, greedy, device="cuda", precision="bf16").paths
    greedy_cpu = draw_plans(planner.cpu(), split, greedy, device="cpu", precision="fp32").paths
    assert np.mean(greedy_gpu == greedy_cpu) > 0.8


def test_evaluation_on_cuda_runs_bf16_and_matches_fp32_closely(synthetic_random, tmp_path):
    prepared = PreparedDataset(synthetic_random)
    split = prepared["test"]
    model, cond = sampled_multipath(prepared, tmp_path / "planner")
    # planner-sampled evaluation on the GPU: every layer (LM, adapter, planner) under bf16 autocast
    with linear_output_dtypes() as seen:
        sampled = evaluate_split(model, prepared, split, cond, num_articles=4, batch_size=4, device="cuda")
    assert set().union(*seen.values()) == {torch.bfloat16}
    assert seen[model.lm.lm_head] == {torch.bfloat16} and np.isfinite(sampled["nll_sums"]).all()
    # oracle plans: bf16 on CUDA, fp32 on CUDA and fp32 on CPU agree up to rounding
    oracle = PlanConfig(kind="oracle", num_paths=2, horizon=3).resolve()
    nll = {(device, precision): evaluate_split(model, prepared, split, oracle, num_articles=4, batch_size=4,
                                               device=device, precision=precision)["nll_sums"]
           for device, precision in (("cuda", "auto"), ("cuda", "fp32"), ("cpu", "fp32"))}
    np.testing.assert_allclose(nll["cuda", "fp32"], nll["cpu", "fp32"], rtol=1e-4)
    assert not np.array_equal(nll["cuda", "auto"], nll["cuda", "fp32"])
    np.testing.assert_allclose(nll["cuda", "auto"], nll["cuda", "fp32"], rtol=2e-2)
    # the command on the GPU, with the planner sampling there too
    use_planner(model, str(tmp_path / "planner"))
    model.cpu().save_pretrained(tmp_path / "model")
    metrics = evaluate(str(tmp_path / "model"), str(synthetic_random), str(tmp_path / "eval"), max_articles=4,
                       bootstrap_samples=50, runtime=Runtime(device="cuda"))
    assert metrics.precision == "auto" and metrics.ppl > 1 and metrics.ci_low <= metrics.ppl


def test_bf16_generation_on_cuda(synthetic_cycle):
    from planlm.data.resources import load_tokenizer
    from planlm.evaluate.generate import generate_text, synthetic_embed_fn
    from planlm.evaluate.generator import SamplingConfig

    from helpers import chatty_planned_lm

    prepared = PreparedDataset(synthetic_cycle)
    planner = tiny_planner(prepared, dynamics="causal")
    model = chatty_planned_lm(prepared)
    cond = PlanConfig(kind="planner_sampled", num_paths=4, horizon=3, planner_dir="unused").resolve()
    with linear_output_dtypes() as seen:
        result = generate_text(model, load_tokenizer("gpt2"), "Red water red.", plans=cond, planner=planner,
                               embed_fn=synthetic_embed_fn(prepared), sampling=SamplingConfig(max_new_tokens=30),
                               seed=3, device="cuda")
    assert set().union(*seen.values()) == {torch.bfloat16}
    assert len(result.token_ids) == 30 and result.planner_calls >= 2


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_adaptive_path_policies_sample_on_cuda(synthetic_cycle, dynamics):
    from planlm.plans.policy import PathPolicy

    prepared = PreparedDataset(synthetic_cycle)
    split = prepared["validation"]
    planner = tiny_planner(prepared, dynamics=dynamics, max_sentences=4)
    for policy in (PathPolicy("entropy", min_paths=1, max_paths=8), PathPolicy("entropy", min_paths=2, entropy_high=0.5)):
        plans = PlanConfig(kind="planner_sampled", num_paths=8, horizon=3, path_policy=policy).resolve()
        drawn = draw_plans(planner, split, plans, device="cuda", precision="auto")
        paths, counts = drawn.paths, drawn.counts
        assert paths.shape == (split.num_sentences, 8, 3) and 0 <= paths.min() and paths.max() < 8
        assert counts.min() >= policy.min_paths and counts.max() <= 8
        again = draw_plans(planner, split, plans, device="cuda", precision="auto")
        np.testing.assert_array_equal(paths, again.paths)
        np.testing.assert_array_equal(counts, again.counts)  # reproducible on the GPU
