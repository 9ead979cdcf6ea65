"""Plan guidance (``SamplingConfig.plan_guidance``): each token is drawn from l_null + w (l_plan - l_null), the null
plan being the action prior in expectation; w = 1 is generation as before (and keeps the reuse keys), the KV cache
serves both rows, and the commands take it."""

from __future__ import annotations

import csv
import shutil
from collections import Counter

import numpy as np
import pytest
import torch

from planlm.args import Runtime
from planlm.data.artifacts import PreparedDataset
from planlm.data.resources import load_tokenizer
from planlm.errors import PlanlmError
from planlm.evaluate.adherence import adherence, paired_difference
from planlm.evaluate.generate import action_prior, generate, generate_text, synthetic_embed_fn
from planlm.evaluate.generator import PlannedGenerator, SamplingConfig
from planlm.jsonio import fingerprint
from planlm.models.planned_lm import PlannedLM, PlannedLMConfig
from planlm.plans.config import PlanConfig
from planlm.stage.manifest import read_manifest

from helpers import chatty_planned_lm, tiny_gpt2


def _generator(prepared, adapter="project_avg", prior=None, seed=0, use_cache=True):
    return PlannedGenerator(chatty_planned_lm(prepared, adapter=adapter), load_tokenizer("gpt2"),
                            PlanConfig(kind="oracle", num_paths=2, horizon=3), split=prepared["test"], seed=seed,
                            embed_fn=synthetic_embed_fn(prepared), action_prior=prior, use_cache=use_cache)


@pytest.mark.parametrize("adapter", ["project_avg", "multipath"])
def test_guided_logits_extrapolate_from_the_null_plan(synthetic_random, adapter):
    prepared = PreparedDataset(synthetic_random)
    prior = action_prior(prepared)
    generator = _generator(prepared, adapter, prior)
    state = generator._start(generator.prompt_from_article(prepared["test"], article=0, boundary=2))
    plan, null, guided = (generator._next_logits(state, use_cache=False, guidance=w) for w in (1.0, 0.0, 3.0))
    assert torch.allclose(guided, null + 3 * (plan - null), atol=1e-4)
    assert (plan - null).abs().max() > 1e-3  # the plans change the logits, so guidance has something to scale
    # the null row is the LM with the null vector at every position, computed here without the generator
    ids = torch.tensor(state.ids)[None]
    embeds = generator.null_vector().expand(1, len(state.ids), -1)
    with torch.no_grad():
        direct = generator.model(input_ids=ids, plan_embeds=embeds).logits[0, -1]
    assert torch.allclose(null, direct, atol=1e-4)
    if adapter == "project_avg":  # linear in the step embeddings: the prior's mix of one-action plans
        one_action = torch.arange(prepared.num_actions)[:, None, None].expand(-1, 2, 3)
        with torch.no_grad():
            mixed = (torch.as_tensor(prior / prior.sum(), dtype=torch.float32)[:, None]
                     * generator.model.plan_vectors(one_action)).sum(0)
        assert torch.allclose(generator.null_vector(), mixed, atol=1e-5)


def test_the_null_plan_follows_the_prior_and_defaults_to_uniform(synthetic_random):
    prepared = PreparedDataset(synthetic_random)
    uniform = _generator(prepared).null_vector()
    assert torch.allclose(uniform, _generator(prepared, prior=np.ones(prepared.num_actions)).null_vector())
    peaked = np.eye(prepared.num_actions)[3]
    one = _generator(prepared, prior=peaked)
    paths = torch.full((1, 2, 3), 3)
    with torch.no_grad():
        assert torch.allclose(one.null_vector(), one.model.plan_vectors(paths)[0], atol=1e-5)
    assert not torch.allclose(uniform, one.null_vector())
    with pytest.raises(PlanlmError, match="action_prior: 8 non-negative frequencies"):
        _generator(prepared, prior=np.ones(3)).null_vector()


def test_the_action_prior_counts_every_train_sentence_by_its_action(synthetic_random):
    """The null plan's prior is the train split's action frequencies (generation and adherence run on the test
    split, whose actions it must not read): each train sentence counted once, under its action."""
    prepared = PreparedDataset(synthetic_random)
    train, test = prepared["train"], prepared["test"]
    by_hand = Counter(int(train.actions[s]) for s in range(train.num_sentences))
    prior = action_prior(prepared)
    assert prior.tolist() == [by_hand.get(a, 0) for a in range(prepared.num_actions)]
    assert prior.sum() == train.num_sentences != test.num_sentences


def test_a_prior_on_one_action_gives_that_action_s_plan_on_every_path_and_step_with_multipath(synthetic_random):
    """A multipath adapter reads the order of steps (position embeddings) and attends over the K paths, so the null
    plan must have the generator's K paths of T steps: a prior concentrated on one action is then exactly the plan
    that takes that action on every path and step, (1, K, T)."""
    prepared = PreparedDataset(synthetic_random)
    one = _generator(prepared, adapter="multipath", prior=np.eye(prepared.num_actions)[5])
    with torch.no_grad():
        expected = one.model.plan_vectors(torch.full((1, 2, 3), 5))[0]  # K = 2 paths of T = 3 steps
        shorter = one.model.plan_vectors(torch.full((1, 1, 1), 5))[0]
    assert not torch.allclose(expected, shorter, atol=1e-3)  # the plan's shape matters to this adapter
    assert float((one.null_vector() - expected).abs().max()) < 1e-5


def test_guidance_one_is_plain_generation_and_the_cache_serves_both_rows(synthetic_random):
    prepared = PreparedDataset(synthetic_random)
    prompt = _generator(prepared).prompt_from_article(prepared["test"], article=1, boundary=2)
    runs = {}
    for w, use_cache in ((None, True), (1.0, True), (3.0, True), (3.0, False)):
        config = SamplingConfig(max_new_tokens=40, **({} if w is None else {"plan_guidance": w}))
        runs[w, use_cache] = _generator(prepared, seed=4, use_cache=use_cache).generate(prompt, config)
    assert runs[None, True].token_ids == runs[1.0, True].token_ids
    guided, rerun = runs[3.0, True], runs[3.0, False]
    assert guided.token_ids == rerun.token_ids and guided.rollbacks >= 1  # cropped and extended, both rows
    assert np.allclose(guided.token_logprobs, rerun.token_logprobs, atol=1e-4)
    assert guided.token_ids != runs[1.0, True].token_ids


def test_reuse_keys_are_unchanged_without_guidance_and_bad_settings_are_one_line():
    plain = SamplingConfig(max_new_tokens=12)
    assert "plan_guidance" not in plain.reuse_key()
    assert fingerprint(plain.reuse_key()) == fingerprint({"max_new_tokens": 12, "temperature": 1.0, "top_k": None,
                                                          "top_p": None})
    assert SamplingConfig(plan_guidance=2.0).reuse_key()["plan_guidance"] == 2.0
    as_int, as_float = SamplingConfig(plan_guidance=3), SamplingConfig(plan_guidance=3.0)
    assert fingerprint(as_int.reuse_key()) == fingerprint(as_float.reuse_key())
    with pytest.raises(PlanlmError, match=r"--sampling.plan_guidance -1.0 must be >= 0 \(1 = off\)"):
        SamplingConfig(plan_guidance=-1.0)
    plain_lm = PlannedLM(PlannedLMConfig(tokenizer="gpt2"), tiny_gpt2())
    with pytest.raises(PlanlmError, match="this model reads no plans"):
        generate_text(plain_lm, load_tokenizer("gpt2"), "Red.", sampling=SamplingConfig(plan_guidance=2.0))


def test_generate_and_adherence_take_the_guidance(synthetic_random, tmp_path, capsys):
    prepared = PreparedDataset(synthetic_random)
    chatty_planned_lm(prepared).save_pretrained(tmp_path / "oracle")
    runtime = Runtime(device="cpu")
    out = {w: generate(str(tmp_path / "oracle"), str(synthetic_random), article=0, boundary=2, runtime=runtime,
                       sampling=SamplingConfig(max_new_tokens=30, plan_guidance=w)) for w in (1.0, 4.0)}
    first = [out[w]["token_logprobs"][0] for w in (1.0, 4.0)]  # the same prompt, the guided distribution
    assert first[0] != pytest.approx(first[1], abs=1e-4)
    kwargs = dict(max_articles=3, outlines_per_article=2, outline_length=2, tokens_per_sentence=10,
                  conditions=["outline", "shuffled"], bootstrap_samples=20, runtime=runtime)
    plain = adherence(str(tmp_path / "oracle"), str(synthetic_random), str(tmp_path / "plain"), **kwargs)
    adherence(str(tmp_path / "oracle"), str(synthetic_random), str(tmp_path / "adh"), **kwargs)
    guided = adherence(str(tmp_path / "oracle"), str(synthetic_random), str(tmp_path / "adh"), plan_guidance=4.0,
                       **kwargs)  # another key: the folder is rebuilt, not reused
    assert read_manifest(tmp_path / "adh")["config"]["sampling"]["plan_guidance"] == 4.0
    assert "plan guidance 4" in capsys.readouterr().out
    # paired: a folder against itself differs by nothing; guided - plain is the difference of their means
    same = paired_difference(tmp_path / "plain", tmp_path / "plain", str(synthetic_random), num_samples=20)
    assert set(same) == {"outline", "shuffled", "shuffled_asked"}
    assert all(v["mean"] == 0 and v["ci_low"] == v["ci_high"] == 0 for c in same.values() for v in c.values())
    # a folder written before the asked column pairs on everything but shuffled_asked
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "plain", old)
    with open(old / "per_sentence.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(old / "per_sentence.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "asked"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    assert set(paired_difference(old, tmp_path / "plain", str(synthetic_random), num_samples=20)) == {"outline",
                                                                                                       "shuffled"}
    difference = paired_difference(tmp_path / "adh", tmp_path / "plain", str(synthetic_random), num_samples=20)
    for condition in ("outline", "shuffled_asked"):
        for name in ("adherence", "of_asked"):
            expected = (getattr(guided.conditions[condition], name).mean
                        - getattr(plain.conditions[condition], name).mean)
            assert difference[condition][name]["mean"] == pytest.approx(expected)
