"""Import timm before anything else of the zoo, with wandb hidden (and torchvision checked)."""

import sys

# torch 2.N pairs with torchvision 0.(N + 15); the newest pair of pyproject.toml's ranges.
PINNED = ("2.14.1", "0.29.1")


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def mismatch_message(error: BaseException) -> str | None:
    """One line saying which torch/torchvision pair to install when ``error`` is torchvision's
    import failure for a build made for another torch, else ``None``."""
    text = str(error)
    if "torchvision::" not in text and "torchvision" not in type(error).__module__:
        return None
    torch_version = _version("torch")
    wanted = PINNED[1]
    parts = torch_version.split("+")[0].split(".")
    if len(parts) >= 2 and parts[0] == "2" and parts[1].isdigit():
        wanted = f"0.{int(parts[1]) + 15}"
    return (
        f"error: torchvision {_version('torchvision')} does not match torch {torch_version} "
        f"({' '.join(text.split())[:80]}): install a compatible pair, e.g. "
        f"pip install torch=={PINNED[0]} torchvision=={PINNED[1]} (for torch {torch_version}: "
        f"torchvision {wanted}.*), from the same index URL"
    )


def _import_timm_without_wandb() -> None:
    """Import timm with wandb hidden.

    timm imports wandb (for its training-summary logger, ``timm.utils.summary``) whenever wandb is
    installed, which would pull wandb into every ``import models``. The zoo never uses that logger;
    wandb is importable again right after (Lightning's ``WandbLogger`` imports it itself).
    """
    if "timm" in sys.modules or "wandb" in sys.modules:
        return
    sys.modules["wandb"] = None  # type: ignore[assignment]  # makes `import wandb` fail inside timm
    try:
        import timm  # noqa: F401  (imports torchvision: the first import of it)
    except RuntimeError as error:
        message = mismatch_message(error)
        if message is None:
            raise
        print(message, file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        del sys.modules["wandb"]


_import_timm_without_wandb()
