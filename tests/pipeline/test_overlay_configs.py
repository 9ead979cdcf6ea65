"""Overlay configs (``overlay_of: BASE``): meant as a later ``--config`` on top of BASE, they say so in their first
line, and given alone they are a one-line error naming BASE; after another config they are read as before, without
the key."""

from __future__ import annotations

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
