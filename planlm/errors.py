"""The user-facing error every layer raises: the lowest module of the package, importing nothing of planlm."""

from __future__ import annotations


class PlanlmError(Exception):
    """An error caused by the user's input or configuration.

    The CLI prints it as one line (no traceback) and exits with ``exit_status``. The message names the file,
    the record and the fix.
    """

    exit_status = 2


__all__ = ["PlanlmError"]
