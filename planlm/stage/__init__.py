"""The stage contract, in one place. Every command writes its artifacts into one folder and a ``manifest.json``
*last*: a folder without a manifest is unfinished; one whose key fingerprint differs from the requested key is
stale; one whose files fail the check of the record its manifest holds is damaged. Both are rebuilt, the first
reused.

- ``folder``: ``StageDir(out, key)``, the context manager every command writes its folder through.
- ``manifest``: reading and writing ``manifest.json``; ``config_fingerprint``, the identity of a folder a stage reads.
- ``lock``: one process writes a folder at a time.
- ``integrity``: what each file of a folder was when it was written, the checks against it, the loaders.
- ``verify``: the ``planlm verify`` command.
"""

from planlm.stage.folder import StageDir, prepare_stage_dir
from planlm.stage.integrity import MANIFEST, STAGE_LOCK
from planlm.stage.lock import lock_stage_dir, releasing_stage_locks, unlock_stage_dir
from planlm.stage.manifest import config_fingerprint, is_complete, read_manifest, write_manifest

__all__ = ["MANIFEST", "STAGE_LOCK", "StageDir", "config_fingerprint", "is_complete", "lock_stage_dir",
           "prepare_stage_dir", "read_manifest", "releasing_stage_locks", "unlock_stage_dir", "write_manifest"]
