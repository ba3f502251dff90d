"""Imports every family module so their ``@register_model`` entry points are registered."""

from importlib import import_module

FAMILY_MODULES = ("pixel_aligned", "zipsplat", "resplat", "splatweaver")

for _name in FAMILY_MODULES:
    try:
        import_module(f"{__package__}.{_name}")
    except ModuleNotFoundError as error:  # a family not written yet
        if error.name != f"{__package__}.{_name}":
            raise
