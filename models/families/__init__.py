"""The families: one module per family or released architecture.

``import models`` imports this package last (after the registry and everything a family builds
on), which imports every module in it and so runs their ``@register_model`` entry points: adding
a family is adding a file here (no list to edit).
"""

from __future__ import annotations

import pkgutil
import sys
from importlib import import_module


def family_module_names() -> list[str]:
    """Names of the family modules in this package (sorted, private ``_*`` modules excluded)."""
    return sorted(
        info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")
    )


def import_families() -> list[str]:
    """Import every family module not imported yet (e.g. after a folder was added to this
    package's ``__path__``); returns the names imported now."""
    imported = []
    for name in family_module_names():
        if f"{__name__}.{name}" not in sys.modules:
            import_module(f"{__name__}.{name}")
            imported.append(name)
    return imported


import_families()
