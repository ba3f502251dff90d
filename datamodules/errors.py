"""The error type of the data stack."""

from __future__ import annotations

__all__ = ["DataError"]


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
