"""``python -m models.refine [GAUSSIANS.ply] PHOTOS output=DIR [key=value ...]`` (see
:mod:`models.refine.cli`)."""

from models.core.command_line import stopped_cleanly
from models.refine.cli import main

with stopped_cleanly("python -m models.refine"):  # SIGTERM stops the fit as Ctrl-C does
    status = main()  # an interrupted fit has written its output and said so: 130 / 143
raise SystemExit(status)
