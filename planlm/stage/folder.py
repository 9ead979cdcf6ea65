"""``StageDir``: the one way a command writes its stage folder. Entering it reuses a finished, intact folder built
for the same key, or takes the folder's lock and readies it for a fresh build; ``finish`` writes the manifest last;
leaving it lets go of the lock."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import TracebackType
from typing import Any, Optional

from planlm.errors import PlanlmError
from planlm.files import folder_bytes, human_bytes, is_disk_full
from planlm.jsonio import fingerprint
from planlm.stage.integrity import MANIFEST, STAGE_LOCK, check_files, check_format
from planlm.stage.lock import lock_stage_dir, unlock_stage_dir
from planlm.stage.manifest import read_manifest, write_manifest


class StageDir:
    """A stage folder and the key its result depends on, as a context manager::

        with StageDir(out, key, keep_partial=True) as stage:
            if stage.reused:
                return out
            ...  # write the artifacts
            stage.finish(num_actions=...)  # the manifest, last

    ``key`` is any JSON-able value (a dict of settings and of the identities of the folders the stage reads, see
    ``config_fingerprint``): the folder is reused when its manifest holds the same fingerprint and its files pass
    the cheap check. ``keep_partial``: a rebuild keeps the files an interrupted build left (stages that resume from
    their own checkpoints or reuse finished sub-folders); without it the folder is emptied.
    """

    def __init__(self, path: str | Path, key: Any, *, keep_partial: bool = False) -> None:
        self.path, self.key, self.keep_partial = Path(path), key, keep_partial
        self.reused = False

    def __enter__(self) -> StageDir:
        self.reused = prepare_stage_dir(self.path, self.key, keep_partial=self.keep_partial)
        return self

    def finish(self, files: dict[str, dict] | None = None, **record: Any) -> dict:
        """Write the manifest (the key, ``record`` and the record of every file) and let go of the folder: call it
        after every other artifact is written (``files``: see ``write_manifest``)."""
        return write_manifest(self.path, self.key, files=files, **record)

    def __exit__(self, kind: Optional[type[BaseException]], error: Optional[BaseException],
                 traceback: Optional[TracebackType]) -> None:
        unlock_stage_dir(self.path)  # a build that raised or stopped short lets go of the folder at once
        if is_disk_full(error):  # one line: the stage, the file, what the system said; the folder has no manifest
            raise PlanlmError(f"{self.path}: {error.strerror or 'the disk is full'} while this stage wrote "
                              f"{error.filename or 'a file'} ({human_bytes(folder_bytes(self.path))} written, "
                              f"{human_bytes(shutil.disk_usage(self.path).free)} free); free at least as much again "
                              f"and rerun the same command: the unfinished stage has no manifest, so it is never "
                              f"taken as complete, and it resumes") from error


def prepare_stage_dir(stage_dir: str | Path, config: Any, *, keep_partial: bool = False) -> bool:
    """Return True when ``stage_dir`` already holds a complete and intact result for ``config`` (reuse it).

    A folder whose manifest another planlm's format wrote is a one-line error (``check_format``): it is neither
    reused nor rebuilt over. Otherwise take the folder's lock (``lock_stage_dir``: held until ``write_manifest``) and
    make the folder ready for a fresh build: a stale manifest (other config) is removed first, so that an
    interrupted rebuild can never be mistaken for complete. With ``keep_partial`` the other files stay (stages that
    resume from their own checkpoints); without it the folder is emptied. A finished folder that fails the
    cheap check of its files (``planlm.stage.integrity``) is rebuilt, with a one-line note naming the file; its
    damaged files go first, so that a resuming stage never reads them.
    """
    stage_dir = Path(stage_dir)
    damaged = _damaged_files(stage_dir, config)
    if damaged is None:  # a finished folder is only read: no lock, read-only folders work
        return True
    lock_stage_dir(stage_dir)
    try:
        damaged = _damaged_files(stage_dir, config, note=False)
    except PlanlmError:  # written in another format by the process that held it a moment ago
        unlock_stage_dir(stage_dir)
        raise
    if damaged is None:  # finished by the process that held it a moment ago
        unlock_stage_dir(stage_dir)
        return True
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / MANIFEST).unlink(missing_ok=True)
    for path in damaged:
        path.unlink(missing_ok=True)
    if not keep_partial:
        for path in stage_dir.iterdir():
            if path.name != STAGE_LOCK:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    return False


def _damaged_files(stage_dir: Path, config: Any, note: bool = True) -> list[Path] | None:
    """None when ``stage_dir`` is complete for ``config`` and passes the cheap check; else the files to drop
    before rebuilding it (with a one-line note, ``planlm.console.note``, when ``note`` and the folder was finished but
    damaged). One-line OtherFormat when another planlm's format wrote its manifest."""
    from planlm import console

    path = stage_dir / MANIFEST
    manifest = read_manifest(stage_dir)
    if manifest is None:
        if path.is_file() and note:
            console.note(f"planlm: {path}: not a readable manifest (damaged); rebuilding {stage_dir}")
        return []
    check_format(manifest, path, stage_dir)  # another planlm's folder: neither reused nor rebuilt over
    if manifest.get("config_fingerprint") != fingerprint(config):
        return []
    damage = check_files(stage_dir, manifest)
    if not damage:
        return None
    if note:
        more = f" (and {len(damage) - 1} more file(s))" if len(damage) > 1 else ""
        console.note(f"planlm: {damage[0]}{more}; rebuilding {stage_dir}")
    return [d.path for d in damage]
