"""The Hugging Face Hub, both directions: planned-LM and planner folders by repo id, and uploads.

``local_folder("org/name")`` gives the folder of a Hub repo through ``huggingface_hub.snapshot_download``: from
the local cache (``HF_HUB_CACHE``, read when called) when the Hub is offline (``HF_HUB_OFFLINE=1``, or no
connection), else downloaded (and cached). An existing local path always wins, so ``runs/x/lm/ours`` is never
looked up online. ``push_to_hub(folder, repo_id)`` uploads a complete model folder (its model card, written
last by ``save_pretrained``, is the sign of a complete folder; training logs and checkpoints stay home).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Optional

from planlm.errors import PlanlmError
from planlm.stage import STAGE_LOCK

CARD_FILE = "README.md"
"""The model card of a saved folder (planlm.models.card writes it last, so it marks a complete folder)."""

# Training by-products a model repo does not need (resume checkpoints, logs, locks, temporary files).
NOT_UPLOADED = ["checkpoints/*", "logs/*", "tb/*", STAGE_LOCK, "*.tmp", "*.lock"]


@functools.lru_cache(maxsize=1)
def hub_available() -> bool:
    """Whether the Hugging Face hub can be reached (answered at once where DNS fails, as offline here)."""
    import socket

    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1":
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False


def hub_offline() -> bool:
    """Whether the Hub must not be contacted: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE set now, or no connection."""
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(flag.strip().lower() in ("1", "true", "yes", "on") for flag in flags) or not hub_available()


def is_repo_id(name: str) -> bool:
    """``name`` has the shape of a Hub repo id (``name`` or ``org/name``)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def local_folder(name_or_path: str | Path, what: str = "model", revision: Optional[str] = None) -> Path:
    """The local folder of ``name_or_path``: the path itself when it exists (or is no repo id), else the snapshot
    of the Hub repo ``name_or_path`` (from the cache when offline). One-line PlanlmError when neither exists."""
    path = Path(name_or_path)
    if path.exists() or not is_repo_id(str(name_or_path)):
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    repo_id, offline = str(name_or_path), hub_offline()
    cache = os.environ.get("HF_HUB_CACHE") or None  # read now, not at huggingface_hub's import
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=offline))
    except LocalEntryNotFoundError:
        raise PlanlmError(f"{what} {repo_id!r}: no such local folder, and the Hub repo {repo_id} is not in the "
                          f"Hugging Face cache ({cache or 'the default HF_HUB_CACHE'}) while offline; download it "
                          f"once with network (`hf download {repo_id}`) or give a local folder") from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise PlanlmError(f"{what} {repo_id!r}: no such local folder, and the Hub has no repo {repo_id} "
                          f"({type(e).__name__}); check the name, or log in (`hf auth login`) for a private "
                          f"repo") from None


def check_uploadable(folder: Path) -> None:
    """A folder is uploaded only complete: its model card written (the last file of save_pretrained) and no
    stage still writing it."""
    if not (folder / CARD_FILE).is_file():
        raise PlanlmError(f"{folder}: no model card ({CARD_FILE}), so the folder is incomplete or was saved before "
                          f"cards existed; save it again with save_pretrained (or rerun its stage) before pushing")
    if (folder / STAGE_LOCK).exists():
        raise PlanlmError(f"{folder}: a stage is still writing it ({STAGE_LOCK} present); push once it finished")


def push_to_hub(folder: str | Path, repo_id: str, *, private: Optional[bool] = None, token: Optional[str] = None,
                commit_message: str = "Upload planlm model", revision: Optional[str] = None) -> str:
    """Upload a saved planned-LM or planner folder to the Hub repo ``repo_id`` (created if missing) -> the commit
    URL. Needs a network and a token with write access (``hf auth login`` or ``token``)."""
    from huggingface_hub import HfApi

    folder = Path(folder)
    check_uploadable(folder)
    if hub_offline():
        raise PlanlmError(f"push_to_hub {repo_id}: the Hub is offline (HF_HUB_OFFLINE or no connection); push from "
                          f"a machine with network")
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    commit = api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message,
                               revision=revision, ignore_patterns=NOT_UPLOADED)
    return str(getattr(commit, "commit_url", commit))


__all__ = ["local_folder", "push_to_hub", "hub_offline", "hub_available", "is_repo_id", "check_uploadable", "CARD_FILE"]
