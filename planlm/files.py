"""Files on disk: content hashes, the modes a teammate in the group can read, and planlm's cache folder."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path

from planlm.errors import PlanlmError


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """The sha256 of a file's bytes (hex), read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def human_bytes(size: float) -> str:
    """``size`` bytes as a person reads it: 512 B, 3.4 MB, 21.7 GB (powers of 1,000)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


def folder_bytes(path: str | Path) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist)."""
    path = Path(path)
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def require_space(path: str | Path, needed: int, what: str) -> None:
    """A one-line error when the file system of ``path`` (or of its nearest existing parent) has less than
    ``needed`` bytes free: ``what`` names the stage and the file, so that the disk cannot fill half-way through a
    file that is written in place (a memory-mapped file on a full disk kills the process without an error)."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if free < needed:
        raise PlanlmError(f"{what}: {path} needs {human_bytes(needed)}, but its file system has {human_bytes(free)} "
                          f"free; free space or write to another folder, then rerun the same command")


def is_disk_full(error: BaseException | None) -> bool:
    """True for the errors a full disk (or a used-up quota) raises."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


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


def cache_root() -> Path:
    """planlm's cache folder for derived files (offline tokenizer files, exported GGUF models):
    $PLANLM_CACHE, default <tmp>/planlm-cache."""
    import tempfile

    return Path(os.environ.get("PLANLM_CACHE", Path(tempfile.gettempdir()) / "planlm-cache"))
