"""JSON as planlm writes it: values made JSON-able, files written atomically, the short stable hash
(``fingerprint``) that reuse keys are compared by, and the records of interrupted work read back."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np


def to_jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON values: dataclasses and dicts as dicts (keys as strings), tuples as lists, paths as
    strings, enums as their values, numpy scalars as Python ones."""
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


def fingerprint(obj: Any) -> str:
    """A stable short hash of a JSON-able object (configs, lists of inputs): key order does not count."""
    blob = json.dumps(to_jsonable(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def write_json(path: str | Path, obj: Any) -> None:
    """Write JSON atomically (tmp file + rename), so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def read_record(path: str | Path) -> dict:
    """The JSON record at ``path`` (a progress or key file that interrupted work left), or {} when it is missing or
    unreadable: then there is nothing to resume from."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
