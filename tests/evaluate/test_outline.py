"""Write to a plan: an outline is the plan of the sentences it covers (every path, for both adapters),
the model's own plans or a stop follow it, outline sentences map to their nearest action, bad outlines are one
line, and a tiny LM trained on oracle plans follows an outline far more often than a shuffled one
(``planlm adherence``)."""

from __future__ import annotations

import numpy as np
import pytest

from planlm.args import Runtime
from planlm.cli import main
from planlm.data.artifacts import PreparedDataset
from planlm.data.resources import load_tokenizer
from planlm.errors import PlanlmError
from planlm.evaluate.adherence import (ASKED, OutlineTask, adherence, select_outlines, shuffled_outlines, summarise,
                                       table, task_sources)
from planlm.evaluate.generate import generate, generate_text, synthetic_embed_fn
from planlm.evaluate.generator import PlannedGenerator, SamplingConfig
from planlm.evaluate.metrics import AdherenceMetrics
from planlm.evaluate.outline import Outline
from planlm.models.planned_lm import PlannedLM, PlannedLMConfig
from planlm.plans.config import PlanConfig
from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm

from helpers import chatty_planned_lm, tiny_gpt2, tiny_gpt2_config, tiny_planner

OUTLINE = [5, 1, 7]


@pytest.mark.parametrize("adapter", ["project_avg", "multipath"])
def test_outlined_sentences_plan_the_outline_then_the_planner_or_a_stop(synthetic_cycle, tmp_path, adapter):
    prepared = PreparedDataset(synthetic_cycle)
    model = chatty_planned_lm(prepared, adapter=adapter)
    plans = PlanConfig(kind="planner_sampled", num_paths=2, horizon=3, planner_dir="unused").resolve()
    generator = PlannedGenerator(model, load_tokenizer("gpt2"), plans, planner=tiny_planner(prepared),
                                 embed_fn=synthetic_embed_fn(prepared), seed=2)
    prompt = generator.prompt_from_article(prepared["test"], article=0, boundary=2)
    ours = generator.generate(prompt, SamplingConfig(max_new_tokens=40), outline=Outline(OUTLINE, "planner"))
    assert [s["requested"] for s in ours.sentences[:3]] == OUTLINE and len(ours.sentences) > 3
    for j, sentence in enumerate(ours.sentences[:3]):  # every path is the outline, masked past its end
        paths, mask = np.asarray(sentence["plan"]["action_paths"]), np.asarray(sentence["plan"]["path_mask"])
        assert (paths[mask].reshape(2, -1) == OUTLINE[j:j + 3]).all() and mask.sum(1).tolist() == [min(3, 3 - j)] * 2
    after = ours.sentences[3]
    assert after["requested"] is None and np.asarray(after["plan"]["path_mask"]).all()  # the planner's again
    assert ours.planner_calls >= 2  # the prompt, then the sentences past the outline
    stopped = generator.generate(prompt, SamplingConfig(max_new_tokens=40), outline=Outline(OUTLINE, "stop"))
    assert len(stopped.sentences) == 3 and all(s["complete"] for s in stopped.sentences)
    assert stopped.text.rstrip().endswith(".")


def test_outline_sentences_take_their_nearest_action_and_oracle_models_read_the_outline(synthetic_random):
    prepared = PreparedDataset(synthetic_random)
    test = prepared["test"]
    words = [test.sentence_text(s) for s in range(3)]
    embed = synthetic_embed_fn(prepared)
    actions = Outline(words).actions(prepared.num_actions, embed, prepared.codebook.numpy())
    assert actions.tolist() == [int(a) for a in test.actions[:3]]
    assert Outline([2, "4", words[0]]).actions(8, embed, prepared.codebook.numpy()).tolist() == [2, 4, actions[0]]
    # an oracle model from free text: no article, the outline is the future it reads
    result = generate_text(chatty_planned_lm(prepared), load_tokenizer("gpt2"), "Red water red.",
                           plans=PlanConfig(kind="oracle", num_paths=2, horizon=3), embed_fn=embed,
                           sampling=SamplingConfig(max_new_tokens=40), outline=words, after_outline="stop")
    outlined = [s for s in result.sentences if s.get("requested") is not None]
    assert [s["requested"] for s in outlined] == actions.tolist()
    assert [s["plan"]["action_paths"][0][0] for s in outlined] == actions.tolist()


def test_bad_outlines_are_one_line_errors(synthetic_random, tmp_path, capsys):
    prepared = PreparedDataset(synthetic_random)
    tok, embed = load_tokenizer("gpt2"), synthetic_embed_fn(prepared)
    model = chatty_planned_lm(prepared)
    with pytest.raises(PlanlmError, match=r"action 8 is not in the codebook: its actions are 0\.\.7"):
        generate_text(model, tok, "Red.", plans=PlanConfig(kind="fixed"), embed_fn=embed, outline=[1, 8])
    with pytest.raises(PlanlmError, match="--outline is empty"):
        generate_text(model, tok, "Red.", plans=PlanConfig(kind="fixed"), outline=[])
    plain = PlannedLM(PlannedLMConfig(tokenizer="gpt2"), tiny_gpt2())
    with pytest.raises(PlanlmError, match="this model reads no plans"):
        generate_text(plain, tok, "Red.", embed_fn=embed, outline=[1])
    model.save_pretrained(tmp_path / "planned")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["generate", "--model_dir", str(tmp_path / "planned"), "--prepared_dir", str(synthetic_random),
              "--prompt", "Red.", "--outline", "[3, 99]", "--runtime.device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert "action 99 is not in the codebook: its actions are 0..7" in err and len(err.splitlines()) == 1


def test_shuffled_outlines_are_other_boundaries_outlines():
    tasks = [OutlineTask(a, 1, [a, a, a]) for a in range(6)]
    shuffled = shuffled_outlines(tasks, seed=0, sources=[f"d{a}" for a in range(6)])
    assert sorted(map(tuple, shuffled)) == sorted(tuple(t.actions) for t in tasks)
    assert all(s != t.actions for s, t in zip(shuffled, tasks))


@pytest.mark.parametrize("seed", range(20))
def test_a_shuffled_outline_never_comes_from_the_same_source_document(seed):
    """Three documents of three pieces with two outlines each (18 outlines): every shuffled outline is one of
    another document's, though most outlines have five of their own document's beside them."""
    tasks, sources = [], []
    for document in range(3):
        for piece in range(3):
            for boundary in (1, 5):
                tasks.append(OutlineTask(len(tasks), boundary, [100 * document + 10 * piece + boundary] * 2))
                sources.append(f"speech{document}")
    shuffled = shuffled_outlines(tasks, seed=seed, sources=sources)
    for plan, source in zip(shuffled, sources):
        giver = [t.actions for t in tasks].index(plan)
        assert sources[giver] != source
    with pytest.raises(PlanlmError, match="at least two source documents"):
        shuffled_outlines(tasks[:6], seed=seed, sources=sources[:6])


def test_of_asked_counts_an_unfinished_sentence_as_a_miss(synthetic_random):
    """A condition that writes every sentence it finishes right but finishes half of them: adherence 1, of asked
    1/2; and one that finishes all, half of them right: both 1/2."""
    split = PreparedDataset(synthetic_random)["test"]
    tasks = select_outlines(split, max_articles=6, per_article=2, length=2, seed=0)

    def row(condition, task, j, hit):
        wrote = task.actions[j] if hit else (task.actions[j] + 1) % 8
        return {"seed": 0, "condition": condition, "article": task.article, "requested": task.actions[j],
                "asked": task.actions[j], "realised": wrote, "top5": int(hit), "ranked": np.asarray([wrote])}

    rows = ([row("outline", t, 0, True) for t in tasks]  # the second sentence of each outline left unfinished
            + [row("own", t, j, j == 0) for t in tasks for j in range(2)])
    metrics = summarise(rows, tasks, split, [0], ["outline", "own"], 8, 50, 0.95, 0)
    outline, own = metrics.conditions["outline"], metrics.conditions["own"]
    assert outline.adherence.mean == 1.0 and outline.of_asked.mean == pytest.approx(0.5)
    assert own.adherence.mean == pytest.approx(0.5) and own.of_asked.mean == pytest.approx(0.5)
    assert outline.sentences == [len(tasks)] and outline.sentences_asked == 2 * len(tasks)
    assert "| outline | 100.0% [100.0, 100.0] | 50.0% [" in table(metrics)


def test_the_shuffled_condition_is_also_scored_on_the_outline_it_was_given(synthetic_random):
    # An LM that writes exactly what its plans ask for: under a shuffled outline it misses the true actions and
    # hits every asked one; an LM that writes the truth whatever it is asked is the other way round.
    split = PreparedDataset(synthetic_random)["test"]
    tasks = select_outlines(split, max_articles=6, per_article=2, length=2, seed=0)
    asked = shuffled_outlines(tasks, seed=0, sources=task_sources(tasks, split))
    def rows(writes):
        return [{"seed": 0, "condition": "shuffled", "article": t.article, "requested": t.actions[j],
                 "asked": plan[j], "realised": writes(t.actions[j], plan[j]), "top5": 0,
                 "ranked": np.asarray([writes(t.actions[j], plan[j])])}
                for t, plan in zip(tasks, asked) for j in range(2)]
    for writes, expected in ((lambda true, ask: ask, (0.0, 1.0)), (lambda true, ask: true, (1.0, 0.0))):
        data = rows(writes)
        hits_true = np.mean([r["requested"] == r["asked"] for r in data])  # where the two outlines agree
        metrics = summarise(data, tasks, split, [0], ["shuffled"], split.actions.max() + 1, 50, 0.95, 0)
        assert list(metrics.conditions) == ["shuffled", ASKED]
        got = (metrics.conditions["shuffled"].adherence.mean, metrics.conditions[ASKED].adherence.mean)
        assert got[expected.index(0.0)] == pytest.approx(hits_true) and got[expected.index(1.0)] == 1.0
    assert "| shuffled, scored on the outline it was given |" in table(metrics)


@pytest.fixture(scope="module")
def oracle_model(synthetic_random, tmp_path_factory):
    """A tiny LM trained with oracle plans on synthetic_random (only the plan tells which words come next)."""
    return train_lm(str(synthetic_random), str(tmp_path_factory.mktemp("outline") / "oracle"),
                    model=LMModelConfig(model_config=tiny_gpt2_config()), plans=PlanConfig(kind="oracle"),
                    train=LMTrainConfig(batch_size=4, lr=3e-2, limit_train_batches=40, max_epochs=1,
                                        limit_val_batches=1))


@pytest.mark.slow  # about 35 s on 2 busy cores: trains the LM (40 batches), then writes to 16 outlines
def test_a_model_trained_on_oracle_plans_follows_its_outline_not_a_shuffled_one(oracle_model, synthetic_random,
                                                                                   tmp_path, capsys):
    main(["adherence", "--model_dir", str(oracle_model), "--prepared_dir", str(synthetic_random), "--out_dir",
          str(tmp_path / "adherence"), "--max_articles", "8", "--outlines_per_article", "1", "--conditions",
          "[outline, shuffled]", "--tokens_per_sentence", "10", "--bootstrap_samples", "200", "--runtime.device", "cpu"])
    metrics = AdherenceMetrics.load(tmp_path / "adherence")
    outline, shuffled = metrics.conditions["outline"], metrics.conditions["shuffled"]
    assert outline.sentences[0] >= 15
    # ignoring the outline would score like the shuffled one; following it beats chance several times over
    assert outline.adherence.mean > shuffled.adherence.mean + 0.3
    assert outline.over_chance.ci_low > 2 and outline.top5.mean >= outline.adherence.mean
    assert "| outline |" in capsys.readouterr().out
    again = adherence(str(oracle_model), str(synthetic_random), str(tmp_path / "adherence"), max_articles=8,
                      outlines_per_article=1, conditions=["outline", "shuffled"], tokens_per_sentence=10,
                      bootstrap_samples=200, runtime=Runtime(device="cpu"))
    assert again == metrics  # a finished folder is reused


def test_generate_follows_an_outline_in_words_and_shows_requested_and_realised(synthetic_random, tmp_path, capsys):
    prepared = PreparedDataset(synthetic_random)
    test = prepared["test"]
    words = [test.sentence_text(s) for s in (3, 9, 15)]
    chatty_planned_lm(prepared).save_pretrained(tmp_path / "oracle")  # trained with oracle plans: no planner
    out = generate(str(tmp_path / "oracle"), str(synthetic_random), prompt="Red water red.", outline=words,
                   after_outline="stop", sampling=SamplingConfig(max_new_tokens=48), runtime=Runtime(device="cpu"))
    printed = capsys.readouterr().out
    outlined = [s for s in out["sentences"] if s.get("requested") is not None]
    assert [s["requested"] for s in outlined] == [int(test.actions[s]) for s in (3, 9, 15)]
    assert all("realised" in s and s["requested_example"] for s in outlined)
    assert printed.count("requested ") == len(outlined) and "realised " in printed
