"""Old import path of ``models.families.pixel_aligned`` (kept as an alias for one release)."""

import sys

from models.families import pixel_aligned as _module

sys.modules[__name__] = _module
