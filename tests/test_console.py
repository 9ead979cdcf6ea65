"""planlm.console: a stage's start and end lines, its one bar (plain lines off a terminal), planlm's notes once,
and the libraries' logging records, warnings and bars in the stage's log."""

from __future__ import annotations

import logging
import re
import warnings

import pytest

import planlm.console as console
from planlm.console import note, open_bar, stage_console
from planlm.errors import PlanlmWarning


@pytest.fixture
def every_line(monkeypatch):
    """A progress line at every step off a terminal (instead of one a minute)."""
    monkeypatch.setattr(console, "HEARTBEAT_S", 0.0)


def test_bar_off_a_terminal_is_plain_lines(tmp_path, capsys, every_line):
    with stage_console(tmp_path / "stage.txt"):
        with open_bar("embedding train", 3, "sentences") as bar:
            for _ in range(3):
                bar.advance()
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err  # no carriage-return stream, no terminal codes
    lines = err.splitlines()
    assert len(lines) == 3
    for n, line in enumerate(lines, 1):  # the time left only from a measured rate
        assert re.fullmatch(rf"  embedding train: {n}/3 sentences \(\d+%\), \ds(, about \ds left)?", line), line


def test_no_progress_line_before_a_heartbeat_is_due(tmp_path, capsys):
    with stage_console(tmp_path / "stage.txt"):
        with open_bar("scoring test", 1000, "windows") as bar:
            for _ in range(1000):
                bar.advance()
    assert capsys.readouterr().err == ""


def test_start_and_end_share_a_line_unless_something_comes_between(tmp_path, capsys):
    with stage_console(tmp_path / "a.txt", join_lines=True) as out:
        out.begin("[1/2] prepare")
        out.end("[1/2] prepare: done in 3s", "done in 3s")
    with stage_console(tmp_path / "b.txt", join_lines=True) as out:
        out.begin("[2/2] train-lm none")
        note("planlm: a fallback")
        out.end("[2/2] train-lm none: done in 5s", "done in 5s")
    assert capsys.readouterr().err.splitlines() == [
        "[1/2] prepare ... done in 3s", "[2/2] train-lm none ...", "planlm: a fallback",
        "[2/2] train-lm none: done in 5s"]


def test_library_output_goes_to_the_log_and_planlm_warnings_to_the_console_once(tmp_path, capsys):
    import lightning.pytorch  # noqa: F401  (its loggers at INFO, as in a run)
    import transformers.utils.logging as hf_logging

    log = tmp_path / "logs" / "stage.txt"
    with stage_console(log):
        logging.getLogger("lightning.pytorch.utilities.rank_zero").info("GPU available: False, used: False")
        hf_logging.get_logger("transformers.modeling_utils").warning("some weights were not used")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a library's deprecation", FutureWarning)
            for _ in range(2):
                warnings.warn("torch.compile failed; running eager", PlanlmWarning)
                note("planlm: skipping record 3: empty text")
    assert capsys.readouterr().err.splitlines() == [
        "planlm: torch.compile failed; running eager", "planlm: skipping record 3: empty text"]
    text = log.read_text()
    for line in ("GPU available: False", "some weights were not used", "a library's deprecation",
                 "torch.compile failed; running eager", "skipping record 3"):
        assert line in text
    # outside a stage the libraries' handlers are theirs again
    handlers = [*logging.getLogger().handlers, *logging.getLogger("lightning.pytorch").handlers,
                *hf_logging.get_logger("transformers").handlers]
    assert hf_logging.get_logger("transformers").handlers
    assert not [h for h in handlers if getattr(getattr(h, "stream", None), "name", None) == str(log)]


def test_verbose_routes_nothing(tmp_path):
    """(The CLI's --verbose, end to end: tests/pipeline/test_run_console.py.)"""
    lightning = logging.getLogger("lightning.pytorch")
    before = (lightning.handlers[:], lightning.propagate, warnings.showwarning)
    console.set_verbose(True)
    try:
        with stage_console(tmp_path / "logs" / "stage.txt"):
            assert (lightning.handlers, lightning.propagate, warnings.showwarning) == before
    finally:
        console.set_verbose(False)
    assert not (tmp_path / "logs").exists()


def test_a_bar_outside_a_stage_and_a_disabled_bar(capsys):
    with open_bar("k-means", 2, "iterations") as bar:
        bar.advance(2)
    with open_bar("k-means", 2, "iterations", enabled=False) as bar:
        bar.advance(2)
    note("planlm: outside a stage")
    assert capsys.readouterr().err == "planlm: outside a stage\n"
