"""Import timm before anything else of the zoo, with wandb hidden."""

import sys


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
        import timm  # noqa: F401
    finally:
        del sys.modules["wandb"]


_import_timm_without_wandb()
