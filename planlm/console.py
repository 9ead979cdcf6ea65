"""What a person reads while planlm works: a few lines of planlm's own, one live bar, the libraries in a log.

Each stage of `planlm run`, and each command run from the CLI, runs inside ``stage_console``:

- one line when it starts and one when it ends (``StageConsole.begin`` / ``end``); off a terminal, `planlm run`
  completes the start line with the end when nothing was printed in between (one line per stage in a CI log);
- one live bar for the work at hand (``open_bar``: sentences, k-means, epochs and batches, articles): rich's bar on
  a terminal; elsewhere (a CI log, a file) a plain line at most every ``HEARTBEAT_S`` seconds, not a stream of
  carriage returns;
- the libraries' output goes to the stage's log file: every logging record (Lightning's "GPU available" banner and
  Trainer notices, transformers' messages), every Python warning, transformers' "Loading weights" bars, and in
  `planlm run` what the command prints (its summary, which the end line repeats);
- planlm's own notes (``note``: a fallback, a skipped record, a damaged file) and ``PlanlmWarning``s reach the
  console once each, and the log.

``set_verbose(True)`` (``--verbose true`` on the command line) routes nothing: every library writes where it
writes without planlm, and training shows Lightning's own bar.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Iterator, Optional, TextIO

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, Task, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from planlm.errors import PlanlmWarning

HEARTBEAT_S = 120.0
"""Off a terminal, a progress line at most this often: a CI log shows the run is alive, and a run whose stages take
under two minutes (such as the demo's) stays one line per stage."""
LIBRARY_LOGGERS = ("lightning.pytorch", "lightning.fabric")
"""Loggers with a console handler of their own and propagation off (transformers' is set through its own API)."""

_verbose = False
_current: Optional[StageConsole] = None


def set_verbose(verbose: bool) -> None:
    """Whether library output stays on the console (``--verbose true``) instead of going to the stage logs."""
    global _verbose
    _verbose = verbose


def is_verbose() -> bool:
    return _verbose


def note(message: str) -> None:
    """A note that matters to the user: on the console once per stage (and in its log), on stderr outside one."""
    if _current is None:
        print(message, file=sys.stderr)
    else:
        _current.note(message)


def fmt_seconds(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Bar:
    """One task of a stage's live bar: ``advance`` it, then ``close`` it (or use it in a ``with``)."""

    def __init__(self, stage: Optional[StageConsole], description: str, total: Optional[float], unit: str,
                 completed: float = 0, owned: bool = False):
        self.stage, self.owned = stage, owned
        self.task = stage.progress.add_task(description, total=total, completed=completed, unit=unit) if stage else None

    def advance(self, steps: float = 1) -> None:
        if self.stage is not None:
            self.stage.progress.advance(self.task, steps)
            self.stage.heartbeat(self.task)

    def close(self) -> None:
        if self.stage is not None:
            self.stage.progress.remove_task(self.task)
            if self.owned:
                self.stage.progress.stop()
            self.stage = None

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_bar(description: str, total: Optional[float] = None, unit: str = "", enabled: bool = True,
             completed: float = 0) -> Bar:
    """A task on the current stage's live bar (outside a stage: a bar of its own); a no-op when not ``enabled``."""
    if not enabled:
        return Bar(None, description, total, unit)
    if _current is not None:
        return Bar(_current, description, total, unit, completed)
    stage = StageConsole(Console(file=sys.stderr, highlight=False, soft_wrap=True))
    stage.progress.start()
    return Bar(stage, description, total, unit, completed, owned=True)


class StageConsole:
    """The console of one stage: its start and end lines, its live bar, its notes."""

    def __init__(self, console: Console, log: Optional[TextIO] = None, join_lines: bool = False,
                 redirect_stdout: bool = True):
        self.console, self.log = console, log
        self.join_lines = join_lines and not console.is_terminal
        self.progress = Progress(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[unit]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=console, transient=True, redirect_stdout=redirect_stdout,
                                 disable=not console.is_terminal)
        self._open = False  # a start line waiting for its end
        self._seen: set[str] = set()
        self._last_line = time.monotonic()

    def line(self, text: str, style: Optional[str] = None) -> None:
        """A line of its own (ending an open start line first)."""
        if self._open:
            self.console.print()
            self._open = False
        self.console.print(text, style=style, markup=False)
        self._last_line = time.monotonic()

    def begin(self, text: str) -> None:
        if self.join_lines:
            self.console.print(f"{text} ...", end="", markup=False)
            self._open = True
        else:
            self.line(text)

    def end(self, text: str, tail: str, style: Optional[str] = None) -> None:
        """The end line: ``tail`` after the open start line, or ``text`` on a line of its own."""
        if self._open:
            self.console.print(f" {tail}", style=style, markup=False)
            self._open = False
        else:
            self.line(text, style)

    def note(self, message: str) -> None:
        if self.log is not None:
            self.log.write(message + "\n")
        if message not in self._seen:
            self._seen.add(message)
            self.line(message, style="yellow")

    def heartbeat(self, task_id) -> None:
        """Off a terminal: the task's progress as a plain line, at most every HEARTBEAT_S seconds."""
        if self.console.is_terminal or time.monotonic() - self._last_line < HEARTBEAT_S:
            return
        task = next(t for t in self.progress.tasks if t.id == task_id)
        self.line(f"  {_describe(task)}")


def _describe(task: Task) -> str:
    """'embedding train: 1,024/6,848 sentences (15%), 1m00s, about 5m40s left' (no estimate without a rate)."""
    unit = task.fields.get("unit", "")
    done = f"{task.completed:,.0f}/{task.total:,.0f} {unit} ({task.percentage:.0f}%)" if task.total else \
        f"{task.completed:,.0f} {unit}"
    left = f", about {fmt_seconds(task.time_remaining)} left" if task.time_remaining else ""
    return f"{task.description}: {done}, {fmt_seconds(task.elapsed or 0)}{left}"


@contextlib.contextmanager
def stage_console(log_path: Optional[Path], capture_stdout: bool = False,
                  join_lines: bool = False) -> Iterator[StageConsole]:
    """The console of one stage, whose library output goes to ``log_path`` (appended; nothing is routed when
    verbose or without a path); ``capture_stdout``: what the command prints goes there too."""
    global _current
    previous = _current
    with contextlib.ExitStack() as stack:
        log = None
        if log_path is not None and not _verbose:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = stack.enter_context(open(log_path, "a", buffering=1, encoding="utf-8"))
            log.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            stack.enter_context(library_output_to(log))
            if capture_stdout:
                stack.enter_context(contextlib.redirect_stdout(log))
        console = Console(file=sys.stderr, highlight=False, soft_wrap=True)
        _current = StageConsole(console, log, join_lines, redirect_stdout=log is None or not capture_stdout)
        stack.callback(_restore, previous)
        with _current.progress:
            yield _current


def _restore(previous: Optional[StageConsole]) -> None:
    global _current
    _current = previous


@contextlib.contextmanager
def library_output_to(log: TextIO) -> Iterator[None]:
    """Every logging record, Python warning (a PlanlmWarning also as a ``note``) and transformers progress bar of
    the block goes to ``log``."""
    import transformers.utils.logging as hf_logging

    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [logging.getLogger(name) for name in LIBRARY_LOGGERS]
    saved = [(logger, logger.handlers[:], logger.propagate) for logger in loggers]
    previous_hook = hf_logging.set_tqdm_hook(lambda factory, args, kwargs: factory(*args, **{**kwargs, "file": log}))
    hf_logging.disable_default_handler()
    hf_logging.add_handler(handler)
    for logger in loggers:
        for old in logger.handlers[:]:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.propagate = False
    logging.getLogger().addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_to(log)
            yield
    finally:
        logging.getLogger().removeHandler(handler)
        for logger, handlers, propagate in saved:
            logger.removeHandler(handler)
            for old in handlers:
                logger.addHandler(old)
            logger.propagate = propagate
        hf_logging.remove_handler(handler)
        hf_logging.enable_default_handler()
        hf_logging.set_tqdm_hook(previous_hook)


def _warning_to(log: TextIO):
    def show(message, category, filename, lineno, file=None, line=None) -> None:
        log.write(warnings.formatwarning(message, category, filename, lineno, line))
        if issubclass(category, PlanlmWarning):
            note(f"planlm: {message}")
    return show
