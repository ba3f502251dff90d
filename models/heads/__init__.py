"""Old import path of ``models.layers.heads`` (kept as an alias for one release)."""

# relayout: alias
from models._compat import alias_module

alias_module(__name__, "models.layers.heads")
