"""docs/extending.md holds: its Python blocks, run in order in one namespace as the page shows them, register a plan
kind and an adapter, make plans, build, run, save and load a PlannedLM with the adapter, and read a corpus of one's
own; the adapter registry names its kinds in a one-line error and refuses a second class under a taken name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from planlm.errors import PlanlmError
from planlm.models.adapter import ADAPTERS, AdapterConfig, MultiPath, ProjectAvg, build_adapter, register_adapter
from planlm.plans.kinds import KINDS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[str]:
    return PYTHON.findall(PAGE.read_text())


@pytest.fixture
def registries():
    """The registries as they were: the page's registrations do not outlive the test."""
    kinds, adapters = dict(KINDS), dict(ADAPTERS)
    yield
    KINDS.clear()
    KINDS.update(kinds)
    ADAPTERS.clear()
    ADAPTERS.update(adapters)


def test_the_pages_examples_run(registries, tmp_path, monkeypatch):
    blocks = python_blocks()
    assert len(blocks) >= 4  # the command-line script, a plan kind, an adapter (and its model), a corpus
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the page's tempfile folders
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    namespace = {"__name__": "extending"}
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), namespace)
    assert "uniform_actions" in KINDS and "gated_mean" in ADAPTERS
    assert namespace["GatedMean"] is ADAPTERS["gated_mean"]
    assert len(namespace["articles"]) == 3


def test_an_adapter_of_the_page_trains_and_reloads_through_train_lm(registries, synthetic_cycle, tmp_path):
    from helpers import tiny_gpt2_config
    from planlm.models.adapter import AdapterSettings
    from planlm.models.planned_lm import PlannedLM
    from planlm.plans.spec import PlanSpec
    from planlm.train.lm import LMModelConfig, LMTrainConfig, train_lm

    adapter_block = next(block for block in python_blocks() if "class GatedMean" in block)
    namespace = {"__name__": "extending", "torch": torch}
    exec(compile(adapter_block, str(PAGE), "exec"), namespace)
    train = LMTrainConfig(batch_size=4, max_epochs=1, limit_train_batches=2, limit_val_batches=1, log_every_n_steps=1)
    model_dir = train_lm(str(synthetic_cycle), str(tmp_path / "lm"), LMModelConfig(model_config=tiny_gpt2_config()),
                         plans=PlanSpec(kind="oracle", num_paths=2, horizon=2),
                         adapter=AdapterSettings(kind="gated_mean"), train=train)
    model = PlannedLM.from_pretrained(model_dir)
    assert model.config.adapter.kind == "gated_mean" and type(model.adapter) is namespace["GatedMean"]


def test_an_unknown_adapter_kind_is_a_one_line_error_naming_the_registered_ones():
    with pytest.raises(PlanlmError, match=r"^--adapter.kind 'mean': choose one of project_avg, multipath$"):
        AdapterConfig(kind="mean")


def test_the_built_in_adapters_are_registered_and_a_taken_name_is_refused(registries):
    assert ADAPTERS["project_avg"] is ProjectAvg and ADAPTERS["multipath"] is MultiPath
    assert type(build_adapter(AdapterConfig(kind="multipath", action_dim=4, num_actions=3, hidden_size=8,
                                            horizon=2))) is MultiPath

    class Other(ProjectAvg):
        name = "project_avg"

    with pytest.raises(PlanlmError, match="adapter 'project_avg' is already registered"):
        register_adapter(Other)

    class Nameless(ProjectAvg):
        name = ""

    with pytest.raises(PlanlmError, match="needs a name"):
        register_adapter(Nameless)
    assert ADAPTERS["project_avg"] is ProjectAvg


def test_an_adapter_of_ones_own_checks_its_settings(registries):
    class Even(ProjectAvg):
        name = "even"

        @classmethod
        def check(cls, config):
            if config.hidden_size % 2:
                raise PlanlmError(f"--adapter.kind even needs an even LM width (got {config.hidden_size})")

    register_adapter(Even)
    small = dict(action_dim=4, num_actions=3, horizon=2)
    with pytest.raises(PlanlmError, match="even LM width"):
        AdapterConfig(kind="even", hidden_size=7, **small)
    torch.manual_seed(0)
    built = build_adapter(AdapterConfig(kind="even", hidden_size=8, **small))
    assert type(built) is Even and built.alphas() is None and built.gated_parameters() == []
