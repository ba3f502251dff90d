"""The one bad-input error class (``datamodules.errors.InputError``): how it reads, its recovery of
the one-line message from a data-loader worker's traceback, and that every error class of the
project derives from it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from torch._utils import ExceptionWrapper

from datamodules.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


class _SceneError(InputError):
    """A subclass as the readers define them."""


def test_reads_path_colon_message() -> None:
    error = InputError(Path("data") / "cameras.json", "lists no frames")
    assert str(error) == f"{Path('data') / 'cameras.json'}: lists no frames"
    assert (error.path, error.message) == (str(Path("data") / "cameras.json"), "lists no frames")
    assert isinstance(error, ValueError)
    line = InputError("views=0: must be at least 1")
    assert (line.path, line.message, str(line)) == (None, str(line), "views=0: must be at least 1")


def _reraised(error: Exception) -> BaseException:
    """``error`` as PyTorch re-raises it in the main process when a data-loader worker raised it
    (its class, built from the worker's formatted traceback)."""
    try:
        try:
            raise KeyError("inner")
        except KeyError as cause:
            raise error from cause
    except Exception:
        wrapper = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(type(error)) as caught:
        wrapper.reraise()
    return caught.value


@pytest.mark.parametrize("error_type", [InputError, _SceneError])
def test_a_worker_error_keeps_its_one_line_message(error_type: type[InputError]) -> None:
    raised = _reraised(error_type("/data/train/000001.torch", "corrupt chunk file (truncated)"))
    assert type(raised) is error_type
    assert str(raised) == "/data/train/000001.torch: corrupt chunk file (truncated)"
    assert raised.path is None and raised.message == str(raised)


def test_a_message_that_only_looks_like_a_worker_traceback_is_kept() -> None:
    text = "Caught nothing: Original Traceback is a file name"
    assert str(InputError(text)) == text


def _error_classes() -> dict[str, tuple[str, list[str]]]:
    """{class name: (file, base names)} of every class named ``*Error`` in the project's code."""
    files = [*(ROOT / "models").rglob("*.py"), *(ROOT / "datamodules").rglob("*.py")]
    files += [ROOT / f"{script}.py" for script in ("train", "eval", "infer", "view")]
    classes: dict[str, tuple[str, list[str]]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                bases = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
                classes[node.name] = (str(path.relative_to(ROOT)), bases)
    return classes


def test_every_error_class_derives_from_input_error() -> None:
    classes = _error_classes()
    assert {"InputError", "PretrainedError", "OutputFolderError", "ColmapError"} <= set(classes)

    def derives(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name == "InputError":
            return True
        if name not in classes or name in seen:
            return False
        return any(derives(base, seen | {name}) for base in classes[name][1])

    stray = sorted(
        f"{file}: {name}({', '.join(bases)})"
        for name, (file, bases) in classes.items()
        if name != "InputError" and not derives(name)
    )
    assert not stray, f"error classes that do not derive from InputError: {stray}"
    assert classes["InputError"][1] == ["ValueError"]
