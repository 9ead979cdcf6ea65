import json

import numpy as np
import pytest
import torch

from planlm.data.artifacts import PreparedDataset
from planlm.data.resources import load_tokenizer, split_sentences
from planlm.data.tokens import assign_tokens_to_sentences
from planlm.errors import PlanlmError
from planlm.evaluate.generate import generate, generate_text, synthetic_embed_fn
from planlm.evaluate.generator import PlannedGenerator, SamplingConfig, _plan_alignment

from helpers import chatty_planned_lm, linear_output_dtypes, tiny_gpt2, tiny_planned_lm, tiny_planner
from planlm.plans.config import PlanConfig

class CountingPlanner:
    """Records the contexts the planner reads (``start``, once per plan call; the planner itself does the work)."""

    def __init__(self, planner):
        self.planner, self.contexts = planner, []
        original = planner.start

        def start(context_embeds, context_mask, *args, **kwargs):
            for row, mask in zip(context_embeds, context_mask):
                self.contexts.append(row[mask].clone())
            return original(context_embeds, context_mask, *args, **kwargs)

        planner.start = start


def sampled(num_paths=2):
    return PlanConfig(kind="planner_sampled", num_paths=num_paths, horizon=3, planner_dir="unused").resolve()


def test_synthetic_embeddings_land_on_the_centroid_of_the_sentence_action(synthetic_cycle):
    prepared = PreparedDataset(synthetic_cycle)
    embed = synthetic_embed_fn(prepared)
    test = prepared["test"]
    texts = [test.sentence_text(s) for s in range(20)]
    nearest = np.argmin(((embed(texts)[:, None] - prepared.codebook.numpy()[None]) ** 2).sum(-1), 1)
    assert np.array_equal(nearest, np.asarray(test.actions[:20]))


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_replans_exactly_at_generated_sentence_ends_with_the_generated_sentences_as_context(synthetic_cycle, dynamics):
    prepared = PreparedDataset(synthetic_cycle)
    tok = load_tokenizer("gpt2")
    embed = synthetic_embed_fn(prepared)
    # seed 2: every sentence end stays an end; seed 3: the splitter also takes ends back ("red." + "." -> "red..")
    for seed in (2, 3):
        counter = CountingPlanner(tiny_planner(prepared, dynamics=dynamics))
        generator = PlannedGenerator(chatty_planned_lm(prepared), tok, sampled(), planner=counter.planner,
                                     embed_fn=embed, seed=seed)
        result = generator.generate(generator.prompt_from_text("Red water red."), SamplingConfig(max_new_tokens=40))
        final = [s["text"] for s in result.sentences]
        assert len(final) >= 4 and result.rollbacks >= 1
        document = result.prompt + result.text  # the prompt is one open sentence: all of it is re-split
        assert final == [document[a:b] for a, b in split_sentences([document])[0]]
        # one call for the prompt, then one per sentence end, each rolling back to re-feed the sentence's last
        # token; an end taken back and made again costs one more call and rollback
        assert len(counter.contexts) == result.planner_calls == 1 + result.rollbacks
        if seed == 2:
            assert result.planner_calls == len(final) and not result.unaligned_positions
        for j, sentence in enumerate(result.sentences):
            # the plan of sentence j was made after exactly the j sentences before it, from their embeddings
            assert sentence["plan"]["context_sentences"] == j
            seen = [c for c in counter.contexts if len(c) == j][-1]
            if j:
                assert torch.allclose(seen, torch.from_numpy(embed(final[:j])))
        # the ANCHORS alignment holds in the generated text: every token is conditioned on its sentence's plan,
        # except the last token of a sentence, which carries the next one's (thanks to the rollbacks); the only
        # exceptions are the positions reported unaligned (fed a plan whose sentence end was taken back)
        ids = generator.prompt_from_text("Red water red.").input_ids + result.token_ids
        ends = [len(tok.decode(ids[:i + 1])) for i in range(len(ids))]
        offsets = np.stack([[0] + ends[:-1], ends], 1)
        spans = np.asarray(split_sentences([document])[0])
        expected = _plan_alignment(assign_tokens_to_sentences(offsets, spans))
        mismatched = np.flatnonzero(np.asarray(result.token_plan_sentence) != expected)
        assert mismatched.tolist() == result.unaligned_positions
    # no sentence end, no re-planning: an LM that never writes a period
    quiet = CountingPlanner(tiny_planner(prepared, dynamics=dynamics))
    generator = PlannedGenerator(chatty_planned_lm(prepared, period_bias=0.0), tok, sampled(), planner=quiet.planner,
                                 embed_fn=embed, seed=3)
    result = generator.generate(generator.prompt_from_text("Red water"), SamplingConfig(max_new_tokens=30))
    assert "." not in result.text and result.planner_calls == 1 and len(quiet.contexts) == 1


@pytest.mark.parametrize("chatty", [False, True])
def test_kv_cache_gives_the_same_tokens_as_rerunning_the_window(synthetic_cycle, chatty):
    prepared = PreparedDataset(synthetic_cycle)
    tok = load_tokenizer("gpt2")
    model = chatty_planned_lm(prepared) if chatty else tiny_planned_lm(prepared)
    outputs = []
    for use_cache in (True, False):
        generator = PlannedGenerator(model, tok, sampled(), planner=tiny_planner(prepared),
                                     embed_fn=synthetic_embed_fn(prepared), seed=5, use_cache=use_cache)
        # greedy for the plain tiny LM; sampling (same seed) for the chatty one, to cross sentence ends
        config = SamplingConfig(max_new_tokens=60, temperature=1.0 if chatty else 0.0)
        outputs.append(generator.generate(generator.prompt_from_text("Red water red. Water"), config))
    cached, rerun = outputs
    assert cached.token_ids == rerun.token_ids and cached.planner_calls == rerun.planner_calls
    assert cached.lm_calls == rerun.lm_calls
    assert np.allclose(cached.token_logprobs, rerun.token_logprobs, atol=1e-5)  # the same conditioning everywhere
    if chatty:
        assert cached.rollbacks >= 1  # the cache was cropped and extended again


def test_window_slides_past_the_position_limit(synthetic_cycle):
    prepared = PreparedDataset(synthetic_cycle)
    tok = load_tokenizer("gpt2")
    model = tiny_planned_lm(prepared)
    model.lm = tiny_gpt2(n_positions=16)
    results = []
    for use_cache in (True, False):
        result = generate_text(model, tok, "Red water red.", sampling=SamplingConfig(max_new_tokens=40, temperature=0),
                               use_cache=use_cache)
        results.append(result.token_ids)
    assert len(results[0]) == 40 and results[0] == results[1]


@pytest.mark.parametrize("use_cache", [True, False])
def test_at_the_position_limit_every_token_sees_the_last_positions_of_context(synthetic_cycle, use_cache):
    # A prompt as long as the LM's position limit: the first token reads the whole prompt, and every later one the
    # last n_positions tokens, never a window cut to half.
    prepared = PreparedDataset(synthetic_cycle)
    tok = load_tokenizer("gpt2")
    model = tiny_planned_lm(prepared)
    model.lm = tiny_gpt2(n_positions=16)
    prompt = " ".join(["Red water red."] * 4)
    prompt_ids = tok(prompt)["input_ids"]
    assert len(prompt_ids) == 16
    result = generate_text(model, tok, prompt, sampling=SamplingConfig(max_new_tokens=12, temperature=0),
                           use_cache=use_cache)
    ids = prompt_ids + result.token_ids
    with torch.no_grad():
        expected = [float(torch.log_softmax(model.lm(torch.tensor([ids[max(0, i - 16):i]])).logits[0, -1], -1)[ids[i]])
                    for i in range(16, len(ids))]
    assert np.allclose(result.token_logprobs, expected, atol=1e-5)


def test_oracle_generation_from_an_article_prefix_plans_the_true_future(synthetic_random):
    prepared = PreparedDataset(synthetic_random)
    split = prepared["test"]
    tok = load_tokenizer("gpt2")
    cond = PlanConfig(kind="oracle", num_paths=2, horizon=3).resolve()
    generator = PlannedGenerator(chatty_planned_lm(prepared), tok, cond, split=split,
                                 embed_fn=synthetic_embed_fn(prepared), seed=0)
    prompt = generator.prompt_from_article(split, article=0, boundary=2)
    sentences = split.sentence_range(0)
    assert tok.decode(prompt.input_ids).strip() == split.articles[0]["text"][:int(split.sentence_spans[
        sentences.start + 1][1])].strip()
    result = generator.generate(prompt, SamplingConfig(max_new_tokens=30))
    actions = np.asarray(split.actions[sentences.start:sentences.stop])
    for j, sentence in enumerate(result.sentences):
        boundary = 2 + j
        expected = actions[boundary:boundary + 3]
        paths = np.asarray(sentence["plan"]["action_paths"])
        mask = np.asarray(sentence["plan"]["path_mask"])
        for path, valid in zip(paths, mask):
            assert list(path[valid]) == list(expected)
    with pytest.raises(PlanlmError, match="boundary"):
        generator.prompt_from_article(split, article=0, boundary=0)


def test_generate_command_shows_plans_with_example_sentences(synthetic_cycle, cycle_planner, tmp_path, capsys):
    from planlm.cli import main

    prepared = PreparedDataset(synthetic_cycle)
    model_dir = tmp_path / "model"
    chatty_planned_lm(prepared).save_pretrained(model_dir)
    cycle_planner.save_pretrained(tmp_path / "planner")
    main(["generate", "--model_dir", str(model_dir), "--prepared_dir", str(synthetic_cycle), "--article", "3",
          "--boundary", "2", "--plans.kind", "planner_sampled", "--plans.planner_dir", str(tmp_path / "planner"),
          "--sampling.max_new_tokens", "24", "--out_file", str(tmp_path / "gen.json"), "--runtime.device", "cpu"])
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "gen.json").read_text())
    assert "path 1:" in printed and "action " in printed
    examples = result["sentences"][0]["plan"]["actions"]
    train = prepared["train"]
    for action, text in examples.items():  # each example is a train sentence of that action
        index = next(s for s in range(train.num_sentences) if train.sentence_text(s) == text)
        assert int(train.actions[index]) == int(action)
    with pytest.raises(PlanlmError, match="exactly one"):
        generate(str(model_dir), str(synthetic_cycle))


def test_bf16_generation_replans_with_a_causal_planner(synthetic_cycle, bf16_allowed):
    prepared = PreparedDataset(synthetic_cycle)
    counter = CountingPlanner(tiny_planner(prepared, dynamics="causal"))
    model = chatty_planned_lm(prepared)
    with linear_output_dtypes() as seen:
        result = generate_text(model, load_tokenizer("gpt2"), "Red water red.",
                               plans=sampled(num_paths=4), planner=counter.planner,
                               embed_fn=synthetic_embed_fn(prepared), sampling=SamplingConfig(max_new_tokens=30),
                               seed=3, precision="bf16")
    # the LM, the adapter and the planner all ran under bf16 autocast
    planner_layers = [m for m in counter.planner.modules() if m in seen]
    assert planner_layers and all(seen[m] == {torch.bfloat16} for m in planner_layers)
    assert seen[model.lm.lm_head] == seen[model.adapter.projection] == {torch.bfloat16}
    assert len(result.token_ids) == 30 and result.planner_calls == len(counter.contexts) >= 2
    for sentence in result.sentences:
        paths = np.asarray(sentence["plan"]["action_paths"])
        assert paths.shape == (4, 3) and paths.min() >= 0 and paths.max() < 8
