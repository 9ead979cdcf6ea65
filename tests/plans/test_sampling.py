"""Boundary contexts, plan sampling over a split, the plan cache and its checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from planlm.args import Runtime
from planlm.cli import main as cli_main
from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.models.planner import Planner
from planlm.plans.cache import load_plans
from planlm.plans.config import PlanConfig
from planlm.plans.contexts import IGNORE_INDEX, boundary_contexts, boundary_targets
from planlm.plans.draws import draw_plans
from planlm.plans.sampling import sample_plans
from planlm.testing.synthetic import make_synthetic_prepared

from helpers import greedy_path, linear_output_dtypes, tiny_planner


def sampled(num_paths: int, horizon: int, temperature: float = 1.0, seed: int = 0) -> PlanConfig:
    return PlanConfig(kind="planner_sampled", num_paths=num_paths, horizon=horizon, temperature=temperature,
                      seed=seed).resolve()


def cache(planner_dir, prepared_dir, splits, batch_size: int = 256, **plans):
    """`sample-plans` with the plans group (planner_dir and the given fields)."""
    return sample_plans(str(prepared_dir), PlanConfig(planner_dir=str(planner_dir), **plans), splits=splits,
                        batch_size=batch_size)


def save_planner(folder, prepared_dir, seed: int = 0, **overrides):
    return tiny_planner(PreparedDataset(prepared_dir), seed=seed, max_sentences=4, **overrides).save_pretrained(folder)


@pytest.fixture(scope="module")
def planner_dir(synthetic_cycle, tmp_path_factory):
    return save_planner(tmp_path_factory.mktemp("planner") / "planner", synthetic_cycle)


def test_boundary_contexts_are_the_true_sentences_before_each_boundary(synthetic_cycle):
    split = PreparedDataset(synthetic_cycle)["validation"]
    first, second = split.sentence_range(0), split.sentence_range(1)
    boundaries = np.array([first[0], first[3], second[0], second[6] if len(second) > 6 else second[-1]])
    embeds, mask = boundary_contexts(split, boundaries, max_sentences=4)
    assert mask.sum(1).tolist() == [0, 3, 0, min(4, len(second) - 1 if len(second) <= 6 else 4)]
    np.testing.assert_array_equal(embeds[1, :3].numpy(), split.embeddings[first[0]:first[3]])
    assert (embeds[~mask] == 0).all()
    last = boundaries[3]
    np.testing.assert_array_equal(embeds[3, :int(mask[3].sum())].numpy(),
                                  split.embeddings[max(second[0], last - 4):last])  # the last 4 only
    empty_embeds, empty_mask = boundary_contexts(split, np.array([first[0], second[0]]), max_sentences=4)
    assert empty_embeds.shape == (2, 0, split.embeddings.shape[1]) and empty_mask.shape == (2, 0)


def test_boundary_targets_mask_steps_past_the_article_end(synthetic_cycle):
    split = PreparedDataset(synthetic_cycle)["validation"]
    article = split.sentence_range(2)
    last = article[-1]
    targets = boundary_targets(split, np.array([article[0], last]), horizon=3)
    np.testing.assert_array_equal(targets[0].numpy(), split.actions[article[0]:article[0] + 3])
    assert targets[1].tolist() == [int(split.actions[last]), IGNORE_INDEX, IGNORE_INDEX]


def test_planner_draws_are_reproducible_and_seeded(planner_dir, synthetic_cycle):
    planner = Planner.from_pretrained(planner_dir)
    split = PreparedDataset(synthetic_cycle)["validation"]
    plans = draw_plans(planner, split, sampled(5, 3), batch_size=32).paths
    assert plans.shape == (split.num_sentences, 5, 3) and plans.dtype == np.int64
    assert plans.min() >= 0 and plans.max() < 8
    np.testing.assert_array_equal(plans, draw_plans(planner, split, sampled(5, 3), batch_size=32).paths)
    assert not np.array_equal(plans, draw_plans(planner, split, sampled(5, 3, seed=1), batch_size=32).paths)
    subset = np.array([3, 10, 11])
    greedy = draw_plans(planner, split, sampled(2, 3, temperature=0.0), subset).paths
    embeds, mask = boundary_contexts(split, subset, planner.config.max_sentences)
    expected = greedy_path(planner, embeds, mask, 3).numpy()
    np.testing.assert_array_equal(greedy, np.repeat(expected[:, None], 2, axis=1))


@pytest.mark.parametrize("dynamics", ["recurrent", "causal"])
def test_bf16_plans_are_valid_and_keyed_apart(synthetic_cycle, tmp_path, dynamics, bf16_allowed):
    folder = save_planner(tmp_path / "planner", synthetic_cycle, dynamics=dynamics)
    planner = Planner.from_pretrained(folder)
    split = PreparedDataset(synthetic_cycle)["validation"]
    plans = draw_plans(planner, split, sampled(4, 3), precision="bf16").paths
    assert plans.shape == (split.num_sentences, 4, 3) and 0 <= plans.min() and plans.max() < 8
    # bf16 is close to fp32: the greedy paths agree for most boundaries (exact ties aside)
    greedy = {precision: draw_plans(planner, split, sampled(1, 3, temperature=0.0), precision=precision).paths
              for precision in ("fp32", "bf16")}
    assert np.mean(greedy["fp32"] == greedy["bf16"]) > 0.8
    cached = {precision: sample_plans(str(synthetic_cycle), PlanConfig(planner_dir=str(folder), num_paths=4, horizon=3),
                                      splits=["validation"],
                                      runtime=Runtime(precision=precision), out_dir=str(tmp_path / precision))
              for precision in ("fp32", "bf16")}
    manifests = {k: json.loads((v / "manifest.json").read_text()) for k, v in cached.items()}
    assert manifests["fp32"]["config_fingerprint"] != manifests["bf16"]["config_fingerprint"]
    np.testing.assert_array_equal(load_plans(cached["bf16"], "validation"), plans)


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32),
                                              ("auto", torch.float32)])  # auto: fp32 on CPU
def test_plan_sampling_runs_the_planner_at_the_precision_asked_for(planner_dir, synthetic_cycle, tmp_path, precision,
                                                                  dtype, bf16_allowed):
    with linear_output_dtypes() as seen:
        sample_plans(str(synthetic_cycle), PlanConfig(planner_dir=str(planner_dir), num_paths=2, horizon=3),
                     splits=["validation"],
                     runtime=Runtime(device="cpu", precision=precision), out_dir=str(tmp_path / "plans"))
    planner_layers = {type(m).__module__ for m in seen}
    assert seen and planner_layers <= {"torch.nn.modules.linear"}
    assert set().union(*seen.values()) == {dtype}  # every layer of the planner, sampled and argmax paths


def test_sample_plans_writes_reuses_and_rekeys_the_cache(planner_dir, synthetic_cycle):
    out = cache(planner_dir, synthetic_cycle, ["validation", "test"], num_paths=4, horizon=3, temperature=1.0, seed=0,
                batch_size=16)
    assert out == planner_dir / "plans" / "K4-T3-tau1-seed0"
    manifest = json.loads((out / "manifest.json").read_text())
    for key in ("num_paths", "horizon", "temperature", "seed", "planner_hash", "codebook_hash", "num_actions",
                "prepared_dir"):
        assert key in manifest
    prepared = PreparedDataset(synthetic_cycle)
    plans = load_plans(out, "validation", prepared=prepared)
    greedy = load_plans(out, "validation", prepared=prepared, argmax=True)
    assert isinstance(plans, np.memmap)
    assert plans.shape == (prepared["validation"].num_sentences, 4, 3) and greedy.shape == (len(plans), 3)
    expected = draw_plans(Planner.from_pretrained(planner_dir), prepared["validation"], sampled(4, 3),
                          batch_size=16).paths
    np.testing.assert_array_equal(plans, expected)
    # Same key: reused (files untouched). Another seed: another folder with other samples.
    stamp = (out / "validation.npy").stat().st_mtime_ns
    assert cache(planner_dir, synthetic_cycle, ["validation", "test"], num_paths=4, horizon=3, seed=0,
                 batch_size=16) == out
    assert (out / "validation.npy").stat().st_mtime_ns == stamp
    other = cache(planner_dir, synthetic_cycle, ["validation"], num_paths=4, horizon=3, seed=1, batch_size=16)
    assert other != out and not np.array_equal(load_plans(other, "validation"), plans)
    # Same folder, changed key (K): recomputed in place.
    fixed_dir = planner_dir / "plans" / "fixed"
    sample_plans(str(synthetic_cycle), PlanConfig(planner_dir=str(planner_dir), num_paths=2), splits=["validation"],
                 out_dir=str(fixed_dir))
    assert load_plans(fixed_dir, "validation").shape[1:] == (2, 3)
    sample_plans(str(synthetic_cycle), PlanConfig(planner_dir=str(planner_dir), num_paths=3), splits=["validation"],
                 out_dir=str(fixed_dir))
    assert load_plans(fixed_dir, "validation").shape[1:] == (3, 3)


def test_mismatched_planner_or_plans_give_one_line_errors(planner_dir, synthetic_cycle, synthetic_random,
                                                          tmp_path):
    with pytest.raises(PlanlmError, match="codebook") as error:
        cache(planner_dir, synthetic_random, ["validation"], num_paths=1)
    assert "\n" not in str(error.value)
    other_actions = make_synthetic_prepared(tmp_path / "six", num_actions=6, num_articles={"train": 10,
                                            "validation": 3, "test": 3})
    with pytest.raises(PlanlmError, match="num_actions"):
        cache(planner_dir, other_actions, ["validation"], num_paths=1)
    out = cache(planner_dir, synthetic_cycle, ["validation"], num_paths=1, horizon=2)
    with pytest.raises(PlanlmError, match="codebook"):
        load_plans(out, "validation", prepared=PreparedDataset(synthetic_random))
    with pytest.raises(PlanlmError, match="no plans for split 'test'"):
        load_plans(out, "test")
    with pytest.raises(PlanlmError, match="no complete plan cache"):
        load_plans(tmp_path / "nothing", "validation")


def test_empty_split_and_bad_arguments(planner_dir, tmp_path):
    prepared = make_synthetic_prepared(tmp_path / "no_test", num_articles={"train": 10, "validation": 3, "test": 0})
    planner = save_planner(tmp_path / "planner", prepared)
    with pytest.raises(PlanlmError, match="no sentences"):
        cache(planner, prepared, ["test"], num_paths=2)
    with pytest.raises(PlanlmError, match="--plans.num_paths"):
        cache(planner, prepared, ["validation"], num_paths=0)
    assert not (planner / "plans").exists()  # nothing half-written


def test_cli_sample_plans(planner_dir, synthetic_cycle, tmp_path, capsys):
    out = tmp_path / "cli_plans"
    cli_main(["sample-plans", "--plans.planner_dir", str(planner_dir), "--prepared_dir", str(synthetic_cycle),
              "--splits", "[validation]", "--plans.num_paths", "3", "--plans.horizon", "2", "--plans.temperature", "0.5",
              "--out_dir", str(out)])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_paths"] == 3 and manifest["temperature"] == 0.5
    assert load_plans(out, "validation").shape[1:] == (3, 2)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["sample-plans", "--plans.planner_dir", str(tmp_path / "missing"), "--prepared_dir",
                  str(synthetic_cycle)])
    assert exit_info.value.code == 2
    assert "no trained planner" in capsys.readouterr().err


# killed within the first split's walk, with every step's distribution stored; within the second's, the first split
# done, with path counts that vary; within the first, and a file of the walk lost since: that walk starts again
@pytest.mark.parametrize("where, case", [("first", {"expectation": True}), ("second", {"policy": "entropy"}),
                                         ("lost", {})])
def test_an_interrupted_walk_resumes_after_its_last_record_to_the_uninterrupted_cache(
        planner_dir, synthetic_cycle, tmp_path, monkeypatch, where, case):
    import planlm.plans.sampling as sampling
    from planlm.plans.draws import DrawArrays
    from planlm.plans.policy import PathPolicy

    plans = PlanConfig(planner_dir=str(planner_dir), num_paths=4, horizon=3, expectation=case.get("expectation", False),
                       path_policy=PathPolicy(case.get("policy", "all"), 1))
    writes = []
    write = DrawArrays.write

    def counted(self, rows, draw):
        if len(writes) + 1 == stop_at:
            raise KeyboardInterrupt  # a batch's greedy paths written, its sampled ones not: nothing recorded
        writes.append(len(rows))
        write(self, rows, draw)

    monkeypatch.setattr(DrawArrays, "write", counted)
    monkeypatch.setattr(sampling, "CHECKPOINT_EVERY_S", 0.0)  # a record after every batch
    stop_at = None
    run = lambda out: sample_plans(str(synthetic_cycle), plans, splits=["validation", "test"], out_dir=str(out),
                                   batch_size=8, runtime=Runtime(device="cpu"))
    whole = run(tmp_path / "whole")
    total, first_split = len(writes), 2 * -(-PreparedDataset(synthetic_cycle)["validation"].num_sentences // 8)
    kill_at = first_split + 9 if where == "second" else 3  # the call that raises: a greedy write of the split
    assert first_split < kill_at < total if where == "second" else kill_at < first_split

    writes.clear()
    stop_at = kill_at
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut")
    assert not (tmp_path / "cut" / "manifest.json").exists() and (tmp_path / "cut" / "validation.walk.npz").is_file()
    if where == "lost":
        (tmp_path / "cut" / "validation.argmax.npy").unlink()
    writes.clear()
    stop_at = None
    resumed = run(tmp_path / "cut")
    redrawn = total if where == "lost" else total - 2 * ((kill_at - 1) // 2)
    assert len(writes) == redrawn  # only the batches after the last record are drawn again

    files = sorted(p.name for p in whole.iterdir())
    assert files == sorted(p.name for p in resumed.iterdir()) and not any("walk" in name for name in files)
    for name in files:
        if name != "manifest.json":
            assert (whole / name).read_bytes() == (resumed / name).read_bytes(), name
    manifests = [json.loads((folder / "manifest.json").read_text()) for folder in (whole, resumed)]
    assert manifests[0]["files"] == manifests[1]["files"] and manifests[0]["paths"] == manifests[1]["paths"]


def test_a_walk_record_of_another_key_is_not_resumed(planner_dir, synthetic_cycle, tmp_path):
    out = tmp_path / "plans"
    first = sample_plans(str(synthetic_cycle), PlanConfig(planner_dir=str(planner_dir), num_paths=2, seed=0),
                         splits=["validation"], out_dir=str(out), batch_size=8)
    stale = np.load(first / "validation.npy")
    (first / "manifest.json").unlink()  # as if the build had stopped; its files and a record of another key remain
    np.savez(out / "validation.walk.npz", key=np.array("another key"), batches=np.int64(3), rows=np.int64(24),
             rng=torch.Generator().get_state().numpy(), counts0=np.ones(len(stale)), counts1=np.ones(len(stale)))
    again = sample_plans(str(synthetic_cycle), PlanConfig(planner_dir=str(planner_dir), num_paths=2, seed=1),
                         splits=["validation"], out_dir=str(out), batch_size=8)
    fresh = sample_plans(str(synthetic_cycle), PlanConfig(planner_dir=str(planner_dir), num_paths=2, seed=1),
                         splits=["validation"], out_dir=str(tmp_path / "fresh"), batch_size=8)
    assert (again / "validation.npy").read_bytes() == (fresh / "validation.npy").read_bytes()
    assert not (again / "validation.walk.npz").exists()
