"""Old import path of ``models.families.splatweaver`` (kept as an alias for one release)."""

import sys

from models.families import splatweaver as _module

sys.modules[__name__] = _module
