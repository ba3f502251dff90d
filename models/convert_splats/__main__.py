"""``python -m models.convert_splats``: runs :mod:`models.convert_splats`."""

import sys

from models.convert_splats import PROGRAM, main
from models.core.command_line import stopped_cleanly

with stopped_cleanly(PROGRAM):
    sys.exit(main())
