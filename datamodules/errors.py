"""The one error class of bad user input: a path (or setting) and what is wrong with it.

Every command reports such an error as one line, ``<path>: <message>``, and exits with status 2.
Placed at the bottom of the data package, whose initialiser loads only this module (not
``models``, whose initialiser imports every family), so that every layer of both packages may
import it. This module imports nothing of the project.
"""

from __future__ import annotations

import os

__all__ = ["InputError"]


class InputError(ValueError):
    """Bad input about ``path`` (a file, folder, location or ``key=value`` setting).

    ``InputError(path, message)`` reads ``<path>: <message>``; ``InputError(text)`` takes a line
    that already names what it is about (``path`` is then ``None``). Every error of bad input in
    the project derives from it, and every command catches it.

    When a data-loader worker raises one, PyTorch re-raises its class in the main process with
    the worker's traceback as the only argument; the original one-line message is recovered from
    the traceback's last line, so that the commands still print one line.

    Attributes:
        path: what the error is about, as the user named it (or ``None``).
        message: what is wrong, without the path.
    """

    def __init__(self, path: str | os.PathLike | object, message: str | None = None) -> None:
        if message is None:
            self.path, self.message = None, _worker_message(str(path), type(self).__name__)
            super().__init__(self.message)
            return
        self.path = os.fspath(path)
        self.message = message
        super().__init__(f"{self.path}: {message}")


def _worker_message(text: str, name: str) -> str:
    """``text``, or the one-line message of a ``name`` error that PyTorch's ``ExceptionWrapper``
    wrapped in its traceback (``Caught NAME in DataLoader worker process 0. Original
    Traceback ...``, whose last line is ``module.NAME: message``)."""
    if not (text.startswith(f"Caught {name} ") and "Original Traceback" in text):
        return text
    last = text.strip().splitlines()[-1]
    marker = f"{name}: "
    return last.split(marker, 1)[1] if marker in last else text
