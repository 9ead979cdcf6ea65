"""The user-facing error every layer raises, and the warning that reaches the console: the lowest module of the
package, importing nothing of planlm."""

from __future__ import annotations


class PlanlmError(Exception):
    """An error caused by the user's input or configuration.

    The CLI prints it as one line (no traceback) and exits with ``exit_status``. The message names the file,
    the record and the fix.
    """

    exit_status = 2


class PlanlmWarning(UserWarning):
    """A warning that matters to the user (a fallback, a setting that cannot work well): in a stage it reaches the
    console once, while library warnings go to the stage's log (``planlm.console``)."""


__all__ = ["PlanlmError", "PlanlmWarning"]
