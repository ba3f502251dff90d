"""Old import path of ``models.families.zipsplat`` (kept as an alias for one release)."""

import sys

from models.families import zipsplat as _module

sys.modules[__name__] = _module
