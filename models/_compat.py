"""Old import paths, kept for one release.

``alias_module(old, new)`` makes ``import old`` return the module object of ``new`` itself (not a
copy), so private names and monkeypatching reach the real module. For a package it also aliases
every submodule: ``import old.sub`` returns ``new.sub``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__all__ = ["alias_module"]


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):  # default module, replaced in exec_module
        return None

    def exec_module(self, module) -> None:
        # The import system returns whatever sits in sys.modules under the name afterwards.
        sys.modules[module.__name__] = importlib.import_module(self.target)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.packages: dict[str, str] = {}

    def find_spec(self, fullname, path=None, target=None):
        for old, new in self.packages.items():
            if fullname.startswith(old + "."):
                new_name = new + fullname[len(old) :]
                if importlib.util.find_spec(new_name) is None:
                    return None
                return importlib.util.spec_from_loader(fullname, _AliasLoader(new_name))
        return None


_FINDER = _AliasFinder()


def alias_module(old: str, new: str) -> None:
    """Make ``old`` an alias of the module (or package) ``new``."""
    module = importlib.import_module(new)
    sys.modules[old] = module
    if hasattr(module, "__path__"):
        _FINDER.packages[old] = new
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
