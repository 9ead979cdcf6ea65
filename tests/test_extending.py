"""docs/extending.md holds: each Python block runs alone in a fresh interpreter (a block that is a module file, `#
my_adapters.py`, saved where the page says), and the page's last block, the whole loop, trains, evaluates and
generates with an adapter and a plan kind named by their import paths through plain `planlm` commands, each a fresh
process; a distributed relaunch of `planlm run` passes the paths on; a folder whose module is missing is one line
naming the folder and the path; the registries name their kinds in a one-line error and refuse a second class under
a taken name."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from planlm.errors import PlanlmError
from planlm.models.adapter import ADAPTERS, AdapterConfig, MultiPath, ProjectAvg, build_adapter, register_adapter
from planlm.plans.registry import KINDS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "extending.md"
PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
BASH = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
MODULE_FILE = re.compile(r"\A# (\w+\.py)\n")
TINY_LM = json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 128})
TINY = {  # appended to the page's commands: the same commands at a size that runs in seconds
    "train-lm": ["--model.model_config", TINY_LM, "--train.batch_size", "4", "--train.max_epochs", "1",
                 "--train.limit_train_batches", "2", "--train.limit_val_batches", "1", "--runtime.device", "cpu"],
    "evaluate": ["--split", "test", "--stride", "32", "--max_articles", "4", "--bootstrap_samples", "100",
                 "--runtime.device", "cpu"],
    "generate": ["--sampling.max_new_tokens", "8", "--runtime.device", "cpu", "--out_file", "{runs}/generated.json"],
}


def python_blocks() -> list[str]:
    return PYTHON.findall(PAGE.read_text())


def module_files(blocks: list[str]) -> dict[str, str]:
    """The blocks the page asks to save as files (their first line: ``# name.py``), by file name."""
    return {match.group(1): block for block in blocks if (match := MODULE_FILE.match(block))}


def env_with(*folders: Path) -> dict:
    """The environment of a fresh planlm process: this checkout's planlm, then ``folders``, on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *map(str, folders)])
    return env


def save_plugins(folder: Path, rename: dict[str, str] | None = None) -> None:
    """The page's module files saved in ``folder`` (``rename``: file stem -> another module name)."""
    for name, text in module_files(python_blocks()).items():
        stem = (rename or {}).get(name[:-3], name[:-3])
        (folder / f"{stem}.py").write_text(text)


@pytest.fixture
def registries():
    """The registries as they were: registrations do not outlive the test."""
    kinds, adapters = dict(KINDS), dict(ADAPTERS)
    yield
    KINDS.clear()
    KINDS.update(kinds)
    ADAPTERS.clear()
    ADAPTERS.update(adapters)


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_each_python_block_of_the_page_runs_alone_in_a_fresh_interpreter(index, tmp_path):
    blocks = python_blocks()
    save_plugins(tmp_path)  # what the page asks the reader to save, in the folder the reader works in
    env = {**env_with(), "TMPDIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", blocks[index]], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f"block {index} of {PAGE.name}:\n{blocks[index]}\n{result.stderr[-3000:]}"


def test_the_page_names_classes_by_import_path_first_and_ends_with_the_whole_loop():
    text = PAGE.read_text()
    assert len(python_blocks()) >= 5 and set(module_files(python_blocks())) == {"my_adapters.py", "my_plans.py"}
    assert text.index("--adapter.kind my_adapters:GatedMean") < text.index("register_adapter")
    assert "my_planlm.py" not in text and "planlm.cli import main" not in text  # no wrapper script
    loop = BASH.findall(text)[-1]
    assert text.rstrip().endswith("```") and text.rstrip()[:-3].rstrip().endswith(loop.rstrip())
    assert [command for command in ("planlm train-lm", "planlm evaluate", "planlm generate") if command in loop] == \
        ["planlm train-lm", "planlm evaluate", "planlm generate"]


def page_loop(runs: Path, prepared: Path) -> list[list[str]]:
    """The page's last block as argument lists of `python -m planlm.cli`: its folders under ``runs`` and its prepared
    corpus ``prepared``, each command with the tiny sizes of ``TINY`` appended (a later flag wins)."""
    commands = []
    for line in BASH.findall(PAGE.read_text())[-1].replace("\\\n", " ").splitlines():
        line = line.split("  #")[0].strip()
        if not line.startswith("planlm "):
            assert line.startswith(("export ", "#")) or not line, line
            continue
        line = line.replace("runs/my_prepared", str(prepared)).replace("runs/", f"{runs}/")
        args = shlex.split(line)[1:]
        commands.append(args + [flag.replace("{runs}", str(runs)) for flag in TINY[args[0]]])
    return commands


def test_the_whole_loop_trains_evaluates_and_generates_with_classes_named_by_import_path(
        synthetic_cycle, tmp_path, capsys):
    from planlm.cli import main

    plugins, runs = tmp_path / "project", tmp_path / "runs"
    plugins.mkdir()
    save_plugins(plugins)
    for args in page_loop(runs, synthetic_cycle):  # each command a fresh process, as a user runs them
        result = subprocess.run([sys.executable, "-m", "planlm.cli", *args], cwd=plugins, env=env_with(plugins),
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"planlm {shlex.join(args)}:\n{result.stderr[-3000:]}"

    config = json.loads((runs / "my_lm" / "planned_lm.json").read_text())
    assert config["plans"]["kind"] == "my_plans:UniformActions"
    assert config["adapter"] == {"kind": "my_adapters:GatedMean", "action_dim": 16, "num_actions": 8,
                                 "hidden_size": 32, "horizon": 2, "gate_init": 0.0}
    metrics = json.loads((runs / "my_eval" / "metrics.json").read_text())
    assert metrics["conditioning"] == "my_plans:UniformActions" and metrics["ppl"] > 1
    generated = json.loads((runs / "generated.json").read_text())
    assert generated["text"] and generated["sentences"]

    # here, where the page's modules are not on the path: one line naming the folder, the path and the fix
    assert "my_adapters" not in sys.modules
    with pytest.raises(SystemExit):
        main(["evaluate", "--model_dir", str(runs / "my_lm"), "--prepared_dir", str(synthetic_cycle),
              "--out_dir", str(tmp_path / "again")])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == (f"planlm: error: {runs / 'my_lm'}: adapter 'my_adapters:GatedMean' cannot be imported (no "
                     f"module named 'my_adapters'); install the package that provides it or put its folder on "
                     f"PYTHONPATH")


def relaunch_stage(tmp_path: Path, prepared: Path, monkeypatch):
    """A `planlm run` train-lm stage with an adapter and a plan kind of the page under module names of this test
    (importable here), bound from its YAML section as `planlm run` binds it."""
    from planlm.pipeline.run import Stage, _bind

    plugins = tmp_path / "project"
    plugins.mkdir()
    save_plugins(plugins, {"my_adapters": "relaunch_adapters", "my_plans": "relaunch_plans"})
    monkeypatch.syspath_prepend(str(plugins))
    monkeypatch.setenv("PYTHONPATH", env_with(plugins)["PYTHONPATH"])
    section = {"model": {"model_config": json.loads(TINY_LM)},
               "plans": {"kind": "relaunch_plans:UniformActions", "num_paths": 2, "horizon": 2},
               "adapter": {"kind": "relaunch_adapters.GatedMean", "options": {"gate_init": 0.25}},  # a class_path
               "train": {"batch_size": 4, "max_epochs": 1, "limit_train_batches": 2, "limit_val_batches": 1,
                         "devices": 1},
               "runtime": {"device": "cpu"}}
    args = _bind("train_lm", section, "test: conditions[mine]")
    return Stage("train-lm mine", "train_lm", {"prepared_dir": str(prepared), "out_dir": str(tmp_path / "lm"),
                                                **args}, condition="mine")


def test_a_distributed_relaunch_passes_the_import_paths_on(synthetic_cycle, tmp_path, monkeypatch):
    """`planlm run` relaunches a distributed stage as `python -m planlm.cli train-lm --config STAGE.yaml`: the YAML
    names both classes by their import paths, and reads back to the same settings."""
    from planlm.commands import load_command
    from planlm.pipeline import run as pipeline_run
    from planlm.pipeline.sections import bind_section

    stage = relaunch_stage(tmp_path, synthetic_cycle, monkeypatch)
    seen = {}

    def child(command, **_):
        seen["command"] = command
        seen["config"] = yaml.safe_load(Path(command[command.index("--config") + 1]).read_text())
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", child)
    pipeline_run._run_distributed(stage)
    assert seen["command"][1:4] == ["-m", "planlm.cli", "train-lm"]
    config = seen["config"]
    assert config["plans"]["kind"] == "relaunch_plans:UniformActions"
    assert config["adapter"]["kind"] == "relaunch_adapters.GatedMean"
    assert config["adapter"]["options"] == {"gate_init": 0.25}
    again = bind_section(load_command("train_lm"), {k: v for k, v in config.items() if k not in ("prepared_dir", "out_dir")},
                         skip={"prepared_dir", "out_dir"}, where="relaunch")
    assert again["adapter"] == stage.kwargs["adapter"] and again["plans"] == stage.kwargs["plans"]


@pytest.mark.slow
def test_a_relaunch_with_one_process_trains_with_the_classes_it_names(synthetic_cycle, tmp_path, monkeypatch):
    from planlm.models.planned_lm import PlannedLM
    from planlm.pipeline import run as pipeline_run

    stage = relaunch_stage(tmp_path, synthetic_cycle, monkeypatch)
    pipeline_run._run_distributed(stage)  # a fresh `python -m planlm.cli train-lm`, one process
    model = PlannedLM.from_pretrained(tmp_path / "lm")
    assert model.config.plans["kind"] == "relaunch_plans:UniformActions"
    assert model.config.adapter.kind == "relaunch_adapters.GatedMean" and model.config.adapter.gate_init == 0.25
    assert type(model.adapter).__module__ == "relaunch_adapters"


def test_an_unknown_adapter_kind_is_a_one_line_error_naming_the_registered_ones():
    with pytest.raises(PlanlmError, match=r"^--adapter.kind 'mean': choose one of project_avg, multipath, or name a "
                                          r"class of your own by its import path \(my_package.module:ClassName\)$"):
        AdapterConfig(kind="mean")


def test_an_import_path_that_does_not_import_is_a_one_line_error_naming_it():
    from planlm.models.adapter import AdapterSettings
    from planlm.plans.config import PlanConfig

    with pytest.raises(PlanlmError, match=r"^--adapter.kind: adapter 'no_such_package.adapters:Mine' cannot be imported "
                                          r"\(no module named 'no_such_package'\); install the package"):
        AdapterSettings(kind="no_such_package.adapters:Mine")
    with pytest.raises(PlanlmError, match=r"^--adapter.kind: adapter 'torch.nn:Linear' cannot be imported \(it is "
                                          r".*not a subclass of planlm.models.adapter.Adapter\); name an Adapter class"):
        AdapterSettings(kind="torch.nn:Linear")
    with pytest.raises(PlanlmError, match=r"^--plans.kind: plans kind 'planlm.plans.kinds:Nothing' cannot be imported "
                                          r"\(module planlm.plans.kinds has no attribute 'Nothing'\)"):
        PlanConfig(kind="planlm.plans.kinds:Nothing")


def test_a_folder_recording_a_name_registered_elsewhere_says_to_name_the_class_by_its_path(registries, tmp_path):
    """A class registered by name in a script (``__main__``) is recorded by that name; a process without the script
    gets one line naming the folder, what it records and the fix."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from planlm.models.planned_lm import PlannedLM, PlannedLMConfig

    class Scripted(ProjectAvg):
        name = "scripted"

    register_adapter(Scripted)
    adapter = AdapterConfig(kind="scripted", num_actions=4, action_dim=4, hidden_size=8, horizon=1)
    assert adapter.kind == "scripted"  # defined in a function: no import path to record
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_layer=1, n_embd=8, n_head=2, n_positions=16))
    folder = PlannedLM(PlannedLMConfig(plans={"kind": "fixed"}, adapter=adapter), lm).save_pretrained(tmp_path / "lm")
    ADAPTERS.pop("scripted")
    with pytest.raises(PlanlmError, match=rf"^{re.escape(str(folder))}: adapter 'scripted' is registered only by the "
                                          rf"code that trained it \(here: project_avg, multipath\); train with the "
                                          rf"class's import path"):
        PlannedLM.from_pretrained(folder)


def test_a_class_registered_by_name_in_an_importable_module_is_recorded_by_its_path(registries, tmp_path,
                                                                                     monkeypatch):
    import importlib

    from planlm.models.adapter import AdapterSettings

    (tmp_path / "named_adapters.py").write_text(
        "from planlm.models.adapter import ProjectAvg, register_adapter\n\n\n@register_adapter\n"
        "class Importable(ProjectAvg):\n    name = 'importable'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module("named_adapters")  # registers it, as a wrapper script's import does
        assert AdapterSettings(kind="importable").kind == "named_adapters:Importable"  # what a relaunch passes on
        assert AdapterConfig(kind="importable").kind == "named_adapters:Importable"  # what a model folder records
        assert AdapterSettings(kind="multipath").kind == "multipath"  # the built-ins keep their names
    finally:
        sys.modules.pop("named_adapters", None)


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


def test_a_plans_kind_named_by_its_path_is_read_by_the_pipelines_flags(registries):
    """`planlm run` asks a condition's kind whether it needs a planner: a kind named by its import path is imported
    to answer; one that does not import answers no (its section's error follows where it is bound)."""
    from planlm.plans.registry import kind_flag

    assert kind_flag("planlm.plans.kinds:OracleKind", "reads_future")
    assert not kind_flag("planlm.plans.kinds:OracleKind", "uses_planner")
    assert not kind_flag("no_such_package:Kind", "uses_planner")
