"""Files on disk: content hashes, the modes a teammate in the group can read, and planlm's cache folder."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """The sha256 of a file's bytes (hex), read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


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
