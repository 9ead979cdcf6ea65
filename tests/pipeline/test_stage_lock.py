"""The lock on every stage folder: a second writer is refused with the holder's pid, a dead holder's lock is
taken over, and a finished (or failed) stage leaves no lock behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from planlm.errors import PlanlmError
from planlm.stage import (STAGE_LOCK, StageDir, is_complete, prepare_stage_dir, read_manifest, releasing_stage_locks,
                          write_manifest)

from helpers import tiny_run_config

CONFIG = {"stage": 1}


def _holder(folder: Path) -> subprocess.Popen:
    """A process that takes ``folder`` for a stage, writes a partial file and sleeps."""
    code = ("import sys, time; from pathlib import Path; from planlm.stage import prepare_stage_dir; "
            f"prepare_stage_dir({str(folder)!r}, {CONFIG!r}); Path({str(folder)!r}, 'partial.txt').write_text('x'); "
            "print('held', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_folder_held_by_a_live_process_is_refused_with_its_pid(tmp_path):
    folder = tmp_path / "stage"
    proc = _holder(folder)
    try:
        refused = rf"stage: another planlm process is writing this folder \(pid {proc.pid} on "
        with pytest.raises(PlanlmError, match=refused):
            prepare_stage_dir(folder, CONFIG)
        assert (folder / "partial.txt").is_file()  # the holder's files were left alone
    finally:
        proc.kill()
        proc.wait()


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path):
    folder = tmp_path / "stage"
    proc = _holder(folder)
    proc.kill()  # SIGKILL: no chance to release
    proc.wait()
    assert str(proc.pid) in (folder / STAGE_LOCK).read_text()
    assert prepare_stage_dir(folder, CONFIG) is False
    assert (folder / STAGE_LOCK).read_text().split()[0] == str(os.getpid())
    assert not (folder / "partial.txt").exists()  # a fresh build: the dead holder's partial files are gone
    write_manifest(folder, CONFIG)
    assert not (folder / STAGE_LOCK).exists()


def test_a_finished_stage_leaves_no_lock_and_is_reused_without_one(tmp_path):
    folder = tmp_path / "stage"
    assert prepare_stage_dir(folder, CONFIG) is False
    assert (folder / STAGE_LOCK).is_file()
    assert prepare_stage_dir(folder, CONFIG) is False  # this process takes its own folder again
    write_manifest(folder, CONFIG)
    assert is_complete(folder, CONFIG) and not (folder / STAGE_LOCK).exists()
    assert prepare_stage_dir(folder, CONFIG) is True and not (folder / STAGE_LOCK).exists()


def test_a_stage_that_raises_releases_its_lock(tmp_path):
    folder = tmp_path / "stage"
    with pytest.raises(RuntimeError), releasing_stage_locks():
        prepare_stage_dir(folder, CONFIG)
        raise RuntimeError("the stage failed")
    assert not (folder / STAGE_LOCK).exists() and not is_complete(folder, CONFIG)


def test_stage_dir_builds_reuses_and_lets_go_of_its_folder(tmp_path):
    """StageDir: a fresh folder is held while it is built, finish() writes the manifest with the key and the record,
    a second entry reuses it, another key empties and rebuilds it, and a build that raises leaves no lock."""
    folder = tmp_path / "stage"
    with StageDir(folder, CONFIG) as stage:
        assert not stage.reused and (folder / STAGE_LOCK).exists()
        (folder / "result.txt").write_text("1")
        stage.finish(rows=3)
    assert read_manifest(folder)["config"] == CONFIG and read_manifest(folder)["rows"] == 3
    assert not (folder / STAGE_LOCK).exists()
    with StageDir(folder, CONFIG) as stage:
        assert stage.reused
    with pytest.raises(RuntimeError), StageDir(folder, {"stage": 2}) as stage:
        assert not stage.reused and not (folder / "result.txt").exists()  # emptied: another key
        raise RuntimeError("the stage failed")
    assert not (folder / STAGE_LOCK).exists() and not is_complete(folder, {"stage": 2})


def test_a_second_run_on_the_same_folder_is_refused_while_the_first_runs(tmp_path):
    out = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_run_config(out, edit_distance=None, sweeps=[])))
    command = [sys.executable, "-m", "planlm.cli", "run", "--config", str(config)]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 600
        while not (out / STAGE_LOCK).is_file():
            assert first.poll() is None and time.time() < deadline, f"the first run never took {out}"
            time.sleep(0.1)
        os.killpg(first.pid, signal.SIGSTOP)  # it holds the folder until killed: a loaded machine cannot let it
        second = subprocess.run(command, capture_output=True, text=True, timeout=600)  # finish before this starts
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert second.returncode == 2
    assert f"another planlm process is writing this folder (pid {first.pid} on " in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1 and "planlm run stage" not in second.stderr
