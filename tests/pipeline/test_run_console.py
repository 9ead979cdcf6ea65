"""The console of `planlm run` and of a command, captured as a CI log captures it (not a terminal): planlm's own
lines, one per stage, and none of the libraries' banners, bars and notices, which the stage logs hold instead;
`--verbose true` shows them as before."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from helpers import tiny_gpt2_config, tiny_run_config

LIBRARY_LINES = ("Loading weights", "GPU available", "TPU available", "Trainer(", "Trainer.fit")
STAGES = ["prepare", "train-planner", "train-lm none", "evaluate none", "train-lm ours", "evaluate ours"]


def planlm(*args: str) -> subprocess.CompletedProcess:
    """`planlm ARGS` in a process of its own, stdout and stderr into one captured stream (as `2>&1` into a file)."""
    return subprocess.run([sys.executable, "-m", "planlm.cli", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "80"})


@pytest.fixture(scope="module")
def console_run(tmp_path_factory):
    """A tiny run of six stages with the training bars on, and its console."""
    out = tmp_path_factory.mktemp("console") / "run"
    config = tiny_run_config(out, edit_distance=None, sweeps=[])
    config["conditions"] = [c for c in config["conditions"] if c["name"] in ("none", "ours")]
    path = out.parent / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    result = planlm("run", "--config", str(path))
    assert result.returncode == 0, result.stdout[-3000:]
    return out, path, result.stdout


def test_run_console_has_planlms_lines_only(console_run):
    out, _, text = console_run
    lines = text.splitlines()
    assert not [line for line in lines if any(noise in line for noise in LIBRARY_LINES)], text
    assert "\r" not in text  # no carriage-return stream off a terminal
    for index, stage in enumerate(STAGES, 1):  # start and end: one line when nothing came between them
        start = [i for i, line in enumerate(lines) if line.startswith(f"[{index}/{len(STAGES)}] {stage} ")]
        end = [i for i, line in enumerate(lines) if line.startswith(f"[{index}/{len(STAGES)}] {stage}")
               and re.search(r"(\.\.\. |: )done in \d+s", line)]
        assert len(start) == 1 and len(end) == 1 and start[0] <= end[0], (stage, text)
    evaluations = [line for line in lines if line.startswith(("[4/6] evaluate none", "[6/6] evaluate ours"))]
    assert all(re.search(r"ppl \d+\.\d+ \[", line) for line in evaluations)
    assert "plans shuffled" in evaluations[1] and "plans shuffled" not in evaluations[0]
    assert "planlm prepare: wrote" in text and lines[-1] == f"report: {out / 'report.md'}"
    # the thin codebook of 8 actions on 162 sentences, and the lead sections' short context, are said once each
    assert [line for line in lines if "k-means:" in line] == [
        "planlm: k-means: 162 training sentences for 8 actions (20.2 per action, fewer than 39): a thin codebook; "
        "use at most 4 actions or more articles"]
    assert len([line for line in lines if "12.3% of the training tokens" in line]) == 1
    # a line per stage (two where a note comes between), the prepare summary (8 lines), 2 notes, the report
    assert len(lines) <= len(STAGES) + 1 + 8 + 2 + 1, text


def test_stage_logs_hold_the_library_output(console_run):
    out, _, _ = console_run
    logs = out / "logs"
    assert "GPU available" in (logs / "train-lm_none.txt").read_text()
    assert "GPU available" in (logs / "train-planner.txt").read_text()
    assert "Loading weights" in (logs / "prepare.txt").read_text()  # the sentence encoder's
    evaluation = (logs / "evaluate_ours.txt").read_text()
    assert "Loading weights" in evaluation and "plans shuffled: ppl" in evaluation  # evaluate's own full line


def test_rerun_says_reused_for_every_stage(console_run):
    out, path, _ = console_run
    result = planlm("run", "--config", str(path))
    assert result.returncode == 0, result.stdout[-3000:]
    lines = result.stdout.splitlines()
    assert [line.split(" ... ")[1].split(";")[0] for line in lines[:-1]] == ["reused"] * len(STAGES), result.stdout


def test_a_command_shows_its_end_line_and_verbose_shows_the_libraries(tmp_path, synthetic_random):
    args = ["train-lm", "--prepared_dir", str(synthetic_random), "--model.model_config",
            yaml.safe_dump(tiny_gpt2_config(), default_flow_style=True).strip(), "--train.max_epochs", "1",
            "--train.limit_train_batches", "2", "--train.limit_val_batches", "1"]
    quiet = planlm(*args, "--out_dir", str(tmp_path / "quiet"))
    assert quiet.returncode == 0, quiet.stdout[-3000:]
    log = tmp_path / "logs" / "quiet.txt"
    assert quiet.stdout.splitlines() == [f"planlm train-lm: done in {quiet.stdout.split('done in ')[1].split()[0]} "
                                         f"(library output: {log})"]
    assert "GPU available" in log.read_text()
    verbose = planlm(*args, "--out_dir", str(tmp_path / "verbose"), "--verbose", "true")
    assert verbose.returncode == 0, verbose.stdout[-3000:]
    assert "GPU available" in verbose.stdout and "library output" not in verbose.stdout
    assert not (tmp_path / "logs" / "verbose.txt").exists()
