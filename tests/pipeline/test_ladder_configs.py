"""The LM ladder's configs (docs/ladder.md): each rung is configs/ladder.yaml plus an overlay that holds only its
differences (a later --config merges nested sections key by key and conditions by name): each rung's merged config
is the one the plan describes and passes a dry run."""

from __future__ import annotations

import io
import contextlib
from pathlib import Path

import pytest
import yaml

from planlm.cli import main
from planlm.pipeline.run import run

from helpers import tiny_run_config

ROOT = Path(__file__).resolve().parents[2]


def merged(*configs: Path) -> dict:
    """The config `planlm run` reads from these --config files (its --print_config)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["run", *[arg for c in configs for arg in ("--config", str(c))], "--print_config"])
    return yaml.safe_load(out.getvalue())


@pytest.fixture(scope="module")
def key_by_key(tmp_path_factory) -> None:
    folder = tmp_path_factory.mktemp("probe")
    base, overlay = folder / "base.yaml", folder / "overlay.yaml"
    base.write_text(yaml.safe_dump(tiny_run_config(folder / "run")))
    overlay.write_text(f"# Overlay on {base}, given after it\noverlay_of: {base}\nlm:\n  train:\n    max_steps: 7\n")
    lm = merged(base, overlay)["lm"]
    assert lm["model"]["model_config"] is not None and lm["train"]["max_steps"] == 7, "a later --config must merge"


EXPECTED = {  # rung: (layers, width, heads, epochs per condition, conditions)
    "ladder-1.yaml": (1, 64, 2, 3, ["none", "fixed", "ours", "oracle"]),
    "ladder-2.yaml": (2, 128, 2, 3, ["none", "fixed", "ours", "oracle"]),
    "ladder-3.yaml": (2, 128, 2, 6, ["none", "fixed", "ours", "oracle"]),
    "ladder-4.yaml": (4, 256, 4, 3, ["none", "fixed", "ours", "oracle", "ours_t1", "ours_pa"]),
    "ladder-gpu.yaml": (12, 768, 12, 6, ["none", "fixed", "ours", "oracle"]),
}


@pytest.mark.parametrize("rung", sorted(EXPECTED))
def test_each_scratch_rung_is_the_base_with_its_lm(rung, key_by_key, tmp_path):
    config = merged(ROOT / "configs" / "ladder.yaml", ROOT / "configs" / rung)
    layers, width, heads, epochs, conditions = EXPECTED[rung]
    model = config["lm"]["model"]["model_config"]
    assert (model["n_layer"], model["n_embd"], model["n_head"], model["n_positions"]) == (layers, width, heads, 128)
    assert config["lm"]["train"]["max_epochs"] == epochs and config["lm"]["train"]["batch_size"] == 16
    assert [c["name"] for c in config["conditions"]] == conditions
    assert config["seeds"] == [0, 1, 2, 3] and config["seed_draws"] == "method"
    assert config["prepare"]["planner_corpus"]["rest_of_train"] and config["prepare"]["corpus"]["num_test"] == 100
    assert config["planner"]["model"]["dynamics"] == "causal" and config["evaluate"]["stride"] == 64
    config.update(out_dir=str(tmp_path / "run"), dry_run=True)
    with contextlib.redirect_stdout(io.StringIO()):
        run(**config)


@pytest.mark.parametrize("rung", ["ladder-smollm2.yaml", "ladder-gpu-smollm2.yaml"])
def test_the_pretrained_rungs(rung, key_by_key):
    config = merged(ROOT / "configs" / "ladder.yaml", ROOT / "configs" / rung)
    assert config["lm"]["model"]["name_or_path"] == "smollm2-135m" and config["lm"]["model"]["finetune"] == "lora"
    assert config["lm"]["model"].get("model_config") is None and config.get("base_lm") is None
    assert config["prepare"]["tokenizer"] == "smollm2-135m" and config["prepare"]["corpus"]["num_test"] == 100
    assert [c["name"] for c in config["conditions"]] == ["none", "fixed", "ours", "oracle"]
