"""The lock on a stage folder: one process writes it, from the moment it decides to build it until its manifest is
written (or the process ends). A second process that would write the same folder is refused at once with the
holder's pid and host; a lock whose process died is taken over."""

from __future__ import annotations

import atexit
import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

from planlm.errors import PlanlmError
from planlm.stage.integrity import STAGE_LOCK

# The stage folders this process holds: folder -> its lock. A process takes a folder's lock again freely.
_held_locks: dict[Path, Any] = {}


def lock_stage_dir(stage_dir: str | Path) -> None:
    """Hold ``stage_dir`` for this process until ``unlock_stage_dir`` (``write_manifest`` calls it) or the
    process ends: a lock file (``STAGE_LOCK``: pid and host) created exclusively in the folder. Another live
    process's lock refuses at once with one PlanlmError naming its pid and host; a lock whose process is
    gone from this host (killed) is taken over. Distributed ranks other than 0 (their rank 0 holds the
    folder) take no lock."""
    from filelock import SoftFileLock, Timeout

    key = Path(os.path.abspath(stage_dir))
    held = _held_locks.get(key)
    if (held is not None and held.is_lock_held_by_us) or not _is_rank_zero():
        return
    key.mkdir(parents=True, exist_ok=True)
    lock = SoftFileLock(key / STAGE_LOCK, thread_local=False)
    try:
        lock.acquire(timeout=0)  # refuse rather than wait: the holder may train for hours
    except Timeout:
        raise PlanlmError(f"{key}: another planlm process is writing this folder ({_lock_holder(lock)}); wait for "
                          f"it to finish or stop it, then rerun (a lock whose process died is taken over)") from None
    _held_locks[key] = lock


def unlock_stage_dir(stage_dir: str | Path) -> None:
    """Release ``stage_dir`` if this process holds it."""
    lock = _held_locks.pop(Path(os.path.abspath(stage_dir)), None)
    if lock is not None and lock.is_lock_held_by_us:  # not in a forked child: its parent's lock stays
        lock.release(force=True)


@contextlib.contextmanager
def releasing_stage_locks() -> Iterator[None]:
    """Release, when the block ends, every stage lock taken inside it (those of a stage that raised)."""
    before = set(_held_locks)
    try:
        yield
    finally:
        for stage_dir in set(_held_locks) - before:
            unlock_stage_dir(stage_dir)


@atexit.register
def _release_all_stage_locks() -> None:
    for stage_dir in list(_held_locks):
        unlock_stage_dir(stage_dir)


def _lock_holder(lock: Any) -> str:
    """"pid N on HOST" from a lock file (filelock writes the pid and the host name on its first two lines)."""
    try:
        pid, host = Path(lock.lock_file).read_text().splitlines()[:2]
    except (OSError, ValueError):
        return "pid unknown: the lock was just released"
    return f"pid {pid} on {host}"


def _is_rank_zero() -> bool:
    """Whether this process is rank 0 of its distributed job, or not in one (the variables Lightning's
    rank_zero_only and launchers set: torchrun, Lightning's own launcher, SLURM)."""
    return all(os.environ.get(name, "0") in ("", "0") for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))
