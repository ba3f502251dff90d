"""Old import path of ``datamodules.readers.image_folder`` (kept as an alias for one release)."""

# relayout: alias
from models._compat import alias_module

alias_module(__name__, "datamodules.readers.image_folder")
