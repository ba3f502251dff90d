"""The one error base of bad user input: a path (or setting) and what is wrong with it.

Every command reports such an error as one line, ``<path>: <message>``, and exits with status 2.
This module imports nothing of the project (any layer may use it).
"""

from __future__ import annotations

import os

__all__ = ["PathError"]


class PathError(ValueError):
    """Bad input about ``path`` (a file, folder, location or ``key=value`` setting).

    ``PathError(path, message)`` reads ``<path>: <message>``; ``PathError(text)`` takes a line
    that already names what it is about (``path`` is then ``None``). Every error of bad input in
    the models package derives from it (``PretrainedError``,
    ``InferenceError``, ``ExportError``, ``OutputFolderError``, ``ViewerError``, the training
    CLI's ``UserError``), except the data stack's ``datamodules.errors.DataError``: deriving it
    from this class would make ``import datamodules`` import the whole model zoo (``models``'
    package initialiser imports every family, about 4.5 s), so the commands catch both.

    Attributes:
        path: what the error is about, as the user named it (or ``None``).
        message: what is wrong, without the path.
    """

    def __init__(self, path: str | os.PathLike | object, message: str | None = None) -> None:
        if message is None:
            self.path, self.message = None, str(path)
            super().__init__(self.message)
            return
        self.path = os.fspath(path)
        self.message = message
        super().__init__(f"{self.path}: {message}")
