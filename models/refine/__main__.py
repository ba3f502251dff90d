"""``python -m models.refine [GAUSSIANS.ply] PHOTOS output=DIR [key=value ...]`` (see
:mod:`models.refine.cli`)."""

from models.refine.cli import main

raise SystemExit(main())
