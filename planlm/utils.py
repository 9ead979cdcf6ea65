"""Small helpers shared by every stage: seeding, fingerprints, manifests, clear user errors.

Every stage of the pipeline writes its artifacts into one folder and a ``manifest.json`` *last*.
A folder without a manifest is incomplete by definition; a manifest whose config fingerprint
differs from the requested config means the folder is stale. ``prepare_stage_dir`` implements
that contract once for all stages.
"""

from __future__ import annotations

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

if TYPE_CHECKING:
    import torch

MANIFEST = "manifest.json"


class PlanlmError(Exception):
    """An error caused by the user's input or configuration.

    The CLI prints it as one line (no traceback). The message names the file, the record and
    the fix.
    """


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


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("planlm", "torch", "transformers", "sentence-transformers", "lightning", "spacy",
                 "faiss-cpu", "scikit-learn", "numpy", "datasets", "peft"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


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
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def write_manifest(stage_dir: str | Path, config: Any, **extra: Any) -> dict:
    """Mark a stage folder complete. Call this after every other artifact is written."""
    manifest = {
        "config": to_jsonable(config),
        "config_fingerprint": fingerprint(config),
        "versions": library_versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **to_jsonable(extra),
    }
    write_json(Path(stage_dir) / MANIFEST, manifest)
    return manifest


def is_complete(stage_dir: str | Path, config: Any) -> bool:
    manifest = read_manifest(stage_dir)
    return manifest is not None and manifest.get("config_fingerprint") == fingerprint(config)


def prepare_stage_dir(stage_dir: str | Path, config: Any, *, keep_partial: bool = False) -> bool:
    """Return True when ``stage_dir`` already holds a complete result for ``config`` (reuse it).

    Otherwise make the folder ready for a fresh build: a stale manifest (other config) is removed
    first, so that an interrupted rebuild can never be mistaken for complete. With
    ``keep_partial`` the other files stay (stages that resume from their own checkpoints);
    without it the folder is emptied.
    """
    stage_dir = Path(stage_dir)
    if is_complete(stage_dir, config):
        return True
    if stage_dir.exists():
        (stage_dir / MANIFEST).unlink(missing_ok=True)
        if not keep_partial:
            shutil.rmtree(stage_dir)
    stage_dir.mkdir(parents=True, exist_ok=True)
    return False


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
