"""Old import path of ``models.families.resplat`` (kept as an alias for one release)."""

import sys

from models.families import resplat as _module

sys.modules[__name__] = _module
