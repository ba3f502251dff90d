"""Reconstruct 3D Gaussians from your own images or video, and render them (``python infer.py
--help`` lists every setting). A thin command line over :class:`models.pipeline.run.Pipeline`
(check every setting, load the model and the inputs, reconstruct, refine, score the held-out
photos, write ``gaussians.ply``, ``cameras.json``, ``renders/``, ``path/``, ``path.mp4``,
``sparse/`` and ``summary.json`` atomically). Bad input is one line on stderr naming the path or
setting, and exit status 2.

The configuration is ``configs/infer.yaml``'s values over the typed
:class:`models.pipeline.settings.InferConfig`, registered with Hydra as a structured config (no
config folder on Hydra's search path), so ``model=NAME`` is a plain setting naming a registry
model and never clashes with the training configs' ``configs/model`` group.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

if __name__ == "__main__":  # Ctrl-C while the imports below load: one line, no traceback
    signal.signal(signal.SIGINT, lambda *_: (print("infer.py: stopped by Ctrl-C", file=sys.stderr), os._exit(130)))  # fmt: skip  # noqa: E501

REPO_ROOT = Path(__file__).resolve().parent
if str(REPO_ROOT) not in sys.path:  # `python /path/to/infer.py` from another folder
    sys.path.insert(0, str(REPO_ROOT))

import hydra  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

import view  # noqa: E402
from datamodules.errors import InputError  # noqa: E402
from models.core.command_line import (  # noqa: E402
    check_arguments,
    config_help,
    quote_lists,
    quote_path_arguments,
    stopped_cleanly,
)
from models.pipeline.run import Pipeline, RefineInterrupted  # noqa: E402
from models.pipeline.settings import InferConfig  # noqa: E402

__all__ = ["arguments", "compose", "help_text", "main", "run_cli"]

CONFIG = REPO_ROOT / "configs" / "infer.yaml"


def _config_node():
    """``configs/infer.yaml``'s values over the typed :class:`InferConfig` (Hydra's structured
    config: types come from the dataclass, defaults from the file)."""
    raw = OmegaConf.to_container(OmegaConf.load(CONFIG))
    node = OmegaConf.merge(
        OmegaConf.structured(InferConfig),
        {k: v for k, v in raw.items() if k not in ("defaults", "hydra")},
    )
    OmegaConf.set_struct(node, False)
    node.defaults, node.hydra = raw["defaults"], raw["hydra"]
    OmegaConf.set_struct(node, True)
    return node


ConfigStore.instance().store(name="infer", node=_config_node())


def image_size_arguments(argv: list[str]) -> list[str]:
    """``image_size=256,448`` (or ``256x448``) → ``image_size=[256,448]`` (Hydra reads a bare
    comma list as a sweep)."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+") == "image_size" and not value.startswith("["):
            parts = value.replace("x", ",").split(",")
            if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
                arg = f"{key}=[{parts[0].strip()},{parts[1].strip()}]"
        out.append(arg)
    return out


def arguments(argv: list[str]) -> list[str]:
    """The command line checked against :class:`InferConfig` (every declared key and its type)
    and made ready for Hydra (paths literal, ``~`` the home folder, ``a,b`` text).

    Raises:
        SettingError: one line naming the argument (an unknown key names the closest one).
    """
    argv = quote_lists(quote_path_arguments(image_size_arguments(argv)))
    check_arguments(argv, InferConfig, "infer.py")
    return argv


def run_cli(cfg: DictConfig) -> int:
    """``run`` with bad input reported as one line on stderr; returns the exit status (0 or 2)."""
    try:
        output = Pipeline(cfg).run()
    except InputError as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    except RefineInterrupted as stopped:
        print(str(stopped), file=sys.stderr)
        return stopped.status
    if cfg.get("view"):  # the viewer on the result (view.py), until Ctrl-C
        return view.serve_cli([str(output), f"device={cfg.device}"])
    return 0


def compose(overrides: list[str]) -> DictConfig:
    """The configuration for command-line ``overrides`` (Hydra's compose API), for running
    ``run_cli`` from Python."""
    from hydra import compose as hydra_compose
    from hydra import initialize

    with initialize(version_base="1.3", config_path=None, job_name="infer"):
        return hydra_compose(config_name="infer", overrides=arguments(overrides))


@hydra.main(version_base="1.3", config_path=None, config_name="infer")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: bad input → one line on stderr, exit status 2."""
    status = run_cli(cfg)
    if status:
        sys.exit(status)


def help_text() -> str:
    """``--help``: the usage and every setting of ``configs/infer.yaml`` with its explanation."""
    return config_help(
        CONFIG,
        (
            "??? marks a required setting. Paths may hold any character (quote them for your "
            "shell).",
            "Models: python -c 'import models; print(models.list_models(pretrained=True))'",
        ),
    )


if __name__ == "__main__":
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(help_text())
        sys.exit(0)
    with stopped_cleanly("infer.py"):
        try:
            sys.argv[1:] = arguments(sys.argv[1:])
        except InputError as error:
            print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
            sys.exit(2)
        main()
