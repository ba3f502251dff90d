"""The one error base of bad user input: a path (or setting) and what is wrong with it.

Every command reports such an error as one line, ``<path>: <message>``, and exits with status 2.
This module imports nothing of the project (any layer may use it).
"""

from __future__ import annotations

import os

__all__ = ["PathError"]


class PathError(ValueError):
    """Bad input about ``path`` (a file, folder, location or ``key=value`` setting).

    Attributes:
        path: what the error is about, as the user named it.
        message: what is wrong, without the path.
    """

    def __init__(self, path: str | os.PathLike, message: str) -> None:
        self.path = os.fspath(path)
        self.message = message
        super().__init__(f"{self.path}: {message}")
