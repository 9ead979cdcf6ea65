"""PlannedLM on tiny random HF models of several architectures."""

from __future__ import annotations

import pytest
import torch

from planlm.errors import PlanlmError
from planlm.models.adapter import AdapterConfig
from planlm.models.planned_lm import PlannedLM, PlannedLMConfig, load_causal_lm, output_cache
from planlm.plans.config import PlanConfig

VOCAB, WIDTH = 120, 32
ARCHITECTURES = {
    "gpt2": {"model_type": "gpt2", "n_layer": 2, "n_embd": WIDTH, "n_head": 2, "n_positions": 64,
             "bos_token_id": 0, "eos_token_id": 0},
    "llama": {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": WIDTH, "intermediate_size": 64,
              "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64},
    "gpt_neox": {"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": WIDTH, "intermediate_size": 64,
                 "num_attention_heads": 2, "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": 0},
    "opt": {"model_type": "opt", "num_hidden_layers": 2, "hidden_size": WIDTH, "ffn_dim": 64, "num_attention_heads": 2,
            "max_position_embeddings": 64, "word_embed_proj_dim": WIDTH, "bos_token_id": 0, "eos_token_id": 0,
            "pad_token_id": 0},
}


def planned(model_type: str = "gpt2", adapter: str = "multipath", init_no_op: bool = True, seed: int = 0):
    """A planned LM; ``init_no_op`` false: W and b at PyTorch's init instead of the no-op zero (plans that move)."""
    torch.manual_seed(seed)
    lm = load_causal_lm(None, ARCHITECTURES[model_type], vocab_size=VOCAB).eval()
    adapter_config = AdapterConfig(kind=adapter, num_actions=8, action_dim=6, hidden_size=WIDTH, horizon=3)
    config = PlannedLMConfig(plans=PlanConfig(kind="oracle", num_paths=2, horizon=3), adapter=adapter_config, num_actions=8)
    model = PlannedLM(config, lm, codebook=torch.randn(8, 6)).eval()
    if not init_no_op:
        model.adapter.projection.reset_parameters()
    return model


def inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, VOCAB, (2, 12), generator=gen)  # (B, L)
    action_paths = torch.randint(0, 8, (3, 2, 3), generator=gen)  # (N, K, T)
    plan_index = torch.tensor([[-1] * 6 + [0] * 3 + [1] * 3, [1] * 4 + [2] * 8])  # (B, L)
    return input_ids, action_paths, plan_index


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_conditioning_off_and_fresh_adapter_leave_the_lm_unchanged(model_type):
    model = planned(model_type)
    input_ids, action_paths, plan_index = inputs()
    with torch.no_grad():
        bare = model.lm(input_ids=input_ids).logits
        torch.testing.assert_close(model(input_ids).logits, bare, rtol=0, atol=0)  # no plans: the bare LM
        # A fresh adapter (projection at zero) enters through inputs_embeds and changes nothing either.
        fresh = model(input_ids, action_paths=action_paths, plan_index=plan_index).logits
        torch.testing.assert_close(fresh, bare, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_plans_change_exactly_the_conditioned_tokens_and_later(model_type):
    model = planned(model_type, init_no_op=False)
    input_ids, action_paths, plan_index = inputs()
    with torch.no_grad():
        bare = model.lm(input_ids=input_ids).logits  # (B, L, V)
        conditioned = model(input_ids, action_paths=action_paths, plan_index=plan_index).logits
    # Row 0: tokens 0..5 carry no plan, so (causal LM) their logits are the bare LM's; token 6 on differs.
    torch.testing.assert_close(conditioned[0, :6], bare[0, :6], rtol=1e-5, atol=1e-5)
    assert (conditioned[0, 6:] - bare[0, 6:]).abs().amax(-1).min() > 1e-4
    assert (conditioned[1] - bare[1]).abs().amax(-1).min() > 1e-4
    # Precomputed plan_embeds (B, L, D) are the same thing.
    plan_embeds = model.token_plan_embeds(model.plan_vectors(action_paths), plan_index)
    assert plan_embeds.shape == (2, 12, WIDTH) and torch.count_nonzero(plan_embeds[0, :6]) == 0
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids, plan_embeds=plan_embeds).logits, conditioned)


def test_labels_are_shifted_inside_and_ignore_padding():
    model = planned(init_no_op=False)
    input_ids, action_paths, plan_index = inputs()
    labels = input_ids.clone()
    labels[1, 8:] = -100
    with torch.no_grad():
        out = model(input_ids, labels=labels, action_paths=action_paths, plan_index=plan_index)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1),
                                                 ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)


def test_kv_cache_with_plans_matches_a_full_forward():
    model = planned(init_no_op=False)
    input_ids, action_paths, plan_index = inputs()
    plan_embeds = model.token_plan_embeds(model.plan_vectors(action_paths), plan_index)
    with torch.no_grad():
        full = model(input_ids, plan_embeds=plan_embeds).logits
        first = model(input_ids[:, :7], plan_embeds=plan_embeds[:, :7], use_cache=True)
        rest = model(input_ids[:, 7:], plan_embeds=plan_embeds[:, 7:], cache=output_cache(first), use_cache=True).logits
    torch.testing.assert_close(torch.cat([first.logits, rest], 1), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model_type", ["gpt2", "gpt_neox"])
def test_save_and_reload_round_trip(tmp_path, model_type):
    model = planned(model_type, init_no_op=False)
    input_ids, action_paths, plan_index = inputs()
    model.save_pretrained(tmp_path / "model")
    assert {p.name for p in (tmp_path / "model").iterdir()} >= {"lm", "adapter.safetensors", "planned_lm.json",
                                                                "codebook.safetensors"}
    reloaded = PlannedLM.from_pretrained(tmp_path / "model").eval()
    assert reloaded.config == model.config
    torch.testing.assert_close(reloaded.codebook, model.codebook)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids, action_paths=action_paths, plan_index=plan_index).logits,
                                   model(input_ids, action_paths=action_paths, plan_index=plan_index).logits)
    with pytest.raises(PlanlmError, match="planned_lm.json missing"):
        PlannedLM.from_pretrained(tmp_path)


def test_load_causal_lm_errors_are_one_line():
    with pytest.raises(PlanlmError, match="model_type"):
        load_causal_lm(None, {"n_layer": 2})
    with pytest.raises(PlanlmError, match="token embeddings"):
        load_causal_lm(None, {**ARCHITECTURES["gpt2"], "vocab_size": 50}, vocab_size=VOCAB)
    with pytest.raises(PlanlmError, match="could not be loaded"):
        load_causal_lm("/nonexistent/model-folder")
    with pytest.raises(PlanlmError, match="no LM given"):
        load_causal_lm(None, None)


# ---------------------------------------------------------------------------------------------- windows


def test_backward_through_the_plans_is_reproducible(two_threads):
    """Many tokens share a plan; their gradients must sum in the same order every time (advanced indexing's
    CPU backward adds them with parallel atomics and changed trained weights from run to run)."""
    model = planned("gpt2", adapter="project_avg", init_no_op=False)  # eval: no dropout draws
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, VOCAB, (16, 64), generator=gen)  # (B, L): B*L*D above the parallel grain
    action_paths = torch.randint(0, 8, (3, 2, 3), generator=gen)  # (N, K, T)
    plan_index = torch.randint(-1, 3, (16, 64), generator=gen)  # (B, L)

    def grads() -> list[torch.Tensor]:
        model.zero_grad()
        model(input_ids, labels=input_ids, action_paths=action_paths, plan_index=plan_index).loss.backward()
        return [p.grad.clone() for p in model.adapter.parameters() if p.grad is not None]

    first = grads()
    for _ in range(30):
        assert all(torch.equal(a, b) for a, b in zip(first, grads()))
