"""A YAML section checked against a command's signature before anything runs."""

from __future__ import annotations

import pytest

from planlm.errors import PlanlmError
from planlm.pipeline.sections import bind_section, deep_merge, dotted_overlay, merge_config
from planlm.plans.config import PlanConfig
from planlm.train.lm import LMTrainConfig, train_lm


def test_deep_merge_overrides_key_by_key_and_leaves_its_inputs():
    base = {"plans": {"kind": "oracle", "num_paths": 2}, "train": {"lr": 1.0}}
    merged = deep_merge(base, {"plans": {"num_paths": 5}, "model": {"name_or_path": "gpt2"}})
    assert merged == {"plans": {"kind": "oracle", "num_paths": 5}, "train": {"lr": 1.0},
                      "model": {"name_or_path": "gpt2"}}
    assert base["plans"]["num_paths"] == 2


def test_bind_section_instantiates_the_dataclasses_of_a_command():
    kwargs = bind_section(train_lm, {"plans": {"kind": "oracle", "num_paths": 2}, "train": {"lr": 0.5}},
                          skip={"prepared_dir", "out_dir"}, where="run.yaml: lm")
    assert isinstance(kwargs["plans"], PlanConfig) and kwargs["plans"].kind == "oracle"
    assert isinstance(kwargs["train"], LMTrainConfig) and kwargs["train"].lr == 0.5


@pytest.mark.parametrize("section,message", [
    ({"plans": {"kind": "sometimes"}}, "run.yaml: lm: .*sometimes"),
    ({"train": {"batch_size": 0}}, "run.yaml: lm: .*batch_size must be >= 1"),
    ({"trian": {}}, "run.yaml: lm: .*trian"),
    ({"num_paths": 2}, r"run.yaml: lm: unknown key\(s\) \['num_paths'\] \(num_paths is plans.num_paths\)"),
    ({"adapter": {"horizon": 3}}, r"run.yaml: lm: .*horizon"),  # the adapter's T is the plans' alone
])
def test_bad_sections_are_one_line_errors_naming_the_section(section, message):
    with pytest.raises(PlanlmError, match=message) as error:
        bind_section(train_lm, section, skip={"prepared_dir", "out_dir"}, where="run.yaml: lm")
    assert "\n" not in str(error.value)


def test_merge_config_merges_sections_key_by_key_conditions_by_name_and_replaces_other_lists():
    base = {"lm": {"train": {"lr": 1.0, "batch_size": 8}}, "seeds": [0, 1],
            "conditions": [{"name": "none", "plans": {"kind": "none"}},
                           {"name": "ours", "plans": {"kind": "planner_sampled", "num_paths": 5}}]}
    overlay = {"lm": {"train": {"lr": 0.5}}, "seeds": [2],
               "conditions": [{"name": "ours", "plans": {"num_paths": 10}}, {"name": "fixed"}]}
    assert merge_config(base, overlay, "mine.yaml") == {
        "lm": {"train": {"lr": 0.5, "batch_size": 8}}, "seeds": [2],
        "conditions": [{"name": "none", "plans": {"kind": "none"}},
                       {"name": "ours", "plans": {"kind": "planner_sampled", "num_paths": 10}}, {"name": "fixed"}]}
    assert base["lm"]["train"]["lr"] == 1.0 and len(base["conditions"]) == 2  # its inputs are left as they were


def test_unset_and_a_flags_overlay_name_conditions_by_name():
    base = {"conditions": [{"name": "none"}, {"name": "ours", "paper": "Ours", "plans": {"kind": "fixed"}}]}
    assert merge_config(base, {"unset": ["conditions.ours.paper", "conditions.none"]}, "x") == {
        "conditions": [{"name": "ours", "plans": {"kind": "fixed"}}]}
    assert dotted_overlay("conditions.ours.plans.num_paths", 3) == {
        "conditions": [{"name": "ours", "plans": {"num_paths": 3}}]}
    assert dotted_overlay("lm.train.lr", 0.1) == {"lm": {"train": {"lr": 0.1}}}
    with pytest.raises(PlanlmError, match=r"^x: unset lm.train: there is no lm to remove; name a key"):
        merge_config(base, {"unset": "lm.train"}, "x")
    with pytest.raises(PlanlmError, match=r"^x: conditions: every entry needs a name"):
        merge_config(base, {"conditions": [{"label": "no name"}]}, "x")
