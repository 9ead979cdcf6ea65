"""A stage folder's ``manifest.json``, written last: planlm's format (``format_version``), the reuse key (``config``)
and its fingerprint, the library versions, what the stage records beside them, and the record of every file
(``planlm.stage.integrity``)."""

from __future__ import annotations

import json
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from planlm.jsonio import fingerprint, to_jsonable, write_json
from planlm.stage.integrity import FORMAT_KEY, FORMAT_VERSION, MANIFEST, record_files
from planlm.stage.lock import unlock_stage_dir


def library_versions() -> dict[str, str]:
    """The versions of Python and of the libraries a stage's numbers depend on (those installed)."""
    versions = {"python": platform.python_version()}
    for name in ("planlm", "torch", "transformers", "sentence-transformers", "lightning", "spacy",
                 "faiss-cpu", "scikit-learn", "numpy", "datasets", "peft"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def read_manifest(stage_dir: str | Path) -> dict | None:
    """The manifest of ``stage_dir``; None when it has none or one that is not a JSON object (unfinished). No check
    of its files nor of its format: readers that load artifacts use ``planlm.stage.integrity.stage_manifest``."""
    path = Path(stage_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return manifest if isinstance(manifest, dict) else None


def config_fingerprint(stage_dir: str | Path | None) -> str | None:
    """The fingerprint of the key a finished stage folder was built for: what it holds, for the key of a stage that
    reads it (a folder rebuilt in place keeps its path); None when ``stage_dir`` is None or unfinished."""
    return (read_manifest(stage_dir) or {}).get("config_fingerprint") if stage_dir else None


def write_manifest(stage_dir: str | Path, config: Any, files: dict[str, dict] | None = None, **extra: Any) -> dict:
    """Mark a stage folder complete and let go of its lock. Call this after every other artifact is written: the
    manifest records the size, the sha256 and the header of each (``planlm.stage.integrity``), which every later
    reader checks. ``files``: that record (``record_files``), when the stage made it after its last file to use its
    hashes itself, so that no file is read twice. ``StageDir.finish`` calls it; a writer of a folder that is no
    stage (a fixture) calls it alone."""
    manifest = {
        FORMAT_KEY: FORMAT_VERSION,
        "config": to_jsonable(config),
        "config_fingerprint": fingerprint(config),
        "versions": library_versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **to_jsonable(extra),
        "files": record_files(stage_dir) if files is None else files,
    }
    write_json(Path(stage_dir) / MANIFEST, manifest)
    unlock_stage_dir(stage_dir)
    return manifest


def is_complete(stage_dir: str | Path, config: Any) -> bool:
    """Whether ``stage_dir`` holds a manifest for ``config`` (its files unchecked)."""
    manifest = read_manifest(stage_dir)
    return manifest is not None and manifest.get("config_fingerprint") == fingerprint(config)
