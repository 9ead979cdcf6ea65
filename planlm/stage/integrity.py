"""What a stage folder holds, recorded when it is written and checked whenever it is read: the one place that
knows every artifact kind of a run folder (weights, codebook, plan caches, prepared arrays, manifests,
checkpoints) and how each can be damaged.

``write_manifest`` records every file of a stage (``files`` in manifest.json): its size, its sha256 and what its
header says (``.npy``: dtype, shape, order; ``.safetensors``: the sha256 of its JSON header). Checkpoints and
logs are not recorded (resume state and logger output, rewritten by design), nor nested stage folders (a
planner's ``plans/`` caches have manifests of their own).

Two checks read that record:

- ``check_files(..., full=False)``, the cheap check every reader runs (``StageDir`` on reuse, and the
  loaders of prepared corpora, planners, plan caches and planned LMs): sizes, npy headers against the recorded
  shapes, safetensors headers (parsed, covering the file, equal to the recorded one), and the sha256 of the
  smallest files up to ``QUICK_HASH_BYTES`` per stage (configs, manifests, tokenizers, small arrays: where a
  hand edit or a zeroed block leaves the size unchanged). A byte flipped inside a large tensor keeps size and
  header: only the full check sees it.
- ``check_files(..., full=True)`` (``planlm verify``): every content hash.

Loaders open files through ``load_json``, ``load_npy``, ``load_safetensors`` and ``load_checkpoint`` (or the
``reading`` block), which turn any unreadable file into one ``DamagedArtifact`` line naming the file, what is
wrong and the fix, also in folders without a record (made by hand).

Every manifest, planned_lm.json and planner config.json holds the format planlm wrote it in (``FORMAT_VERSION``);
``stage_manifest``, the reuse check of ``StageDir`` and the model loaders refuse another (``check_format``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from planlm.errors import PlanlmError
from planlm.files import file_sha256

MANIFEST = "manifest.json"
STAGE_LOCK = ".lock"

FORMAT_KEY = "format_version"
FORMAT_VERSION = 3
"""The format of the folders planlm writes. Every ``manifest.json``, a planned LM's ``planned_lm.json`` and a
planner's ``config.json`` hold it under ``format_version``; a reader refuses a folder of any other format in one
line (``check_format``) instead of reusing or loading it. Format 1 is every folder written before the key existed;
2 recorded settings planlm no longer has (options that left the CLI) in its keys and configs.
Raise it when what a folder holds, or how it is keyed, changes so that an older folder would read differently."""

QUICK_HASH_BYTES = 128 << 20
"""Bytes of a stage's smallest files whose sha256 the cheap check recomputes (about 0.1 s at 1 GB/s)."""
UNRECORDED = ("checkpoints", "logs", "tb", "plans")
"""Folders of a stage that its record leaves out: resume state, logger output (logs/, tb/), nested plan caches."""
UNRECORDED_FILES = (MANIFEST, STAGE_LOCK, "README.md")
"""Files a record leaves out: itself, the lock, and the model card (README.md), which `planlm evaluate` rewrites
with every evaluation of the model (``planlm.models.planned_lm.add_evaluation``)."""

# Which command writes a stage folder, told by a file only that kind holds (first match wins).
_KINDS = (("planned_lm.json", "train-lm"), ("per_boundary.csv", "edit-distance"), ("sweep_", "sweep"),
          ("per_article.csv", "evaluate"), ("summary.json", "train-planner"), (".argmax.npy", "sample-plans"),
          ("articles.jsonl", "prepare"), ("codebook.safetensors", "prepare"))


class DamagedArtifact(PlanlmError):
    """A file of a finished stage is missing, cut short, overwritten or unreadable."""


class OtherFormat(PlanlmError):
    """A folder written by a planlm of another format (``FORMAT_VERSION``)."""


def with_format(values: dict) -> dict:
    """``values`` (a manifest, a model's config) with this planlm's format first."""
    return {FORMAT_KEY: FORMAT_VERSION, **{key: value for key, value in values.items() if key != FORMAT_KEY}}


def check_format(values: Any, path: str | Path, folder: str | Path) -> None:
    """One-line OtherFormat unless ``values`` (the JSON object read from ``path``, a file of the folder ``folder``)
    holds this planlm's format: an older folder is neither reused nor loaded, and nothing rebuilds it over the
    results it holds; the line names the folder to delete and the command that writes it again."""
    found = values.get(FORMAT_KEY, 1) if isinstance(values, dict) else 1
    if found == FORMAT_VERSION:
        return
    age = "a newer" if isinstance(found, int) and found > FORMAT_VERSION else "an older"
    raise OtherFormat(f"{path} was written by {age} planlm (format {found}, this planlm reads format "
                      f"{FORMAT_VERSION}); delete {folder} and rerun {_writer(folder)}")


@dataclass(frozen=True)
class Damage:
    path: Path
    what: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


# ------------------------------------------------------------------------------------------ the record
def record_files(stage_dir: str | Path) -> dict[str, dict]:
    """{relative path: {size, sha256, npy | safetensors}} of every file a finished stage holds."""
    stage_dir = Path(stage_dir)
    record = {}
    for path in sorted(_stage_files(stage_dir)):
        record[path.relative_to(stage_dir).as_posix()] = {"size": path.stat().st_size, "sha256": file_sha256(path),
                                                          **_header_record(path)}
    return record


def _stage_files(stage_dir: Path) -> Iterator[Path]:
    for path in stage_dir.iterdir():
        if path.is_dir() and not path.is_symlink():
            if path.name not in UNRECORDED and not (path / MANIFEST).is_file():
                yield from _stage_files(path)
        elif path.is_file() and path.name not in UNRECORDED_FILES and not path.name.endswith(".tmp"):
            yield path


def _header_record(path: Path) -> dict:
    if path.suffix == ".npy":
        shape, fortran, dtype, _ = npy_header(path)
        return {"npy": {"dtype": dtype.str, "shape": list(shape), "fortran": fortran}}
    if path.suffix == ".safetensors":
        return {"safetensors_header": safetensors_header(path)[0]}
    return {}


def npy_header(path: Path) -> tuple[tuple, bool, np.dtype, int]:
    """(shape, fortran order, dtype, data offset) from a .npy file's header; ValueError when it is not one."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
        return shape, fortran, dtype, f.tell()


def safetensors_header(path: Path) -> tuple[str, int]:
    """(sha256 of the JSON header, bytes of tensor data it describes); ValueError unless the header parses and
    its tensors cover the rest of the file exactly."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise ValueError(f"header of {length} bytes in a file of {size}")
        blob = f.read(length)
    try:
        header = json.loads(blob)
        ends = [int(info["data_offsets"][1]) for name, info in header.items() if name != "__metadata__"]
    except (ValueError, UnicodeDecodeError, AttributeError, KeyError, TypeError, IndexError):
        raise ValueError("safetensors header is not the JSON table of tensors") from None
    data = size - 8 - length
    if max(ends, default=0) != data:
        raise ValueError(f"tensors cover {max(ends, default=0)} of its {data} data bytes")
    return hashlib.sha256(blob).hexdigest(), data


# ------------------------------------------------------------------------------------------ the checks
_passed: dict[tuple[Path, bool], tuple] = {}  # a folder that passed, by the stats of its files: not read twice


def check_files(stage_dir: str | Path, manifest: dict, full: bool = False) -> list[Damage]:
    """The damaged files of a finished stage folder against its manifest's record. ``full``: every content hash;
    otherwise the cheap check (see the module's docstring)."""
    stage_dir = Path(stage_dir)
    files = manifest.get("files") or {}
    stats = _stats(stage_dir, files)
    if _passed.get((stage_dir.resolve(), full)) == stats:
        return []
    damage, budget = [], float("inf") if full else QUICK_HASH_BYTES
    for rel, recorded in sorted(files.items(), key=lambda item: item[1]["size"]):
        hashed = recorded["size"] <= budget
        budget -= recorded["size"] if hashed else 0
        what = _check_file(stage_dir / rel, recorded, hashed)
        if what:
            damage.append(Damage(stage_dir / rel, what))
    if not damage:
        _passed[(stage_dir.resolve(), full)] = stats
    return damage


def _stats(stage_dir: Path, files: dict) -> tuple:
    stats = []
    for rel in [MANIFEST, *files]:
        try:
            st = (stage_dir / rel).stat()
            stats.append((rel, st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            stats.append((rel, None))
    return tuple(stats)


def _check_file(path: Path, recorded: dict, hashed: bool) -> str | None:
    """What is wrong with one recorded file, or None."""
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != recorded["size"]:
        how = "cut short or overwritten" if size < recorded["size"] else "overwritten or appended to"
        return f"{size} bytes but {recorded['size']} were written ({how})"
    try:
        if "npy" in recorded:
            shape, fortran, dtype, offset = npy_header(path)
            want = recorded["npy"]
            if (list(shape), dtype.str, fortran) != (want["shape"], want["dtype"], want["fortran"]):
                return f"array {dtype.str} {tuple(shape)}, but {want['dtype']} {tuple(want['shape'])} was written"
            if offset + int(np.prod(shape)) * dtype.itemsize != size:
                return f"array data does not fill the file ({size - offset} bytes for shape {tuple(shape)})"
        if "safetensors_header" in recorded and safetensors_header(path)[0] != recorded["safetensors_header"]:
            return "safetensors header differs from the one written (other tensors, names or shapes)"
    except (ValueError, OSError, EOFError, SyntaxError) as e:
        return f"unreadable header ({_one_line(e)})"
    if hashed and file_sha256(path) != recorded["sha256"]:
        return "content differs from the sha256 recorded when it was written (overwritten or corrupted)"
    return None


def fix_for(stage_dir: str | Path, manifest: dict | None = None) -> str:
    """How to rebuild a stage folder: `planlm run` does it on its own; a command run by hand is named."""
    return f"rerun {_writer(stage_dir, manifest)} (it rebuilds a damaged stage)"


def _writer(stage_dir: str | Path, manifest: dict | None = None) -> str:
    """The command that writes a stage folder, told by its files, or the `planlm run` that made it."""
    names = list((manifest or {}).get("files") or [])
    if not names and Path(stage_dir).is_dir():
        names = [path.name for path in Path(stage_dir).iterdir()]
    command = next((cmd for marker, cmd in _KINDS for name in names if marker in name), None)
    by_hand = f"`planlm {command} --out_dir {stage_dir}`" if command else "the command that wrote it"
    return f"{by_hand} or the `planlm run` that made it"


def stage_manifest(stage_dir: str | Path) -> dict | None:
    """The manifest of a finished stage folder after the cheap check; None when it has none (unfinished). One-line
    DamagedArtifact when the manifest or a file it records is damaged, OtherFormat when another planlm wrote it."""
    stage_dir = Path(stage_dir)
    path = stage_dir / MANIFEST
    if not path.is_file():
        return None
    manifest = load_json(path, fix=fix_for(stage_dir))
    if not isinstance(manifest, dict):
        raise DamagedArtifact(f"{path}: not a manifest (a JSON {type(manifest).__name__}); {fix_for(stage_dir)}")
    check_format(manifest, path, stage_dir)
    damage = check_files(stage_dir, manifest)
    if damage:
        more = f" (and {len(damage) - 1} more file(s))" if len(damage) > 1 else ""
        raise DamagedArtifact(f"{damage[0]}{more}; {fix_for(stage_dir, manifest)}")
    return manifest


# ------------------------------------------------------------------------------------------ the loaders
_UNREADABLE = (OSError, ValueError, TypeError, EOFError, RuntimeError, KeyError, UnicodeDecodeError, struct.error)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


@contextlib.contextmanager
def reading(path: str | Path, fix: str) -> Iterator[None]:
    """Any failure to read ``path`` inside the block becomes one DamagedArtifact line naming it and ``fix``."""
    from safetensors import SafetensorError

    try:
        yield
    except PlanlmError:
        raise
    except FileNotFoundError as e:
        raise DamagedArtifact(f"{e.filename or path}: missing; {fix}") from None
    except (*_UNREADABLE, SafetensorError) as e:
        raise DamagedArtifact(f"{path}: damaged or not what planlm wrote ({_one_line(e)}); {fix}") from None


def load_json(path: str | Path, fix: str) -> Any:
    with reading(path, fix):
        return json.loads(Path(path).read_text())


def load_npy(path: str | Path, fix: str, mmap_mode: str | None = "r") -> np.ndarray:
    with reading(path, fix):
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)


def load_safetensors(path: str | Path, fix: str) -> dict:
    from safetensors.torch import load_file

    with reading(path, fix):
        return load_file(str(path))


def load_checkpoint(path: str | Path, fix: str) -> dict:
    """A Lightning checkpoint (tensors and plain values only: no pickled code runs)."""
    import pickle
    import zipfile

    import torch

    with reading(path, fix):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, zipfile.BadZipFile) as e:
            raise ValueError(str(e)) from None


def checkpoint_is_readable(path: str | Path) -> str | None:
    """What is wrong with a checkpoint file without loading its tensors (its zip directory and CRCs), or None."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
        return _one_line(e)
    return f"member {bad} fails its CRC" if bad else None
