"""``train_planner`` end to end on synthetic corpora: learning the rule, baselines, summary, resume, errors, CLI."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch

from planlm.cli import main as cli_main
from planlm.data.artifacts import PreparedDataset, PreparedSplit, write_split
from planlm.errors import PlanlmError
from planlm.models.planner import Planner, PlannerConfig, PlannerSettings
from planlm.plans.cache import load_plans
from planlm.plans.config import PlanConfig
from planlm.plans.sampling import sample_plans
from planlm.testing.synthetic import make_synthetic_prepared
from planlm.train.boundaries import LengthGroupedSampler
from planlm.train.planner import PlannerTrainArgs, train_planner
from planlm.train.planner_metrics import baseline_metrics, evaluate_planner
from planlm.train.planner_module import LightningPlanner

TINY_MODEL = PlannerSettings(d_model=32, num_heads=2, dim_feedforward=64, horizon=4, dropout=0.0)


def tiny_train(**overrides) -> PlannerTrainArgs:
    return PlannerTrainArgs(**{"batch_size": 64, "lr": 1e-2, "max_epochs": 5, **overrides})


def with_context(split: PreparedSplit, min_context: int) -> np.ndarray:
    """Boundaries with at least ``min_context`` sentences before them in their article."""
    sentences = np.arange(split.num_sentences)
    return sentences[sentences - split.sentence_offsets[split.sentence_article] >= min_context]


@pytest.fixture(scope="module")
def cycle_planner(synthetic_cycle, tmp_path_factory):
    return train_planner(str(synthetic_cycle), str(tmp_path_factory.mktemp("cycle") / "planner"), TINY_MODEL,
                         tiny_train())


def test_planner_learns_the_cycle_rule_several_steps_ahead(cycle_planner, synthetic_cycle):
    expected = {"model.safetensors", "config.json", "prepared.json", "summary.json", "summary.md", "manifest.json"}
    assert expected <= {p.name for p in cycle_planner.iterdir()}
    assert (cycle_planner / "checkpoints" / "last.ckpt").is_file() and (cycle_planner / "checkpoints" / "best.ckpt").is_file()
    planner = Planner.from_pretrained(cycle_planner)
    split = PreparedDataset(synthetic_cycle)["validation"]
    # The first sentence of an article is random; every later action follows from the one before.
    metrics = evaluate_planner(planner, split, horizon=4, sentences=with_context(split, 1))
    for mode in ("planner_teacher_forced", "planner_free_running"):
        assert min(metrics[mode]["top1"][:3]) >= 0.95, metrics[mode]
    # The argmax plans of a trained planner follow the rule: a_{t+1} = a_t + 1 mod 8.
    plans_dir = sample_plans(str(synthetic_cycle), PlanConfig(planner_dir=str(cycle_planner), num_paths=2,
                                                              temperature=0.0), splits=["validation"])
    greedy = np.asarray(load_plans(plans_dir, "validation", argmax=True))[with_context(split, 1)]
    assert np.mean(greedy[:, 1:] == (greedy[:, :-1] + 1) % 8) >= 0.95


def test_causal_dynamics_learns_the_cycle_rule_and_samples_from_its_cache(synthetic_cycle, tmp_path):
    from dataclasses import replace

    out = train_planner(str(synthetic_cycle), str(tmp_path / "planner"), replace(TINY_MODEL, dynamics="causal"),
                        tiny_train(max_epochs=10))  # about as long as the recurrent planner's 5 epochs
    planner = Planner.from_pretrained(out)
    assert planner.config.dynamics == "causal"
    split = PreparedDataset(synthetic_cycle)["validation"]
    metrics = evaluate_planner(planner, split, horizon=4, sentences=with_context(split, 1))
    for mode in ("planner_teacher_forced", "planner_free_running"):  # chance: 1/8; 0.94-1.0 measured, the step-2
        assert min(metrics[mode]["top1"][:3]) >= 0.9, metrics[mode]  # value moves with the suite's thread order
    plans_dir = sample_plans(str(synthetic_cycle), PlanConfig(planner_dir=str(out), num_paths=3, temperature=0.25),
                             splits=["validation"])
    paths = np.asarray(load_plans(plans_dir, "validation"))[with_context(split, 1)]  # (N, K, T)
    assert np.mean(paths[..., 1:] == (paths[..., :-1] + 1) % 8) >= 0.9


def test_a_planner_with_warm_up_learns_the_cycle_rule(synthetic_cycle, tmp_path):
    """warmup_steps reaches the trained planner's folder key and it still learns."""
    from dataclasses import replace

    out = train_planner(str(synthetic_cycle), str(tmp_path / "planner"), replace(TINY_MODEL, dynamics="causal"),
                        tiny_train(max_epochs=10, warmup_steps=5))
    planner = Planner.from_pretrained(out)
    key = json.loads((out / "manifest.json").read_text())["config"]
    assert key["train"]["warmup_steps"] == 5
    split = PreparedDataset(synthetic_cycle)["validation"]
    metrics = evaluate_planner(planner, split, horizon=4, sentences=with_context(split, 1))
    assert min(metrics["planner_teacher_forced"]["top1"][:3]) >= 0.9, metrics


def test_planner_warm_up_ramps_the_rate_and_the_default_keeps_it_constant():
    planner = Planner(PlannerConfig(num_actions=4, embedding_dim=8, d_model=16, num_heads=2, dim_feedforward=32,
                                    horizon=2))
    assert isinstance(LightningPlanner(planner, lr=1e-3).configure_optimizers(), torch.optim.AdamW)  # no schedule
    warm = LightningPlanner(planner, lr=1e-3, warmup_steps=4).configure_optimizers()
    rates = []
    for _ in range(6):
        rates.append(warm["optimizer"].param_groups[0]["lr"])
        warm["optimizer"].step()
        warm["lr_scheduler"]["scheduler"].step()
    assert rates == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])


def test_summary_reports_planner_and_baselines_per_step(cycle_planner):
    summary = json.loads((cycle_planner / "summary.json").read_text())
    metrics = summary["metrics"]
    assert set(metrics) == {"planner_teacher_forced", "planner_free_running", "majority", "unigram", "bigram"}
    for name, values in metrics.items():
        assert len(values["top1"]) == len(values["top5"]) == summary["horizon"] == 4
        assert values["count"][0] == summary["num_boundaries"]
    assert metrics["majority"]["nll"] is None
    # Step 1 over all boundaries (first sentences included): far above frequency baselines.
    assert metrics["planner_teacher_forced"]["top1"][0] > metrics["unigram"]["top1"][0] + 0.5
    assert metrics["planner_teacher_forced"]["nll"][0] < metrics["unigram"]["nll"][0]
    markdown = (cycle_planner / "summary.md").read_text()
    assert "Top-1 accuracy per step" in markdown and "| 1 |" in markdown and "bigram" in markdown


def test_summary_holds_the_planners_information_per_step(cycle_planner):
    summary = json.loads((cycle_planner / "summary.json").read_text())
    metrics, information = summary["metrics"], summary["information"]
    assert information["unigram_nll"] == metrics["unigram"]["nll"]
    for rollout in ("teacher_forced", "free_running"):
        planner_nll = metrics[f"planner_{rollout}"]["nll"]
        nats, share = information[rollout]["nats"], information[rollout]["share"]
        assert len(nats) == len(share) == summary["horizon"]
        for step, unigram in enumerate(metrics["unigram"]["nll"]):
            assert nats[step] == pytest.approx(unigram - planner_nll[step], abs=1e-12)
            assert share[step] == pytest.approx(nats[step] / unigram, abs=1e-12)
    # The cycle rule names the next action: the planner knows most of what the frequencies do not.
    assert information["teacher_forced"]["share"][0] > 0.5
    markdown = (cycle_planner / "summary.md").read_text()
    step1 = information["teacher_forced"]["nats"][0]
    assert "## Information per step" in markdown and f"{step1:+.3f}" in markdown


@pytest.mark.slow  # ~25 s on one core: the two-sentence rule needs 30 small-batch epochs
def test_planner_learns_the_skip_rule_and_beats_the_bigram(tmp_path):
    prepared = make_synthetic_prepared(tmp_path / "skip", rule="skip", seed=2)
    out = train_planner(str(prepared), str(tmp_path / "planner"), TINY_MODEL,
                        tiny_train(max_epochs=30, batch_size=32, lr=5e-3))
    split = PreparedDataset(prepared)["validation"]
    metrics = evaluate_planner(Planner.from_pretrained(out), split, horizon=4, sentences=with_context(split, 1))
    assert min(metrics["planner_free_running"]["top1"][:3]) >= 0.95, metrics
    summary = json.loads((out / "summary.json").read_text())["metrics"]
    # a_{i+1} = a_i + a_{i-1}: the previous action alone (bigram) cannot know it.
    for step in range(3):
        assert summary["planner_free_running"]["top1"][step] > summary["bigram"]["top1"][step] + 0.3
        assert summary["planner_free_running"]["top1"][step] > summary["majority"]["top1"][step] + 0.3


def _hand_split(path, articles: list[list[int]]) -> PreparedSplit:
    actions = np.concatenate([np.asarray(a) for a in articles])
    sentence_offsets = np.concatenate([[0], np.cumsum([len(a) for a in articles])])
    num = len(actions)
    write_split(path, [{"id": str(i), "text": "x" * len(a)} for i, a in enumerate(articles)], {
        "sentence_offsets": sentence_offsets, "sentence_spans": np.zeros((num, 2)),
        "embeddings": np.zeros((num, 2)), "actions": actions,
        "token_offsets": sentence_offsets, "input_ids": np.zeros(num), "token_sentence": np.arange(num)})
    return PreparedSplit(path)


def test_baselines_on_a_hand_checkable_case(tmp_path):
    train = _hand_split(tmp_path / "train", [[0, 1, 0, 1], [0, 1, 1], [1, 0]])
    evaluation = _hand_split(tmp_path / "eval", [[1, 0]])
    # counts: a0 = 4, a1 = 5, a2 = 0 -> unigram (add-one) = [5, 6, 1] / 12, majority = 1.
    # pairs: 0->1 x3, 1->0 x2, 1->1 x1 -> rows (add-one): P0 = [1, 4, 1]/6, P1 = [3, 2, 1]/6, P2 = [1, 1, 1]/3.
    metrics = baseline_metrics(train, evaluation, horizon=2, num_actions=3)
    # Boundary 0 (opens the article): targets 1, 0; boundary 1 (previous action 1): target 0, then past the end.
    assert metrics["majority"]["count"] == [2, 1]
    assert metrics["majority"]["top1"] == [0.5, 0.0]
    assert metrics["unigram"]["nll"][0] == pytest.approx((-math.log(6 / 12) - math.log(5 / 12)) / 2)
    assert metrics["unigram"]["nll"][1] == pytest.approx(-math.log(5 / 12))
    # bigram: step 1 of boundary 0 = unigram (argmax 1, right), of boundary 1 = P1 (argmax 0, right);
    # step 2 of boundary 0 = unigram @ P: [25, 34, 13] / 72 -> argmax 1, wrong; p(0) = 25/72.
    assert metrics["bigram"]["top1"] == [1.0, 0.0]
    assert metrics["bigram"]["nll"][0] == pytest.approx((-math.log(6 / 12) - math.log(3 / 6)) / 2)
    assert metrics["bigram"]["nll"][1] == pytest.approx(-math.log(25 / 72))
    assert metrics["bigram"]["top5"] == [1.0, 1.0]  # only 3 actions: every target is in the top 3


def test_rerun_reuses_a_complete_folder_and_resumes_an_interrupted_one(synthetic_cycle, tmp_path):
    args = (str(synthetic_cycle), str(tmp_path / "planner"), TINY_MODEL, tiny_train(max_epochs=1))
    out = train_planner(*args)
    weights = out / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert train_planner(*args) == out and weights.stat().st_mtime_ns == stamp  # complete: reused
    quieter = tiny_train(max_epochs=1, log_every_n_steps=7)  # display knobs: still reused
    assert train_planner(args[0], args[1], TINY_MODEL, quieter) == out and weights.stat().st_mtime_ns == stamp
    # Interrupted after training but before the manifest: the rerun resumes from last.ckpt (no new epoch).
    (out / "manifest.json").unlink()
    train_planner(*args)
    assert (out / "manifest.json").is_file()
    versions = sorted((out / "logs").glob("version_*/metrics.csv"))
    assert "val/loss" in versions[0].read_text()  # the first run trained and validated ...
    assert not any("val/loss" in v.read_text() for v in versions[1:])  # ... the resumed one had nothing left
    # More epochs: continues from last.ckpt (the first epoch is not trained again).
    out2 = train_planner(str(synthetic_cycle), str(tmp_path / "planner"), TINY_MODEL, tiny_train(max_epochs=2))
    assert json.loads((out2 / "summary.json").read_text())["epochs"] == 2
    resumed = sorted((out / "logs").glob("version_*/metrics.csv"))[-1].read_text().splitlines()
    assert resumed[1:] and all(line.startswith("1,") for line in resumed[1:])  # only epoch 1 was logged
    # Another configuration (learning rate) retrains from scratch: stale checkpoints are not resumed.
    train_planner(str(synthetic_cycle), str(tmp_path / "planner"), TINY_MODEL, tiny_train(max_epochs=1, lr=5e-3))
    assert len(list((out / "logs").glob("version_*/metrics.csv"))) == 1


def test_a_corpus_prepared_again_into_the_same_folder_retrains_the_planner(tmp_path):
    prepared = tmp_path / "prepared"
    make_synthetic_prepared(prepared, rule="cycle", seed=0, num_articles={"train": 40, "validation": 8, "test": 8})
    out = train_planner(str(prepared), str(tmp_path / "planner"), TINY_MODEL, tiny_train(max_epochs=1))
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    codebook = PreparedDataset(prepared).codebook_hash
    shutil.rmtree(prepared)  # the same codebook (same seed), other articles
    make_synthetic_prepared(prepared, rule="cycle", seed=0, num_articles={"train": 60, "validation": 8, "test": 8})
    assert PreparedDataset(prepared).codebook_hash == codebook
    train_planner(str(prepared), str(tmp_path / "planner"), TINY_MODEL, tiny_train(max_epochs=1))
    assert (out / "model.safetensors").stat().st_mtime_ns != stamp


def test_bad_input_gives_one_line_errors(synthetic_cycle, tmp_path):
    with pytest.raises(PlanlmError, match="horizon") as error:
        train_planner(str(synthetic_cycle), str(tmp_path / "p"), PlannerSettings(horizon=50), tiny_train())
    assert "longest article" in str(error.value) and "\n" not in str(error.value)
    empty = make_synthetic_prepared(tmp_path / "empty", num_articles={"train": 0, "validation": 3, "test": 3})
    with pytest.raises(PlanlmError, match="no sentences"):
        train_planner(str(empty), str(tmp_path / "p"), TINY_MODEL, tiny_train())
    with pytest.raises(PlanlmError, match="not a complete prepared corpus"):
        train_planner(str(tmp_path / "nowhere"), str(tmp_path / "p"), TINY_MODEL, tiny_train())
    with pytest.raises(PlanlmError, match="batch_size"):
        PlannerTrainArgs(batch_size=0)
    assert not (tmp_path / "p" / "manifest.json").exists()


def test_cli_train_planner(synthetic_cycle, tmp_path, capsys):
    out = tmp_path / "cli"
    cli_main(["train-planner", "--prepared_dir", str(synthetic_cycle), "--out_dir", str(out),
              "--model.d_model", "16", "--model.num_heads", "2", "--model.dim_feedforward", "32",
              "--model.horizon", "2", "--train.max_epochs", "1", "--train.batch_size", "128"])
    assert (out / "manifest.json").is_file()
    assert Planner.from_pretrained(out).config.horizon == 2
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["train-planner", "--prepared_dir", str(synthetic_cycle), "--out_dir", str(tmp_path / "bad"),
                  "--model.horizon", "99"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("planlm: error:") and "horizon" in err[-1]


def test_length_grouped_sampler_is_a_shuffled_permutation_with_grouped_batches():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 15, size=1000)
    sampler = LengthGroupedSampler(lengths, batch_size=20, seed=0, group=10)
    order = list(sampler)
    assert sorted(order) == list(range(1000))
    sampler.set_epoch(1)
    assert list(sampler) != order  # reshuffled per epoch
    spread = np.mean([np.ptp(lengths[order[i:i + 20]]) for i in range(0, 1000, 20)])
    random_spread = np.mean([np.ptp(lengths[i:i + 20]) for i in range(0, 1000, 20)])
    assert spread < random_spread / 3


@pytest.mark.slow  # prepares a tiny real corpus with MiniLM and finetunes it inside h (~1 min)
def test_finetuned_encoder_planner_end_to_end(tmp_path):
    from planlm.data.corpus import CorpusConfig
    from planlm.data.kmeans import ActionsConfig
    from planlm.data.prepare import prepare

    prepared = prepare(str(tmp_path / "prepared"),
                       corpus=CorpusConfig(source="wiki-offline", num_train=12, num_validation=3, num_test=3),
                       actions=ActionsConfig(num_actions=4, backend="sklearn"))
    model = PlannerSettings(d_model=16, num_heads=2, dim_feedforward=32, horizon=2, finetune_encoder=True)
    out = train_planner(str(prepared), str(tmp_path / "planner"), model, tiny_train(max_epochs=1, batch_size=16))
    planner = Planner.from_pretrained(out)
    assert planner.representation.encoder is not None
    # The finetuned encoder was saved with the planner: its weights differ from the original MiniLM's.
    from planlm.data.resources import load_sentence_encoder

    original = load_sentence_encoder("all-MiniLM-L6-v2")
    changed = [not np.allclose(a.detach().numpy(), b.detach().numpy())
               for a, b in zip(planner.representation.encoder.parameters(), original.parameters())]
    assert any(changed)
    plans_dir = sample_plans(str(prepared), PlanConfig(planner_dir=str(out), num_paths=3), splits=["validation"])
    assert load_plans(plans_dir, "validation").shape[1:] == (3, 2)


def test_head_of_a_split_and_a_planner_fitted_on_its_first_articles(synthetic_cycle, tmp_path):
    split = PreparedDataset(synthetic_cycle)["train"]
    head = split.head(3)
    ends = int(split.sentence_offsets[3]), int(split.token_offsets[3])
    assert head.num_articles == 3 and head.num_sentences == ends[0] and head.num_tokens == ends[1]
    np.testing.assert_array_equal(head.embeddings, split.embeddings[:ends[0]])
    np.testing.assert_array_equal(head.token_plan_sentence, split.token_plan_sentence[:ends[1]])
    assert head.articles == split.articles[:3] and head.sentence_text(ends[0] - 1) == split.sentence_text(ends[0] - 1)
    with pytest.raises(PlanlmError, match=f"ask for 1 to {split.num_articles}"):
        split.head(split.num_articles + 1)
    # the collates reopen the split by path (DataLoader workers): they keep the head, not the whole split
    from planlm.train.boundaries import ArticleCollate, BoundaryCollate

    assert ArticleCollate(split.path, 4, 32, num_articles=3).split.num_articles == 3
    assert len(ArticleCollate(split.path, 4, 32, num_articles=3).rows) == 3  # short articles: one row each
    assert BoundaryCollate(split.path, 4, 32, num_articles=3).split.num_sentences == ends[0]
    out = train_planner(str(synthetic_cycle), str(tmp_path / "head"), TINY_MODEL,
                        tiny_train(max_epochs=1, max_train_articles=3))
    summary = json.loads((out / "summary.json").read_text())
    # the unigram baseline is fitted on the planner's training articles, the first 3 only: its step-1 NLL on
    # every validation boundary, by hand
    num_actions = PreparedDataset(synthetic_cycle).num_actions
    unigram = (np.bincount(split.actions[:ends[0]], minlength=num_actions) + 1) / (ends[0] + num_actions)
    validation = PreparedDataset(synthetic_cycle)["validation"].actions
    assert summary["metrics"]["unigram"]["nll"][0] == pytest.approx(-np.log(unigram[validation]).mean(), rel=1e-9)
    assert json.loads((out / "manifest.json").read_text())["config"]["train"]["max_train_articles"] == 3
    with pytest.raises(PlanlmError, match="max_train_articles=0 must be >= 1"):
        tiny_train(max_train_articles=0)
