"""Overlay configs (``overlay_of: BASE``): meant as a later ``--config`` on top of BASE, they say so in their first
line, and given alone they are a one-line error naming BASE; after another config they are read as before, without
the key."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from planlm.cli import OVERLAY_KEY, main

from helpers import tiny_run_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
OVERLAYS = [path for path in CONFIGS if OVERLAY_KEY in yaml.safe_load(path.read_text())]


def test_every_shipped_config_is_a_whole_run_or_an_overlay_that_says_so_in_its_first_line():
    assert {path.name for path in OVERLAYS} >= {"demo-bigplanner.yaml", "demo-joint.yaml", "evidence-bigplanner.yaml",
                                                "pretrained-offline-bigplanner.yaml"}
    for path in CONFIGS:
        config = yaml.safe_load(path.read_text())
        if path not in OVERLAYS:
            assert config.get("conditions"), f"{path.name}: no conditions, so not a run of its own: an overlay?"
            continue
        base = config[OVERLAY_KEY]
        assert path.read_text().startswith(f"# Overlay on {base}, given after it"), path.name
        assert (ROOT / base).is_file() and OVERLAY_KEY not in yaml.safe_load((ROOT / base).read_text()), path.name


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda path: path.name)
def test_an_overlay_given_alone_is_a_one_line_error_naming_its_base(overlay, capsys):
    base = yaml.safe_load(overlay.read_text())[OVERLAY_KEY]
    with pytest.raises(SystemExit) as exited:
        main(["run", "--config", str(overlay)])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"planlm: error: {overlay} is an overlay on {base}, not a config of its own; give it after that "
                   f"one: planlm run --config {base} --config {overlay}")


def test_an_overlay_after_its_base_is_read_without_its_key(tmp_path, capsys):
    base, overlay = tmp_path / "base.yaml", tmp_path / "overlay.yaml"
    base.write_text(yaml.safe_dump(tiny_run_config(tmp_path / "run")))
    overlay.write_text(f"# Overlay on {base}, given after it\n{OVERLAY_KEY}: {base}\nout_dir: {tmp_path / 'other'}\n")
    for config_flags in (["--config", str(base), "--config", str(overlay)],
                         [f"--config={base}", f"--config={overlay}"]):
        with pytest.raises(SystemExit) as printed:  # --print_config prints the merged config and exits
            main(["run", *config_flags, "--print_config"])
        out = capsys.readouterr().out
        assert printed.value.code in (0, None)
        merged = yaml.safe_load(out)
        assert OVERLAY_KEY not in merged and merged["out_dir"] == str(tmp_path / "other")
        assert merged["conditions"] == tiny_run_config(tmp_path)["conditions"]


def test_an_overlay_key_that_is_not_one_path_is_a_one_line_error(tmp_path, capsys):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(f"{OVERLAY_KEY}:\n  - a.yaml\n  - b.yaml\nout_dir: x\n")
    with pytest.raises(SystemExit):
        main(["run", "--config", str(overlay)])
    assert capsys.readouterr().err.strip() == (f"planlm: error: {overlay}: write {OVERLAY_KEY} as one top-level "
                                               f"line, '{OVERLAY_KEY}: PATH' with the path of the config this file "
                                               f"goes on (got ['a.yaml', 'b.yaml'])")


def print_config(capsys, *args) -> dict:
    """The config `planlm run ARGS --print_config` prints: the merged result of every --config and flag."""
    with pytest.raises(SystemExit) as printed:
        main(["run", *map(str, args), "--print_config"])
    assert printed.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def write(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_an_overlay_that_sets_one_nested_key_changes_only_that_key(tmp_path, capsys):
    base = write(tmp_path / "base.yaml", tiny_run_config(tmp_path / "run"))
    overlay = write(tmp_path / "mine.yaml", {"lm": {"train": {"lr": 3e-4}}, "prepare": {"corpus": {"num_test": 4}}})
    before, after = print_config(capsys, "--config", base), print_config(capsys, "--config", base, "--config", overlay)
    assert after["lm"]["train"].pop("lr") == 3e-4 and before["lm"]["train"].pop("lr") == 0.003
    assert after["prepare"]["corpus"].pop("num_test") == 4 and before["prepare"]["corpus"].pop("num_test") == 6
    assert after == before  # the LM's model, its other train keys, the corpus source ... as the base has them


def test_a_dotted_flag_changes_one_key_and_a_later_one_wins(tmp_path, capsys):
    base = write(tmp_path / "base.yaml", tiny_run_config(tmp_path / "run"))
    before = print_config(capsys, "--config", base)
    after = print_config(capsys, "--config", base, "--lm.train.lr", "3e-4", "--conditions.ours.plans.num_paths", "5",
                         "--evaluate.stride=16", "--evaluate.stride", "24", "--out_dir", "runs/123")
    assert after["lm"]["train"].pop("lr") == 3e-4  # YAML 1.2's float, as jsonargparse reads a typed flag
    ours = next(c for c in after["conditions"] if c["name"] == "ours")
    assert ours["plans"].pop("num_paths") == 5 and ours["plans"] == {"kind": "planner_sampled", "horizon": 3}
    assert after["evaluate"].pop("stride") == 24 and after.pop("out_dir") == "runs/123"  # a str flag stays text
    before["lm"]["train"].pop("lr"), before["evaluate"].pop("stride"), before.pop("out_dir")
    next(c for c in before["conditions"] if c["name"] == "ours")["plans"].pop("num_paths")
    assert after == before
    flags_first = print_config(capsys, "--lm.train.lr", "0.5", "--config", base)  # left to right: the file wins
    assert flags_first["lm"]["train"]["lr"] == 0.003


def test_an_overlay_that_adds_a_condition_keeps_the_others_and_one_that_names_a_condition_changes_it(tmp_path,
                                                                                                     capsys):
    base = write(tmp_path / "base.yaml", tiny_run_config(tmp_path / "run"))
    overlay = write(tmp_path / "mine.yaml", {"conditions": [
        {"name": "ours_k5", "plans": {"kind": "planner_sampled", "num_paths": 5}, "adapter": {"kind": "multipath"}},
        {"name": "fixed", "label": "Fixed baseline"}]})
    conditions = tiny_run_config(tmp_path)["conditions"]
    after = print_config(capsys, "--config", base, "--config", overlay)["conditions"]
    assert [c["name"] for c in after] == ["none", "fixed", "cornille", "ours", "oracle", "ours_k5"]
    assert after[1] == {**conditions[1], "label": "Fixed baseline"}  # changed in its place, key by key
    assert after[:1] + after[2:5] == conditions[:1] + conditions[2:]
    assert after[5] == {"name": "ours_k5", "plans": {"kind": "planner_sampled", "num_paths": 5},
                        "adapter": {"kind": "multipath"}}


def test_unset_removes_a_condition_or_a_key_and_an_own_list_keeps_its_order(tmp_path, capsys):
    base = write(tmp_path / "base.yaml", tiny_run_config(tmp_path / "run"))
    overlay = write(tmp_path / "mine.yaml", {"unset": ["conditions.cornille", "conditions.fixed.paper",
                                                       "prepare.actions"]})
    after = print_config(capsys, "--config", base, "--config", overlay)
    assert [c["name"] for c in after["conditions"]] == ["none", "fixed", "ours", "oracle"]
    assert after["conditions"][1] == {"name": "fixed", "plans": {"kind": "fixed"}}
    assert "actions" not in after["prepare"] and after["prepare"]["tokenizer"] == "gpt2"
    own = write(tmp_path / "own.yaml", {"unset": ["conditions"], "conditions": [{"name": "oracle"}, {"name": "none"}]})
    assert print_config(capsys, "--config", base, "--config", own)["conditions"] == [{"name": "oracle"},
                                                                                      {"name": "none"}]
    flag = print_config(capsys, "--config", base, "--unset", "conditions.ours")
    assert [c["name"] for c in flag["conditions"]] == ["none", "fixed", "cornille", "oracle"]


@pytest.mark.parametrize("args, message", [
    (["--unset", "conditions.ourz"], "planlm run --unset: unset conditions.ourz: there is no conditions.ourz to "
                                     "remove; name a key that the configs before it set"),
    (["--conditions.ours", "7"], "--conditions.ours 7: a condition is a mapping; set one of its keys "
                                 "(--conditions.ours.plans.num_paths 10) or give a mapping ('{plans: {kind: fixed}}')"),
])
def test_a_bad_overlay_is_one_line(tmp_path, capsys, args, message):
    base = write(tmp_path / "base.yaml", tiny_run_config(tmp_path / "run"))
    with pytest.raises(SystemExit) as exited:
        main(["run", "--config", str(base), *args, "--dry_run", "true"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip() == f"planlm: error: {message}"


def flat(node, prefix: str = "") -> dict:
    """Every leaf key of a config, dotted; conditions by name (``conditions.ours.plans.kind``)."""
    if prefix == "conditions." and isinstance(node, list):
        node = {condition["name"]: condition for condition in node}
    if not isinstance(node, dict) or not node:
        return {prefix[:-1]: node}
    return {key: value for name, child in node.items() for key, value in flat(child, f"{prefix}{name}.").items()}


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda path: path.name)
def test_a_shipped_overlay_changes_only_the_keys_it_names(overlay, capsys):
    """The merged config equals its base's for every key that the overlay does not name (set or unset)."""
    config = yaml.safe_load(overlay.read_text())
    base = ROOT / config.pop(OVERLAY_KEY)
    named = set(flat(config)) | set(config.pop("unset", []))
    before, after = flat(print_config(capsys, "--config", base)), flat(print_config(capsys, "--config", base,
                                                                                     "--config", overlay))
    untouched = {key for key in before.keys() | after.keys()
                 if not any(key == name or key.startswith(name + ".") for name in named)}
    assert untouched and {key: after.get(key) for key in untouched} == {key: before.get(key) for key in untouched}
    assert {key: after[key] for key in flat(config)} == flat(config)  # and each key it names as it names it


def test_no_config_header_is_over_six_lines_and_each_names_its_command():
    for path in CONFIGS:
        lines = path.read_text().splitlines()
        header = list(itertools.takewhile(lambda line: line.startswith("#"), lines))
        assert 1 <= len(header) <= 6, f"{path.name}: a header of {len(header)} lines"
        assert any(f"--config configs/{path.name}" in line for line in header), path.name
