"""Small helpers shared by every stage: seeding, fingerprints, manifests, clear user errors.

Every stage of the pipeline writes its artifacts into one folder and a ``manifest.json`` *last*.
A folder without a manifest is incomplete by definition; a manifest whose config fingerprint
differs from the requested config means the folder is stale. ``prepare_stage_dir`` implements
that contract once for all stages, and holds the folder for its process until the manifest is written:
a second process that would write the same folder is refused with the holder's pid and host.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import platform
import shutil
import time
from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

# Re-exported: planlm.utils stays the import path of these names; integrity sits below utils, so no circle.
from planlm.errors import PlanlmError
from planlm.integrity import MANIFEST, STAGE_LOCK, check_files, file_sha256, record_files

if TYPE_CHECKING:
    import torch


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def cache_root() -> Path:
    """planlm's cache folder for derived files (offline tokenizer files, exported GGUF models):
    $PLANLM_CACHE, default <tmp>/planlm-cache."""
    import tempfile

    return Path(os.environ.get("PLANLM_CACHE", Path(tempfile.gettempdir()) / "planlm-cache"))


@functools.lru_cache(maxsize=1)
def cpu_supports_bf16() -> bool:
    """Whether this CPU computes bf16 matrix products natively (AVX512-BF16 or AMX): without it, bf16
    autocast on CPU is emulated and slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: ask oneDNN
        import torch

        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return "avx512_bf16" in flags or "amx_bf16" in flags


def native_precision(precision: str | None, device_type: str, bf16: str, fp32: str) -> str | None:
    """``native`` resolved on this machine: ``bf16`` where the device computes bf16 natively (CUDA, or a CPU with
    AVX512-BF16 / AMX), ``fp32`` elsewhere (a config that runs fast where it can and everywhere); any other
    value as given."""
    if precision != "native":
        return precision
    return bf16 if device_type == "cuda" or cpu_supports_bf16() else fp32


def check_bf16(precision: str | None, device_type: str, flag: str) -> None:
    """One-line error for bf16 asked of a CPU that lacks it (``flag`` names the setting to change)."""
    if precision and "bf16" in precision and device_type == "cpu" and not cpu_supports_bf16():
        raise PlanlmError(f"{flag} {precision}: this CPU has no native bf16 (no avx512_bf16 / amx_bf16 in "
                          f"/proc/cpuinfo); use fp32 ({flag} {'32-true' if 'mixed' in precision else 'fp32'})")


def fingerprint(obj: Any) -> str:
    """A stable short hash of a JSON-able object (configs, lists of inputs)."""
    blob = json.dumps(to_jsonable(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def derive_seed(seed: int, stream: str) -> int:
    """A seed of its own for one random stream (``"adapter"``, ``"dropout"``, ``"data_order"`` ...) of a run
    seeded with ``seed``: streams drawn from one global generator would shift whenever another stream
    draws more numbers (an adapter with more parameters), and conditions would stop being paired."""
    return int(hashlib.sha256(f"{seed}:{stream}".encode()).hexdigest()[:8], 16) % (2**31)


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("planlm", "torch", "transformers", "sentence-transformers", "lightning", "spacy",
                 "faiss-cpu", "scikit-learn", "numpy", "datasets", "peft"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def process_umask() -> int:
    """The process's umask (read from /proc on Linux: setting it to read it would race with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(path: str | Path) -> None:
    """Give ``path`` (a folder: with everything in it) the mode a plain open() or mkdir() gives under the umask.

    Writers that go through a private temporary file or folder leave 0600 / 0700 behind (safetensors' ``save_file``
    and ``save_model``, ``tempfile.mkdtemp``), which a teammate in the group cannot read; call this after them."""
    path, mask = Path(path), process_umask()
    if path.is_dir() and not path.is_symlink():
        for child in path.iterdir():
            honour_umask(child)
        os.chmod(path, 0o777 & ~mask)
    elif path.is_file() and not path.is_symlink():
        os.chmod(path, 0o666 & ~mask)


def save_safetensors(tensors: dict, path: str | Path) -> None:
    """``safetensors.torch.save_file``, with the umask's mode (it writes 0600)."""
    from safetensors.torch import save_file

    save_file(tensors, str(path))
    honour_umask(path)


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (tmp file + rename), so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def read_manifest(stage_dir: str | Path) -> dict | None:
    path = Path(stage_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return manifest if isinstance(manifest, dict) else None


def write_manifest(stage_dir: str | Path, config: Any, **extra: Any) -> dict:
    """Mark a stage folder complete. Call this after every other artifact is written: the manifest records the
    size, the sha256 and the header of each (``planlm.integrity``), which every later reader checks."""
    manifest = {
        "config": to_jsonable(config),
        "config_fingerprint": fingerprint(config),
        "versions": library_versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **to_jsonable(extra),
        "files": record_files(stage_dir),
    }
    write_json(Path(stage_dir) / MANIFEST, manifest)
    unlock_stage_dir(stage_dir)
    return manifest


def is_complete(stage_dir: str | Path, config: Any) -> bool:
    manifest = read_manifest(stage_dir)
    return manifest is not None and manifest.get("config_fingerprint") == fingerprint(config)


def prepare_stage_dir(stage_dir: str | Path, config: Any, *, keep_partial: bool = False) -> bool:
    """Return True when ``stage_dir`` already holds a complete and intact result for ``config`` (reuse it).

    Otherwise take the folder's lock (``lock_stage_dir``: held until ``write_manifest``) and make the folder
    ready for a fresh build: a stale manifest (other config) is removed first, so that an interrupted
    rebuild can never be mistaken for complete. With ``keep_partial`` the other files stay (stages that
    resume from their own checkpoints); without it the folder is emptied. A finished folder that fails the
    cheap check of its files (``planlm.integrity``) is rebuilt, with a one-line note naming the file; its
    damaged files go first, so that a resuming stage never reads them.
    """
    stage_dir = Path(stage_dir)
    damaged = _damaged_files(stage_dir, config)
    if damaged is None:  # a finished folder is only read: no lock, read-only folders work
        return True
    lock_stage_dir(stage_dir)
    damaged = _damaged_files(stage_dir, config, note=False)
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
    damaged)."""
    from planlm import console

    path = stage_dir / MANIFEST
    manifest = read_manifest(stage_dir)
    if manifest is None:
        if path.is_file() and note:
            console.note(f"planlm: {path}: not a readable manifest (damaged); rebuilding {stage_dir}")
        return []
    if manifest.get("config_fingerprint") != fingerprint(config):
        return []
    damage = check_files(stage_dir, manifest)
    if not damage:
        return None
    if note:
        more = f" (and {len(damage) - 1} more file(s))" if len(damage) > 1 else ""
        console.note(f"planlm: {damage[0]}{more}; rebuilding {stage_dir}")
    return [d.path for d in damage]


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
def releasing_stage_locks():
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


def resolve_device(device: str) -> torch.device:
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def autocast(device: torch.device, precision: str):
    """bf16 autocast on CUDA by default (``auto``), fp32 elsewhere; ``bf16`` asks for it on any device
    (CPUs with AVX512-BF16 or AMX run bf16 matrix products about 3x faster; others are refused)."""
    check_bf16(precision, device.type, "--precision")
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        import torch

        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
