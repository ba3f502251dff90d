"""The families: one module per family or released architecture.

Every module in this package is imported on first use of the registry, which runs its
``@register_model`` entry points: adding a family is adding a file here (no list to edit).
"""

from __future__ import annotations

import pkgutil
from importlib import import_module


def family_module_names() -> list[str]:
    """Names of the family modules in this package (sorted, private ``_*`` modules excluded)."""
    return sorted(
        info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")
    )


for _name in family_module_names():
    import_module(f"{__name__}.{_name}")
