"""The error type of the data stack."""

from __future__ import annotations

import os

__all__ = ["DataError", "InputError"]


class DataError(ValueError):
    """Unusable input data; the message is one line naming the offending path.

    When a data-loader worker raises it, PyTorch re-raises it in the main process with the
    worker's traceback as the message; the original one-line message is recovered from it so
    that command-line tools can still print one line.
    """

    def __init__(self, message: object = "") -> None:
        text = str(message)
        if text.startswith("Caught ") and "Original Traceback" in text:
            last = text.strip().splitlines()[-1]
            if "DataError: " in last:
                text = last.split("DataError: ", 1)[1]
        super().__init__(text)


class InputError(DataError):
    """Unusable input or settings of a command (a missing source, a bad option).

    ``InputError(path, message)`` reads ``<path>: <message>``; ``InputError(text)`` takes a line
    that already names what it is about (``path`` is then ``None``).

    Attributes:
        path: what the error is about, as the user named it (or ``None``).
        message: what is wrong, without the path.
    """

    def __init__(self, path: str | os.PathLike | object, message: str | None = None) -> None:
        if message is None:
            self.path, self.message = None, str(path)
            super().__init__(self.message)
            return
        self.path, self.message = os.fspath(path), message
        super().__init__(f"{self.path}: {message}")
