"""Classes of your own named by their import path: ``my_package.module:ClassName`` (or the dotted
``my_package.module.ClassName`` of a jsonargparse ``class_path``).

An adapter (``--adapter.kind``) or a plan kind (``--plans.kind``) given so is imported where it is used, with no
script of your own around planlm's command line; a saved model records the path, so every later command (and a
distributed relaunch, a fresh ``python -m planlm.cli``) imports it again. The module must be importable there:
installed, or its folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Optional

from planlm.errors import PlanlmError

FIX = "install the package that provides it or put its folder on PYTHONPATH"


class PluginImportError(PlanlmError):
    """An import path that names nothing usable here: ``path`` and why (``reason``), in one line that says where the
    path was read (``where``: a flag, a model folder), what it should name (``what``) and the fix."""

    def __init__(self, path: str, reason: str, where: str = "", what: str = "class", fix: str = FIX):
        self.path, self.reason, self.what, self.fix = path, reason, what, fix
        super().__init__(f"{where + ': ' if where else ''}{what} {path!r} cannot be imported ({reason}); {fix}")

    def at(self, where: str, what: Optional[str] = None) -> PluginImportError:
        """The same error as read at ``where`` (a model folder): what it names and the path."""
        return PluginImportError(self.path, self.reason, where, what or self.what, self.fix)


class UnknownKind(PlanlmError):
    """A name that no class was registered under in this process, neither a built-in nor an import path."""

    def __init__(self, flag: str, name: str, known: list[str], what: str):
        self.name, self.known, self.what = name, list(known), what
        super().__init__(f"{flag} {name!r}: choose one of {', '.join(self.known)}, or name a class of your own by its "
                         f"import path (my_package.module:ClassName)")

    def at(self, where: str) -> PlanlmError:
        """The error as a model folder that records the name reads it: name the class by its import path instead."""
        return PlanlmError(f"{where}: {self.what} {self.name!r} is registered only by the code that trained it (here: "
                           f"{', '.join(self.known)}); train with the class's import path (my_package.module:"
                           f"ClassName), which the folder then records, or import the module that registers it first")


def is_import_path(text: Any) -> bool:
    """Whether ``text`` names a class by its import path (``module:Name`` or ``package.module.Name``), not by a
    registered name."""
    return isinstance(text, str) and (":" in text or "." in text) and not text.startswith((".", ":"))


def named_or_imported(name: Any, registry: dict, flag: str, what: str) -> tuple[Any, bool]:
    """What ``name`` names for ``flag``: (the registry's entry, True) for a registered name, (the object its import
    path names, imported now, False) for an import path; one line naming the registered names, or the path and why
    it does not import (``what``: what it should name), for anything else."""
    key = str(name)
    if key in registry:
        return registry[key], True
    if not is_import_path(key):
        raise UnknownKind(flag, key, list(registry), what)
    try:
        return import_object(key, what), False
    except PluginImportError as e:
        raise e.at(flag) from None


def import_object(path: str, what: str = "class") -> Any:
    """The object ``path`` names: ``module:Attr`` (``Attr`` may be dotted: ``Outer.Inner``) or ``package.module.Attr``
    (the module is the longest importable prefix). PluginImportError, one line, when nothing there imports."""
    if ":" in path:
        module_name, _, attribute = path.partition(":")
        candidates = [(module_name, attribute)]
    else:
        parts = path.split(".")
        candidates = [(".".join(parts[:i]), ".".join(parts[i:])) for i in range(len(parts) - 1, 0, -1)]
    missing: Optional[str] = None
    for module_name, attribute in candidates:
        if not module_name or not attribute:
            break
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
                missing = missing or f"no module named {e.name!r}"
                continue  # a shorter prefix may be the module (a dotted path)
            raise PluginImportError(path, _failed(module_name, e), what=what) from e
        except Exception as e:  # the module itself fails on import: what it said, in one line
            raise PluginImportError(path, _failed(module_name, e), what=what) from e
        value: Any = module
        for name in attribute.split("."):
            if not hasattr(value, name):
                raise PluginImportError(path, missing or f"module {module_name} has no attribute {attribute!r}",
                                        what=what)
            value = getattr(value, name)
        return value
    raise PluginImportError(path, missing or "write it as my_package.module:ClassName", what=what)


def _failed(module_name: str, error: Exception) -> str:
    return f"importing {module_name} failed: {type(error).__name__}: {' '.join(str(error).split())}"


def import_path_of(cls: type) -> Optional[str]:
    """``module:QualName`` of a class that a fresh process can import again by that path (None for a class of
    ``__main__``, one defined inside a function, or one its module does not hold under its name)."""
    module, qualname = getattr(cls, "__module__", None), getattr(cls, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname or module not in sys.modules:
        return None
    value: Any = sys.modules[module]
    for name in qualname.split("."):
        value = getattr(value, name, None)
    return f"{module}:{qualname}" if value is cls else None


__all__ = ["PluginImportError", "UnknownKind", "import_object", "import_path_of", "is_import_path", "FIX"]
