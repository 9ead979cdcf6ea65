"""`planlm generate --prompt` through the CLI (top-k, top-p) and generation's sentence-encoder path (a real
SentenceTransformer, with the prepared corpus's normalisation) for the planner's context."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from helpers import chatty_planned_lm, tiny_gpt2, tiny_planner, use_planner
from planlm.args import Runtime
from planlm.cli import main
from planlm.data.artifacts import PreparedDataset
from planlm.data.resources import load_tokenizer
from planlm.models.planned_lm import PlannedLM, PlannedLMConfig
from planlm.plans.config import PlanConfig

PROMPT = "Red blue green. Water fire"


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory):
    """A tiny unconditioned LM whose next-token distribution is peaked enough for top-k/top-p to matter."""
    lm = tiny_gpt2(seed=3)
    with torch.no_grad():
        lm.transformer.wte.weight.mul_(30.0)  # tied output projection: sharper logits
    folder = tmp_path_factory.mktemp("generate_cli") / "model"
    PlannedLM(PlannedLMConfig(tokenizer="gpt2"), lm).save_pretrained(folder)
    return folder


def generate_cli(model_dir, prepared_dir, out_file, *flags) -> dict:
    main(["generate", "--model_dir", str(model_dir), "--prepared_dir", str(prepared_dir), "--prompt", PROMPT,
          "--sampling.max_new_tokens", "10", "--seed", "3", "--runtime.device", "cpu", "--out_file", str(out_file), *flags])
    return json.loads(out_file.read_text())


def next_token_log_probs(model_dir, result: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(. | prefix) (N, V) before each generated token from one full forward of the saved LM, and the tokens."""
    model = PlannedLM.from_pretrained(model_dir).eval()
    prompt_ids = load_tokenizer("gpt2")(PROMPT)["input_ids"]
    tokens = torch.tensor(result["token_ids"])
    ids = torch.tensor([prompt_ids + result["token_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1]  # (N, V)
    return logits.log_softmax(-1), tokens


def test_generate_prompt_through_the_cli_with_top_k_and_top_p(plain_model, synthetic_random, tmp_path, capsys):
    runs = {name: generate_cli(plain_model, synthetic_random, tmp_path / f"{name}.json", *flags) for name, flags in {
        "plain": [], "top_k": ["--sampling.top_k", "3"], "top_p": ["--sampling.top_p", "0.5"],
        "greedy": ["--sampling.temperature", "0"]}.items()}
    printed = capsys.readouterr().out
    assert printed.count(f"PROMPT: {PROMPT}") == 4
    tokenizer = load_tokenizer("gpt2")
    for name, result in runs.items():
        assert result["prompt"] == PROMPT and len(result["token_ids"]) == 10
        assert result["text"] == tokenizer.decode(result["token_ids"]) and result["text"] in printed
        log_probs, tokens = next_token_log_probs(plain_model, result)
        # The KV-cached generation scored each token like one forward over the whole sequence.
        chosen = log_probs.gather(1, tokens[:, None])[:, 0]
        np.testing.assert_allclose(result["token_logprobs"], chosen.numpy(), atol=1e-4)
        probs = log_probs.exp()
        rank = (probs > probs.gather(1, tokens[:, None])).sum(1)  # (N,) tokens more likely than the chosen one
        mass_before = (probs * (probs > probs.gather(1, tokens[:, None]))).sum(1)  # (N,)
        if name == "top_k":
            assert rank.max() < 3
        if name == "top_p":
            assert mass_before.max() < 0.5  # every token inside the 0.5 nucleus
        if name == "greedy":
            assert rank.max() == 0
        if name == "plain":  # the filters above are not vacuous: unfiltered sampling leaves both sets
            assert rank.max() >= 3 and mass_before.max() >= 0.5
    assert runs["top_k"]["token_ids"] != runs["plain"]["token_ids"] != runs["top_p"]["token_ids"]


class TinyEncoder:
    """A random 16-wide SentenceTransformer (BERT, mean pooling, no Normalize module) saved in a folder."""

    @staticmethod
    def build(folder):
        from sentence_transformers import SentenceTransformer, models
        from transformers import AutoTokenizer, BertConfig, BertModel

        from planlm.data.resources import resolve_encoder

        tokenizer = AutoTokenizer.from_pretrained(resolve_encoder("all-MiniLM-L6-v2"))
        torch.manual_seed(0)
        bert = BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=32, max_position_embeddings=64))
        bert.save_pretrained(folder / "bert")
        tokenizer.save_pretrained(folder / "bert")
        word = models.Transformer(str(folder / "bert"), max_seq_length=64)
        SentenceTransformer(modules=[word, models.Pooling(16, "mean")], device="cpu").save(str(folder / "encoder"))
        return SentenceTransformer(str(folder / "encoder"), device="cpu")


def test_generation_embeds_sentences_with_the_corpus_encoder_and_its_normalisation(synthetic_random, tmp_path):
    """A corpus prepared with a real encoder and normalize: true: the planner's context for the prompt's and
    the generated sentences is the encoder's unit-norm embedding of their text."""
    from planlm.evaluate.generate import build_generator
    from planlm.evaluate.generator import SamplingConfig

    encoder = TinyEncoder.build(tmp_path)
    prepared_dir = tmp_path / "prepared"
    shutil.copytree(synthetic_random, prepared_dir)
    manifest = json.loads((prepared_dir / "manifest.json").read_text())
    manifest["encoder"] = str(tmp_path / "encoder")
    manifest["config"]["embedding"] = {"encoder": str(tmp_path / "encoder"), "normalize": True}
    (prepared_dir / "manifest.json").write_text(json.dumps(manifest))
    prepared = PreparedDataset(prepared_dir)
    tiny_planner(prepared).save_pretrained(tmp_path / "planner")
    model = chatty_planned_lm(prepared)  # writes short sentences, so generation re-plans
    use_planner(model, str(tmp_path / "planner"))
    model.save_pretrained(tmp_path / "model")

    generator, _, _ = build_generator(str(tmp_path / "model"), str(prepared_dir), "test", PlanConfig(),
                                      Runtime(device="cpu"), seed=0)
    embedded, contexts = {}, []
    real_embed, real_plan = generator.embed_fn, generator.plan

    def embed(texts):
        out = real_embed(texts)
        embedded.update(zip(texts, out))
        return out

    def plan(context_list, *args):
        contexts.extend(np.array(c) for c in context_list)
        return real_plan(context_list, *args)

    generator.embed_fn, generator.plan = embed, plan
    result = generator.generate(generator.prompt_from_text("Red blue green. Water fire river. Gold"),
                                SamplingConfig(max_new_tokens=24))
    assert result.planner_calls >= 2 and result.rollbacks >= 1  # re-planned on generated sentences
    texts = list(embedded)
    assert texts[:2] == ["Red blue green.", "Water fire river."] and len(texts) > 2  # prompt, then generated
    expected = encoder.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    raw = encoder.encode(texts, normalize_embeddings=False, convert_to_numpy=True)
    assert np.abs(np.linalg.norm(raw, axis=1) - 1).min() > 0.1  # normalisation is not a no-op here
    np.testing.assert_allclose(np.stack([embedded[t] for t in texts]), expected, atol=1e-5)
    longest = max(contexts, key=len)  # the last re-plan: every complete sentence, in order
    np.testing.assert_allclose(longest[:2], expected[:2], atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(longest, axis=1), 1.0, atol=1e-5)
    assert any(np.allclose(longest[2], embedded[t], atol=1e-6) for t in texts[2:])
