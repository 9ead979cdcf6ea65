"""PlanConfig (resolution, validation, T given once, flat keys) and the plan sources every command reads plans through."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from planlm.data.artifacts import PreparedDataset
from planlm.errors import PlanlmError
from planlm.plans.config import PlanConfig, evaluation_plans, trained_plans, with_source_horizon
from planlm.plans.policy import PathPolicy
from planlm.plans.registry import plan_source
from planlm.plans.sampling import sample_plans
from planlm.plans.sources import CachedPlans, FixedPlans, OraclePlans, ShuffledPlans
from planlm.stage import write_manifest


def test_resolve_fills_defaults_then_inherits_from_the_base():
    plans = PlanConfig(kind="planner_sampled", planner_dir="p").resolve()
    assert (plans.kind, plans.num_paths, plans.horizon, plans.temperature, plans.seed) == \
        ("planner_sampled", 1, 1, 1.0, 0)
    assert plans.path_policy == PathPolicy().resolve(1)
    trained = PlanConfig(kind="planner_sampled", num_paths=5, horizon=4, temperature=2.0, seed=3, planner_dir="p",
                       plans_dir="cache").resolve()
    evaluated = PlanConfig(num_paths=20).resolve(trained)
    assert (evaluated.num_paths, evaluated.horizon, evaluated.temperature, evaluated.seed) == (20, 4, 2.0, 3)
    assert evaluated.planner_dir == "p" and evaluated.plans_dir is None  # a training cache is never inherited
    cached = PlanConfig(plans_dir="other").resolve(trained)
    assert cached.plans_dir == "other" and cached.planner_dir is None  # an explicit cache replaces the planner
    # an adaptive policy's most paths sets K when K is not given
    assert PlanConfig(path_policy=PathPolicy("entropy", max_paths=8)).resolve(trained).num_paths == 8


def test_resolve_normalises_each_kind():
    argmax = PlanConfig(kind="planner_argmax", temperature=2.0, planner_dir="p").resolve()
    assert argmax.temperature == 0.0
    fixed = PlanConfig(kind="fixed", planner_dir="p", plans_dir="c", path_policy=PathPolicy("entropy")).resolve()
    assert fixed.planner_dir is None and fixed.plans_dir is None and not fixed.path_policy.adaptive
    assert PlanConfig(kind="oracle").resolve().plan_kind.uses_planner is False


@pytest.mark.parametrize("plans,message", [
    (PlanConfig(num_paths=0), "--plans.num_paths"),
    (PlanConfig(horizon=0), "--plans.horizon"),
    (PlanConfig(temperature=-1.0), "--plans.temperature -1.0 must be >= 0"),
    (PlanConfig(num_paths=4, path_policy=PathPolicy("entropy", max_paths=8)), "max_paths 8 differs"),
])
def test_bad_values_are_one_line_errors(plans, message):
    with pytest.raises(PlanlmError, match=message):
        plans.resolve()


def test_kind_is_checked_against_the_registry_and_kept_as_text():
    assert PlanConfig(kind="oracle").kind == "oracle"
    with pytest.raises(PlanlmError, match="--plans.kind 'sampled': choose one of none, fixed, oracle"):
        PlanConfig(kind="sampled")
    key = PlanConfig(kind="oracle").resolve().cache_key()
    assert json.loads(json.dumps(key))["kind"] == "oracle" and "path_policy" not in key  # fixed: not in the key
    with pytest.raises(PlanlmError, match="needs --plans.plans_dir"):
        PlanConfig(kind="planner_sampled").resolve().check_source()


def test_sources_of_each_kind(synthetic_random, tmp_path):
    prepared = PreparedDataset(synthetic_random)
    split = prepared["validation"]
    last_of_first_article = split.sentence_range(0).stop - 1
    sentences = np.array([0, last_of_first_article])
    oracle = plan_source(PlanConfig(kind="oracle", num_paths=2, horizon=3).resolve(), prepared, split)
    assert isinstance(oracle, OraclePlans)
    paths, mask, _ = oracle(sentences)
    np.testing.assert_array_equal(paths[0, 1], split.actions[0:3])
    assert mask[0].all() and mask[1, :, 0].all() and not mask[1, :, 1:].any()  # cut at the article's end
    assert (paths[:, 0] == paths[:, 1]).all()  # repeated over K
    fixed = plan_source(PlanConfig(kind="fixed", num_paths=2, horizon=3).resolve(), prepared, split)
    paths, mask, _ = fixed(sentences)
    assert isinstance(fixed, FixedPlans) and (paths == 0).all() and mask.all()  # the Fixed baseline's action 0
    assert plan_source(PlanConfig().resolve(), prepared, split) is None
    shuffled = ShuffledPlans(oracle, np.arange(split.num_sentences)[::-1])
    torch.testing.assert_close(shuffled(sentences)[0], oracle(split.num_sentences - 1 - sentences)[0])


def write_cache(folder, prepared, split: str, plans: np.ndarray):
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / f"{split}.npy", plans)
    np.save(folder / f"{split}.argmax.npy", plans[:, 0])
    write_manifest(folder, {"test": str(folder)}, num_paths=plans.shape[1], horizon=plans.shape[2], temperature=1.0,
                   seed=0, planner_hash="feedbeef", planner_dir="/somewhere/planner",
                   codebook_hash=prepared.codebook_hash, num_actions=prepared.num_actions,
                   prepared_dir=str(prepared.path), splits=[split])
    return str(folder)


def test_cached_plans_are_checked_once_against_the_config(synthetic_random, tmp_path):
    prepared = PreparedDataset(synthetic_random)
    split = prepared["validation"]
    cached = np.random.default_rng(0).integers(0, prepared.num_actions, (split.num_sentences, 4, 3))
    cache = write_cache(tmp_path / "cache", prepared, "validation", cached)
    sentences = np.array([0, 3])
    sampled = plan_source(PlanConfig(kind="planner_sampled", num_paths=4, horizon=3, plans_dir=cache).resolve(),
                          prepared, split)
    paths, mask, _ = sampled(sentences)
    assert isinstance(sampled, CachedPlans) and mask.all()
    np.testing.assert_array_equal(paths, cached[sentences])
    argmax = plan_source(PlanConfig(kind="planner_argmax", num_paths=2, horizon=3, plans_dir=cache).resolve(),
                         prepared, split)
    paths, _, _ = argmax(sentences)
    assert paths.shape == (2, 2, 3) and (paths[:, 1] == torch.from_numpy(cached[sentences, 0])).all()
    for plans, message in [(PlanConfig(kind="planner_sampled", num_paths=2, horizon=3, plans_dir=cache), "cached K=4"),
                           (PlanConfig(kind="planner_sampled", num_paths=4, horizon=5, plans_dir=cache), "horizon T=3"),
                           (PlanConfig(kind="planner_sampled", num_paths=4, horizon=3, plans_dir=str(tmp_path)),
                            "no complete plan cache")]:
        with pytest.raises(PlanlmError, match=message):
            plan_source(plans.resolve(), prepared, split)
    short = write_cache(tmp_path / "short", prepared, "validation", cached[:-1])
    with pytest.raises(PlanlmError, match="rows"):
        plan_source(PlanConfig(kind="planner_sampled", num_paths=4, horizon=3, plans_dir=short).resolve(), prepared, split)


def test_a_live_planner_plans_only_the_boundaries_asked_for(synthetic_cycle, cycle_planner, tmp_path):
    prepared = PreparedDataset(synthetic_cycle)
    split = prepared["validation"]
    cycle_planner.save_pretrained(tmp_path / "planner")
    plans = PlanConfig(kind="planner_sampled", num_paths=3, horizon=2, planner_dir=str(tmp_path / "planner")).resolve()
    asked = np.array([1, 4, 7])
    source = plan_source(plans, prepared, split, sentences=asked)
    paths, mask, _ = source(asked)
    assert paths.shape == (3, 3, 2) and mask.all()
    assert len(source.plans) == len(asked)  # arrays of the asked rows only


def test_a_flat_plans_key_in_a_run_config_and_on_the_command_line_is_one_line_naming_the_plans_key(tmp_path,
                                                                                                    capsys):
    from planlm.cli import main
    from planlm.pipeline.run import plan_stages

    from helpers import tiny_run_config

    config = tiny_run_config(tmp_path / "run")
    config["conditions"] = [{"name": "old", "conditioning": {"conditioning": "oracle"}}]
    sections = {k: config.get(k) for k in ("prepare", "planner", "lm", "base_lm", "conditions", "evaluate",
                                           "edit_distance", "sweeps")}
    with pytest.raises(PlanlmError, match=r"conditions\[old\] has unknown key\(s\) \['conditioning'\]"):
        plan_stages(tmp_path / "run", **sections, where="run.yaml")
    config["conditions"] = [{"name": "ok", "plans": {"kind": "oracle"}}]
    config["sweeps"] = [{"condition": "ok", "kind": "temperature", "horizon": 3}]
    with pytest.raises(PlanlmError, match=r"sweeps\[0\]: unknown key\(s\) \['horizon'\] \(horizon is "
                                          r"plans.horizon\)"):
        plan_stages(tmp_path / "run", **{**sections, "conditions": config["conditions"], "sweeps": config["sweeps"]},
                    where="run.yaml")
    for argv, new in [(["evaluate", "--model_dir", "m", "--prepared_dir", "p", "--out_dir", "o", "--num_paths", "5"],
                       "--num_paths is --plans.num_paths"),
                      (["generate", "--model_dir", "m", "--prepared_dir", "p", "--temperature", "2"],
                       "--temperature is --sampling.temperature; --temperature is --plans.temperature")]:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and new in err and "\n" not in err


def test_t_is_given_once_by_the_planner_and_a_longer_t_is_refused(synthetic_cycle, cycle_planner, tmp_path):
    """Plans of a planner kind without a horizon take the one the planner was trained with (a plan cache's own when
    they read one); asking a planner trained with T=3 for longer paths is a one-line error naming both values and
    the fix, in training, sampling and evaluation; an evaluation beyond its adapter's horizon too."""
    folder = str(cycle_planner.save_pretrained(tmp_path / "planner"))
    assert with_source_horizon(PlanConfig(kind="planner_sampled", planner_dir=folder)).resolve().horizon == 3
    assert with_source_horizon(PlanConfig(kind="planner_argmax", horizon=2, planner_dir=folder)).horizon == 2
    assert with_source_horizon(PlanConfig(kind="oracle")).resolve().horizon == 1  # no planner: the default T
    longer = re.escape(f"--plans.horizon 5 exceeds the horizon T=3 the planner {folder} was trained with; leave "
                       f"--plans.horizon unset (T=3) or train the planner with --model.horizon 5")
    with pytest.raises(PlanlmError, match=longer) as error:
        with_source_horizon(PlanConfig(kind="planner_sampled", horizon=5, planner_dir=folder))
    assert "\n" not in str(error.value)
    with pytest.raises(PlanlmError, match=longer):
        sample_plans(str(synthetic_cycle), PlanConfig(horizon=5, planner_dir=folder), splits=["validation"])
    trained = PlanConfig(kind="planner_sampled", num_paths=2, horizon=3).resolve()
    model = SimpleNamespace(config=SimpleNamespace(plans=trained, num_actions=8), plan_folders={"planner_dir": folder},
                            adapter=SimpleNamespace(config=SimpleNamespace(horizon=5)))
    assert evaluation_plans(PlanConfig(num_paths=4), model, "model").horizon == 3  # the model's T
    with pytest.raises(PlanlmError, match=longer):
        evaluation_plans(PlanConfig(horizon=5), model, "model")
    with pytest.raises(PlanlmError, match=r"--plans.horizon 6 exceeds the horizon the adapter of model accepts \(5\); "
                                          r"choose --plans.horizon <= 5"):
        evaluation_plans(PlanConfig(horizon=6), model, "model")
    prepared = PreparedDataset(synthetic_cycle)
    plans = np.zeros((prepared["validation"].num_sentences, 4, 2), dtype=np.int64)
    cache = write_cache(tmp_path / "cache", prepared, "validation", plans)
    assert with_source_horizon(PlanConfig(kind="planner_sampled", plans_dir=cache)).horizon == 2  # the cache's T


def test_a_run_condition_plans_its_planners_t_unless_it_sets_a_shorter_one(tmp_path):
    """`planlm run`: T is the planner's model.horizon; a condition reading the run's planner plans that T (its
    adapter built for it) unless it sets a shorter plans.horizon; a longer one stops the run before anything runs."""
    from planlm.pipeline.run import plan_stages

    from helpers import tiny_run_config

    config = tiny_run_config(tmp_path / "run")
    config["conditions"][3]["plans"].pop("horizon")  # ours: T unset
    sections = {k: config.get(k) for k in ("prepare", "planner", "lm", "base_lm", "conditions", "evaluate",
                                           "edit_distance", "sweeps")}
    stages = {stage.name: stage for stage in plan_stages(tmp_path / "run", **sections, where="run.yaml")}
    assert stages["train-lm ours"].kwargs["plans"].horizon == 3  # the planner's
    assert stages["train-lm cornille"].kwargs["plans"].horizon == 1  # its own, shorter
    assert stages["train-lm oracle"].kwargs["plans"].horizon is None  # no planner: the default
    config["conditions"][3]["plans"]["horizon"] = 4
    with pytest.raises(PlanlmError, match=re.escape("run.yaml: conditions[ours]: plans.horizon 4 exceeds the horizon "
                                                    "T=3 its planner (train-planner) is trained with; leave "
                                                    "plans.horizon unset (T=3) or set the planner's model.horizon to "
                                                    "4")):
        plan_stages(tmp_path / "run", **sections, where="run.yaml")
